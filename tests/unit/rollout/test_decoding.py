"""One decoding contract: the RL sampler and evaluation stop at the same end tokens (every eos of
the model's generation config plus the tokenizer's), and neither takes a setting from the
checkpoint's generation config (Qwen2.5's: two eos ids, repetition_penalty 1.05)."""
import pytest
import torch

from hindsight.config import EvalConfig, RolloutConfig
from hindsight.models.load import load_causal_lm, load_tokenizer
from hindsight.models.tiny import build_tiny_qwen2
from hindsight.rollout.decoding import completion_mask, decoding_record, describe, end_token_ids, ignored_settings
from hindsight.rollout.hf import sample_groups
from hindsight.scoring.evaluate import greedy_answers

PROMPTS = [[{"role": "user", "content": "Ann has 40 pens and gets 13 more. How many pens now?"}],
           [{"role": "user", "content": "Bob has 10 cats and finds 2 more. How many cats now?"}]]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    path = str(build_tiny_qwen2(tmp_path_factory.mktemp("q") / "m"))
    return load_causal_lm(path), load_tokenizer(path)


def _ends_at(model, token_id: int, after: int):
    """Make `token_id` the certain next token once `after` tokens are decoded: the model's own
    logits plus a large bias from that point on (a forward hook on the head)."""
    seen = {"n": 0}

    def hook(module, args, out):
        if out.size(1) == 1:  # a decoding step (the prefill scores the whole prompt)
            seen["n"] += 1
            if seen["n"] > after:
                out = out.clone()
                out[..., token_id] += 1e4
        return out

    return model.lm_head.register_forward_hook(hook), seen


def test_the_stop_set_is_the_tokenizer_eos_plus_every_generation_config_eos(qwen):
    model, tok = qwen
    end, im_end = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    assert tok.eos_token_id == end                      # the tokenizer alone knows one of the two
    assert end_token_ids(tok, model) == tuple(sorted({end, im_end}))
    assert end_token_ids(tok) == (end,)
    assert completion_mask(torch.tensor([[5, im_end, 7, end], [5, 6, end, 8]]), (end, im_end)).tolist() == \
        [[1, 1, 0, 0], [1, 1, 1, 0]]


@pytest.mark.parametrize("stop", ["<|im_end|>", "<|endoftext|>"])
def test_rl_sampling_and_evaluation_stop_at_the_same_end_token(qwen, stop):
    model, tok = qwen
    stop_id = tok.convert_tokens_to_ids(stop)
    handle, seen = _ends_at(model, stop_id, after=2)
    try:
        exp = sample_groups(model, tok, PROMPTS, [1, 2], 3, 8, temperature=1.0)
        seen["n"] = 0
        _, ids = greedy_answers(model, tok, PROMPTS, 8)
    finally:
        handle.remove()
    lengths = exp.completion_mask.sum(-1)                                   # (B,)
    assert lengths.tolist() == [4] * 6                     # the prefill's token, two decoded, then the end token
    assert (exp.completion_ids.gather(1, (lengths - 1)[:, None]).squeeze(1) == stop_id).all()
    assert [row[-1] for row in ids] == [stop_id, stop_id] and [len(r) for r in ids] == [4, 4]


def test_evaluation_ignores_the_checkpoints_repetition_penalty(qwen):
    model, tok = qwen
    assert model.generation_config.repetition_penalty == 1.05
    saved = model.generation_config.repetition_penalty
    answers = {}
    try:
        for penalty in (1.0, 1.05, 10.0):  # 10: a setting that certainly changes transformers' generate
            model.generation_config.repetition_penalty = penalty
            answers[penalty] = greedy_answers(model, tok, PROMPTS, 8)[0]
            ids = torch.tensor([tok.apply_chat_template(PROMPTS[0], add_generation_prompt=True, return_dict=False)])
            answers[f"generate {penalty}"] = model.generate(input_ids=ids, max_new_tokens=8, do_sample=False)[0].tolist()
    finally:
        model.generation_config.repetition_penalty = saved
    assert answers[1.0] == answers[1.05] == answers[10.0]
    assert answers["generate 10.0"] != answers["generate 1.0"]  # the control: generate does take it
    # and what the checkpoint asks for is stated, not silently applied
    ignored = ignored_settings(model)
    assert ignored["repetition_penalty"] == 1.05 and ignored["top_p"] == 0.8 and ignored["temperature"] == 0.7


def test_the_logged_record_names_the_stop_tokens_and_the_settings_used(qwen):
    model, tok = qwen
    record = decoding_record(tok, model, EvalConfig(max_new_tokens=12),
                             RolloutConfig(temperature=0.9, top_p=0.95, max_new_tokens=64))
    assert record["stop_tokens"] == sorted(["<|im_end|>", "<|endoftext|>"], key=tok.convert_tokens_to_ids)
    assert record["rl"] == {"temperature": 0.9, "top_p": 0.95, "max_new_tokens": 64}
    assert record["eval"] == {"temperature": 0.0, "max_new_tokens": 12}
    line = describe(record)
    assert "<|im_end|>" in line and "repetition_penalty=1.05" in line and "not applied" in line
