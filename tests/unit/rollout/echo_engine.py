"""A test-only rollout engine, registered from this one file and nowhere else: every completion
is its settings' token `length` times, then the end token. Its `label` changes nothing it
samples, so the resume fingerprint leaves it out; `refuse` makes its preflight say no."""
from __future__ import annotations

from pydantic import Field

from hindsight.data.chat import prompt_text
from hindsight.maths.experience import Experience, pad_left, pad_right
from hindsight.rollout.engines import Engine, EngineSettings, register


class EchoSettings(EngineSettings):
    token: int = Field(5, ge=0)
    length: int = Field(3, ge=1)
    label: str = "x"


@register
class Echo(Engine):
    name = "echo"
    Settings = EchoSettings
    not_sampling = ("label",)
    refuse: str | None = None
    loads = 0

    @classmethod
    def problem(cls) -> str | None:
        return cls.refuse

    def load_weights(self, policy) -> None:
        type(self).loads += 1

    def sample(self, prompts: list, seeds: list[int], group_size: int) -> Experience:
        tok, s = self.ctx.tok, self.ctx.settings
        prompt_ids = [tok(prompt_text(tok, p), add_special_tokens=False)["input_ids"] for p in prompts
                      for _ in range(group_size)]
        completions = [[s.token] * s.length + [self.ctx.stop_ids[0]] for _ in prompt_ids]
        p_ids, p_mask = pad_left(prompt_ids, tok.pad_token_id)
        c_ids, c_mask = pad_right(completions, tok.pad_token_id)
        return Experience(p_ids, p_mask, c_ids, c_mask, c_mask * 0.0, group_size)
