"""A scorer: the reward functions (in their guarded worker process), the reference model and
the reward model. It scores the groups it is given and writes one part shard per group.

The reward functions see the whole lease in one call (a batched reward stays batched); the
reference log-probs and reward-model scores are computed on batches of groups fixed by group
index (`rollout.groups_per_batch`, as sampling is), so a group's score does not depend on
which groups it was scored with, or on how many scorers there are.
"""
from __future__ import annotations

import json
import time


from hindsight.maths.experience import experience_from_rows
from hindsight.maths.logprobs import budgeted_logprobs
from hindsight.rollout.worker import write_groups
from hindsight.maths.scores import budgeted_scores
from hindsight.scoring.rewards import score_completions
from hindsight.state.rundir import RLDir
from hindsight.state.store import RolloutStore


def score_batch(group: int, groups_per_batch: int) -> int:
    """The model batch a group is scored in (within a round): scorers are dealt whole batches."""
    return group // groups_per_batch


class Scorer:
    @classmethod
    def from_paths(cls, scorer_id: str, rl, init_path: str, rm_path: str | None, dtype: str,
                   store_root: str) -> "Scorer":
        """A scorer with its own models and reward worker, as a Ray actor builds it."""
        from hindsight.models.load import load_causal_lm, load_reward_model, load_tokenizer
        from hindsight.scoring.guarded import RewardWorker

        ref = load_causal_lm(init_path, dtype).eval() if rl.kl.coef > 0 else None
        rm = load_reward_model(rm_path).eval() if rm_path and rl.scoring.reward_model_weight > 0 else None
        worker = RewardWorker.for_run(rl)
        return cls(scorer_id, rl, load_tokenizer(init_path).pad_token_id, ref, rm, worker, RolloutStore(store_root))


    def __init__(self, scorer_id: str, rl, pad_id: int, ref, rm, reward_worker, store: RolloutStore):
        self.id, self.rl, self.pad_id, self.ref, self.rm = scorer_id, rl, pad_id, ref, rm
        self.reward_worker, self.store = reward_worker, store
        self.compute_s = 0.0  # seconds in the rewards and models (the rest is I/O): the bench's split

    def score(self, step: int, groups: list[int]) -> dict[str, list]:
        """Score and store each group; returns {reward: [failed calls, first failure]}."""
        by_group = self.store.groups_rows("rollouts", step, groups)
        rows = [r for g in groups for r in by_group[g]]
        t0 = time.perf_counter()
        result = self._rewards(rows)
        self.compute_s += time.perf_counter() - t0
        at, n = {}, 0  # where each group's rows start in `rows`
        for g in groups:
            at[g], n = n, n + len(by_group[g])
        for batch in self._batches(groups, by_group):
            t0 = time.perf_counter()
            models = self._models([r for g in batch for r in by_group[g]])
            self.compute_s += time.perf_counter() - t0
            write_groups(self.store, "scores", step,
                         {g: self._score_rows(step, by_group[g], at[g], result, models, i) for i, g in enumerate(batch)})
        return result.failure_counts()

    def _batches(self, groups: list[int], by_group: dict[int, list[dict]]) -> list[list[int]]:
        """The reference and reward model run on a batch of groups fixed by group index
        (`rollout.groups_per_batch`), so a group's scores never depend on who scored it."""
        k, out = self.rl.rollout.groups_per_batch, {}
        for g in groups:
            out.setdefault((by_group[g][0]["round"], score_batch(g, k)), []).append(g)
        return list(out.values())

    def _score_rows(self, step: int, part: list[dict], at: int, result, models, i: int) -> list[dict]:
        """The score rows of one group: the i-th of its model batch, at `at` in the reward results."""
        ref, rm = models
        size, out = len(part), []
        for j, r in enumerate(part):
            k, b = at + j, i * size + j
            total = result.total[k] + (self.rl.scoring.reward_model_weight * rm[b] if rm else 0.0)
            out.append({"step": step, "index": r["index"], "group": r["group"], "reward": total,
                        "rm_score": rm[b] if rm else None, **{f"reward_{name}": v[k] for name, v in result.per_fn.items()},
                        "ref_logprobs": ref[b, :len(r["completion_ids"])].tolist() if ref is not None else None})
        return out

    def _rewards(self, rows: list[dict]):
        columns = [json.loads(r["columns"]) for r in rows]
        keys = sorted({k for c in columns for k in c})
        # a conversation's completion goes to the rewards as the assistant's message, as TRL passes it
        completions = [[{"role": "assistant", "content": r["completion"]}] if r.get("conversational") else r["completion"]
                       for r in rows]
        return score_completions(self.rl.scoring.rewards, completions,
                                 {k: [c.get(k) for c in columns] for k in keys}, self.rl.scoring.fallback,
                                 self.reward_worker, self.rl.scoring.timeout_s, prompts=[r["prompt"] for r in rows],
                                 completion_ids=[list(r["completion_ids"]) for r in rows],
                                 context=RLDir(self.store.root).context())

    def _models(self, rows: list[dict]):
        """(reference log-probs (B, T) or None, reward-model scores or None) for a batch of groups."""
        if self.ref is None and self.rm is None:
            return None, None
        exp = experience_from_rows(rows, self.pad_id, self.rl.samples_per_prompt)
        budget, packing = self.rl.forward_budget()  # rl.forward: the worker's and the scorer's own
        ref = budgeted_logprobs(self.ref, exp, self.rl.rollout.temperature, budget, packing) \
            if self.ref is not None else None
        rm = budgeted_scores(self.rm, exp, budget, packing).tolist() if self.rm is not None else None
        return ref, rm

    def close(self) -> None:
        if self.reward_worker is not None:
            self.reward_worker.close()
