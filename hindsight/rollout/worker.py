"""A rollout worker: a policy copy and an engine; it generates the groups it is given.

Each group draws its randomness from its own generator, seeded by (run seed, step, group), and
an engine that batches groups (hf) samples a fixed batch of them at once
(`rollout.groups_per_batch`, set by group index), so what a group holds does not depend on which
worker generated it, on how many workers there are, or on whether it was generated again after
a worker died. The engine is the registered one the config names (`rollout.engines`). Each finished group is written at once as a
part shard, so a worker that dies mid-lease loses only the groups it had not finished.
"""
from __future__ import annotations

import json
import time


from hindsight.data.chat import is_conversation, prompt_text
from hindsight.maths.experience import Experience
from hindsight.faults import crash_point
from hindsight.maths.logprobs import budgeted_logprobs
from hindsight.rollout.seeds import group_seed
from hindsight.rollout.tasks import GroupTask, batch_of
from hindsight.rollout.decoding import end_token_ids
from hindsight.rollout.engines import EngineContext, get_engine
from hindsight.state.store import RolloutStore
from hindsight.transport.base import Ack, receive_into
from hindsight.transport.payload import WeightVersion


_POINT = {"rollouts": "rollout", "scores": "score"}  # the fault hook's names


def write_groups(store: RolloutStore, component: str, step: int, rows: dict[int, list[dict]]) -> None:
    """Store the groups of one batch: one file when they are whole and consecutive, else a part
    per group. Either way a part is whole or absent, and the fault hook sees each group land."""
    groups = list(rows)
    if len(groups) > 1 and groups == list(range(groups[0], groups[-1] + 1)):
        store.write_batch_part(component, step, groups, [r for g in groups for r in rows[g]])
    else:
        for g in groups:
            store.write_part(component, step, g, rows[g])
    for g in groups:
        crash_point(f"{_POINT[component]}-group{g}", step)


def _group_of(exp: Experience, i: int, size: int) -> Experience:
    """Group i of a sampled batch, with its own trajectories (multi-turn) in its meta."""
    part = exp.rows(list(range(i * size, (i + 1) * size)))
    if "trajectories" in exp.meta:
        part.meta = {**exp.meta, "trajectories": exp.meta["trajectories"][i * size:(i + 1) * size]}
    return part


class StaleWeights(RuntimeError):
    """A worker serves nothing until it holds the weights version it is asked to sample with."""


