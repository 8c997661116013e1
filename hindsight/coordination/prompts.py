"""Which prompts an RL step samples: the data cursor (a fresh permutation per epoch, so a
resume needs no state), dynamic sampling's further rounds, and replayed hard examples."""
from __future__ import annotations

import math
import random
from functools import lru_cache

from hindsight.coordination.replay import pick_hard_examples


def prompt_indices(n_rows: int, per_step: int, step: int, seed: int) -> list[int]:
    """The data cursor is the step: a fresh permutation per epoch, so resume needs no state."""
    out = []
    for k in range(step * per_step, (step + 1) * per_step):
        epoch, pos = divmod(k, n_rows)
        out.append(_epoch_order(n_rows, str(seed), epoch)[pos])
    return out


@lru_cache(maxsize=8)
def _epoch_order(n_rows: int, seed: str, epoch: int) -> tuple[int, ...]:
    order = list(range(n_rows))
    random.Random(f"{seed}-{epoch}").shuffle(order)
    return tuple(order)


class PromptSource:
    """The prompt rows of the RL stage and the rule that picks each step's; reads earlier
    stored shards for replay and nothing else, so a resume picks the same prompts."""

    def __init__(self, rl, seed: int, rows: list[dict], store):
        self.rl, self.seed, self.rows, self.store = rl, seed, rows, store

    def for_round(self, step: int, round_: int) -> list[dict]:
        """Fresh prompts for a further dynamic-sampling round: a cursor of its own per round."""
        n = math.ceil(self.rl.prompts_per_step * self.rl.dynamic_sampling.oversample)
        idx = prompt_indices(len(self.rows), n, step, f"{self.seed}-round{round_}")
        return [{**self.rows[i], "id": str(self.rows[i].get("id", i))} for i in idx]

    def for_step(self, step: int) -> tuple[list[dict], dict]:
        """The step's prompts: the data cursor (oversampled for dynamic sampling), with a
        `replay.ratio` share swapped for hard examples picked from earlier stored shards."""
        n = self.rl.prompts_per_step
        if self.rl.dynamic_sampling.enabled:
            n = math.ceil(n * self.rl.dynamic_sampling.oversample)
        idx = prompt_indices(len(self.rows), n, step, self.seed)
        batch = [{**self.rows[i], "id": str(self.rows[i].get("id", i))} for i in idx]
        n_replay = round(self.rl.replay.ratio * self.rl.prompts_per_step)
        if not n_replay:
            return batch, {}
        # steps whose scores exist by the time this one is sampled, whatever the timing: with
        # staleness k, step s is sampled once step s - k - 1 is trained
        last = step - self.rl.async_.max_staleness
        past = [s for s in self.store.steps("scores") if last - self.rl.replay.window <= s < last]
        shards = [(self.store.read("rollouts", s), self.store.read("scores", s)) for s in past
                  if self.store.check("rollouts", s) and self.store.check("scores", s)]  # a corrupt one is skipped
        keep = batch[: len(batch) - n_replay]
        hard = pick_hard_examples(shards, n_replay, self.rl.replay.priority, {b["id"] for b in keep})
        # replayed groups first: dynamic sampling trains the first groups with a signal, and a
        # replayed prompt at the tail of an oversampled batch would never be trained
        batch = [{**h, "_replayed": True} for h in hard] + keep + batch[len(keep) + len(hard):]
        return batch, {"replay/count": float(len(hard)), "replay/ratio": len(hard) / len(batch),
                       "replay/ids": [h["id"] for h in hard]}