class RolloutWorker:
    @classmethod
    def from_paths(cls, worker_id: str, policy_path: str, dtype: str, rl, seed: int, store_root: str,
                   init_path: str) -> "RolloutWorker":
        """A worker with its own policy copy, as a Ray actor builds it in its own process."""
        from hindsight.models.load import disable_dropout, load_causal_lm, load_tokenizer

        policy = load_causal_lm(policy_path, dtype)
        if rl.learner.disable_dropout:
            disable_dropout(policy)
        return cls(worker_id, policy, load_tokenizer(policy_path), rl, seed, RolloutStore(store_root), init_path)

    def __init__(self, worker_id: str, policy, tok, rl, seed: int, store: RolloutStore, init_path: str):
        self.id, self.policy, self.tok, self.rl, self.seed, self.store = worker_id, policy, tok, rl, seed, store
        self.init_path = init_path
        self.version = 0
        self.engine_cls = get_engine(rl.rollout.backend)
        self.engine, self.engine_stale = None, True  # created at the first rollout
        self.episodes = None  # multi-turn: what makes each trajectory's episode, built at the first rollout
        self.compute_s = 0.0  # seconds in the engine (the rest is I/O): the bench's split
        self.groups_written = 0  # progress, as a heartbeat reports it (`coordination.liveness`)
        self.engine_published: dict[str, float] = {}  # what the engine's last weights push measured and checked

    def start_at(self, version: int) -> None:
        """The weights the worker was built with are version `version`."""
        self.version, self.engine_stale = version, True

    def receive(self, payload: WeightVersion) -> Ack:
        """A new weights version from the transport (`hindsight.transport`): shared with the
        learner in process, or tensors checked against their checksum. A refused one leaves the
        worker serving nothing until a good version arrives (`StaleWeights`)."""
        self.policy, ack = receive_into(self.policy, payload, self.version)
        self.version = payload.version if ack.ok else None
        self.engine_stale = True
        return ack

    def generate(self, tasks: list[GroupTask], version: int) -> list[int]:
        """Sample and store each task's group; returns the groups written, in order."""
        if version != self.version:
            raise StaleWeights(f"worker {self.id} holds weights v{self.version}, asked for v{version}")
        done = []
        size = self.rl.samples_per_prompt
        for batch in self._batches(tasks):
            t0 = time.perf_counter()
            exp = self._generate_batch(batch)
            self.compute_s += time.perf_counter() - t0
            rows = {t.group: self._group_rows(t, _group_of(exp, i, size)) for i, t in enumerate(batch) if t.write}
            write_groups(self.store, "rollouts", batch[0].step, rows)
            done += list(rows)
            self.groups_written += len(rows)
        return done

    def _batches(self, tasks: list[GroupTask]) -> list[list[GroupTask]]:
        """An engine that batches groups samples `rollout.groups_per_batch` of them at once; others one."""
        k = self.rl.rollout.groups_per_batch if self.engine_cls.batches_groups else 1
        out: dict = {}
        for task in tasks:
            out.setdefault(batch_of(task, k), []).append(task)
        return list(out.values())

    def _generate_batch(self, batch: list[GroupTask]) -> Experience:
        seeds = [group_seed(self.seed, t.step, t.group) for t in batch]
        if self.rl.rollout.multi_turn is not None:
            return self._trajectories(batch, seeds)
        exp = self._engine().sample([t.prompt["prompt"] for t in batch], seeds, self.rl.samples_per_prompt)
        if self.rl.rollout.logprobs == "learner":  # the update's own forward is the anchor: none here
            exp.engine_logprobs = exp.logprobs
            return exp
        return self._learner_logprobs(exp) if self.engine_cls.recomputes(self.rl.rollout) else exp

    def _engine(self):
        """The engine, built at the first rollout, and told of every new weights version."""
        if self.engine is None:
            r = self.rl.rollout
            self.engine = self.engine_cls(EngineContext(
                policy=self.policy, tok=self.tok, rollout=r, settings=r.engine_settings(), seed=self.seed,
                init_path=self.init_path, bucket_mb=self.rl.learner.publish_bucket_mb,
                budget=self.rl.forward_budget()[0], stop_ids=end_token_ids(self.tok, self.policy)))
            self.engine_stale = True
        if self.engine_stale:  # the policy moved since the engine last saw it
            self.engine_published = self.engine.load_weights(self.policy) or {}
            self.engine_stale = False
        return self.engine

    def close(self) -> None:
        """Free what the engine holds (a vLLM engine's process)."""
        if self.engine is not None:
            self.engine.close()
            self.engine, self.engine_stale = None, True

    def _trajectories(self, batch: list[GroupTask], seeds: list[int]) -> Experience:
        """Multi-turn: each group's trajectories with their tools or environment
        (`rollout.multiturn`); the batch carries them in `meta` for the stored rows."""
        from hindsight.rollout.multiturn.loop import run_trajectories, to_experience
        from hindsight.rollout.multiturn.setup import episode_factory, turn_settings

        engine = self._engine()  # the policy's current weights, as for single turns
        if self.episodes is None:
            self.episodes = episode_factory(self.rl.rollout.multi_turn)
        rows, size = [t.prompt for t in batch], self.rl.samples_per_prompt
        trajs, _ = run_trajectories(self.policy, self.tok, rows, seeds, size, turn_settings(self.rl.rollout),
                                    self.episodes, engine.continue_turns)
        exp = to_experience(self.policy, trajs, size, self.tok.pad_token_id, self.rl.rollout.temperature,
                            self.rl.forward_budget()[0])
        exp.meta["trajectories"] = trajs
        return exp

    def _group_rows(self, task: GroupTask, exp: Experience) -> list[dict]:
        src, size = task.prompt, self.rl.samples_per_prompt
        texts = self.tok.batch_decode(exp.completion_ids, skip_special_tokens=True)
        columns = json.dumps({k: v for k, v in src.items() if k not in ("prompt", "id", "_replayed")})
        # whole tensors to lists once, then sliced per row: a tensor op per row and field was
        # most of this function's cost
        lengths = exp.completion_mask.sum(-1).tolist()
        completions, logprobs = exp.completion_ids.tolist(), exp.logprobs.tolist()
        engine = exp.engine_logprobs.tolist() if exp.engine_logprobs is not None else None
        prompt_ids = [[t for t, keep in zip(ids, mask) if keep]
                      for ids, mask in zip(exp.prompt_ids.tolist(), exp.prompt_mask.tolist())]
        prompt, conversational = prompt_text(self.tok, src["prompt"]), is_conversation(src["prompt"])
        stops = set(end_token_ids(self.tok, self.policy))
        rows = []
        for j in range(len(exp)):
            n = lengths[j]
            rows.append({
                "step": task.step, "index": task.group * size + j, "group": task.group, "round": task.round,
                "prompt_id": str(src["id"]), "replayed": bool(src.get("_replayed")),
                "prompt": prompt, "conversational": conversational,
                "completion": texts[j], "weights_version": self.version,
                "prompt_ids": prompt_ids[j], "completion_ids": completions[j][:n], "logprobs": logprobs[j][:n],
                "engine_logprobs": engine[j][:n] if engine is not None else None,
                "ended_with_eos": bool(n and completions[j][n - 1] in stops),
                "columns": columns,
            })
        for row, t in zip(rows, exp.meta.get("trajectories", [])):  # multi-turn: each turn, and what trains
            row.update({"completion": t.final_text, "ended_with_eos": t.ended_with_eos, "action_mask": t.action,
                        "turns": json.dumps(t.turns), "cut": t.cut, "retokenize_mismatch": t.retemplate_differs,
                        "columns": json.dumps({**json.loads(columns), "env_reward": t.env_reward})})
        return rows

    def _learner_logprobs(self, exp: Experience) -> Experience:
        """The behaviour log-probs the ratio is anchored on, recomputed by the training model (as
        TRL does): an engine's own differ by dtype and kernels, and with top_p < 1 vLLM's are
        renormalised over the nucleus. The engine's are kept for the optional IS weight."""
        self.policy.eval()
        logp = budgeted_logprobs(self.policy, exp, self.rl.rollout.temperature, *self.rl.forward_budget())  # (B, T)
        exp.engine_logprobs, exp.logprobs = exp.logprobs, logp * exp.completion_mask
        return exp
