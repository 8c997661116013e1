"""The RL stage's state and its three steps: rollout -> score -> update.

An `RLRun` holds the models resident for the life of the process; the Prefect tasks only
pass step numbers and shard paths between these methods. Every step reads its input from
the rollout store, so any step can be rerun, and a resumed run trains on shards that were
generated before the crash instead of sampling them again.
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch

from hindsight.lookback.alerts import Alert, AlertMonitor
from hindsight.coordination.rollouts import AsyncRollouts
from hindsight.state.checkpoint import CheckpointManager, checkpoint_due
from hindsight.config import PipelineConfig
from hindsight.data.rows import load_rows
from hindsight.errors import CheckpointError
from hindsight.faults import crash_point
from hindsight.experience import Experience, advantage_rows, experience_from_rows
from hindsight.state.fsutil import append_line, atomic_write_json
from hindsight.lookback.history import MetricsLog, truncate_rows_after
from hindsight.state.fingerprint import run_fingerprint
from hindsight.coordination.resume import lr_multiplier, prepare_resume
from hindsight.learning.update import learner_settings, update
from hindsight.models.lora import AdapterDisabled, load_adapter, with_adapter
from hindsight.lookback.metrics import peak_memory, rollout_metrics
from hindsight.models.load import disable_dropout, load_causal_lm, load_reward_model, load_tokenizer
from hindsight.scoring.guarded import RewardWorker
from hindsight.state.ledger import Ledger
from hindsight.coordination.roles import deal
from hindsight.rollout.worker import GroupTask, batch_of, with_batch_mates
from hindsight.scoring.scorer import score_batch
from hindsight.coordination.roles import RoleStarts
from hindsight.scoring.rewards import check_reward
from hindsight.stage import reward_source_hash
from hindsight.coordination.prompts import PromptSelection, prompt_indices  # noqa: F401  (prompt_indices: the public name)
from hindsight.coordination.replay import signal_groups
from hindsight.state.store import RolloutStore


class RLRun(AsyncRollouts, RoleStarts, PromptSelection):
    def __init__(self, cfg: PipelineConfig, init_path: str, rm_path: str | None):
        self.cfg, self.rl = cfg, cfg.rl
        self.dir = cfg.root / "rl"
        self.init_path = init_path
        self.store = RolloutStore(self.dir)
        self.ckpt = CheckpointManager(self.dir / "checkpoints", keep_last=self.rl.keep_checkpoints)
        self.rows = load_rows(cfg.data.prompts, required=("prompt",), split=cfg.data.split,
                              columns=cfg.data.columns or None)
        self.tok = load_tokenizer(init_path)
        for call in self.rl.rewards:
            check_reward(call.fn, call.args)  # an unimportable reward, or one that cannot run here, fails now
        start = self.ckpt.intact_step()  # a corrupt newest version falls back to the newest intact one
        self.fingerprint = run_fingerprint(cfg, init_path, rm_path, reward_source_hash)
        self.resume_changes = prepare_resume(self.dir, self.fingerprint, start or 0, self.rl.steps)
        policy_path = str(self.ckpt.policy_dir(start)) if start else init_path
        self.policy = self._load_policy(policy_path, start)
        if self.rl.disable_dropout:
            disable_dropout(self.policy)
        local = self.rl.workers.placement == "local"  # else the scorer actors hold the reference and reward model
        self.ref = None
        if local and self.rl.kl.coef > 0:  # with LoRA, the base under the policy's adapter: no second copy
            self.ref = AdapterDisabled(self.policy) if self.rl.lora.enabled else load_causal_lm(init_path, cfg.model.dtype).eval()
        self.rm = load_reward_model(rm_path).eval() if local and rm_path and self.rl.reward_model_weight > 0 else None
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=self.rl.lr, weight_decay=0.0)
        self.lr_multiplier = 1.0  # the product of every `lower_lr` alert's factor so far
        if start:
            self.ckpt.load_optimizer(start, self.optimizer)
            self.ckpt.restore_rng(start)
            self.lr_multiplier = lr_multiplier(self.dir / "alerts.jsonl", start)
            self._set_lr()  # the configured rl.lr applies on resume, not the rate stored in the optimizer
        self.start_step = start or 0
        atomic_write_json(self.dir / "config.json", self.rl.model_dump(mode="json", by_alias=True))
        self.settings = learner_settings(self.rl)
        self.critic, self.critic_optimizer = self._load_critic(start, init_path, rm_path)
        self.reward_worker = RewardWorker() if self.rl.reward_isolation == "process" else None
        self.version = self.start_step  # the weights version: how many updates the policy has had
        self.updating = False
        self.next_step = self.start_step  # the first step not yet trained and recorded: a retry continues there
        self.ledger = Ledger(self.dir)
        self.ledger.roll_back_after(self.start_step)  # groups trained into weights that were not kept
        self.learners = self._start_learners(start, policy_path)
        self.rollout_workers, self.pool = self._start_workers(policy_path)

        self.worker_metrics: dict[str, float] = {}  # the Ray pool's deaths and reassignments, logged per step
        self._failures: dict[int, dict[str, int]] = {}  # reward failures per step, until `score` logs them
        self._regenerated: dict[int, int] = {}  # corrupt shards generated again, per step
        self.scorers, self.scorer_pool = self._start_scorers(rm_path)
        self._start_sampler(policy_path, rm_path)  # rl.async.max_staleness >= 1: sampling overlaps learning
        self.history = MetricsLog(self.dir / "metrics.jsonl")
        self.history.truncate_after(self.start_step)  # steps after the checkpoint are redone
        truncate_rows_after(self.dir / "alerts.jsonl", self.start_step)  # and their alerts fire again
        self.monitor = AlertMonitor(self.rl.alerts, self.history.read())

    def _load_policy(self, policy_path: str, start: int | None):
        """The full model, or with `rl.lora` the init model plus an adapter (the checkpoint's on resume)."""
        if not self.rl.lora.enabled:
            return load_causal_lm(policy_path, self.cfg.model.dtype)
        base = load_causal_lm(self.init_path, self.cfg.model.dtype)
        torch.manual_seed(self.cfg.seed)  # a fresh adapter starts the same way every run
        return load_adapter(base, policy_path) if start else with_adapter(base, self.rl.lora)

    def _load_critic(self, start: int | None, init_path: str, rm_path: str | None):
        """The value model of an algorithm with a critic (PPO): from the checkpoint on resume,
        else the reward model or the policy."""
        self.critic_source = None
        if not self.settings.estimator.needs_critic:
            return None, None
        p = self.settings.algorithm_settings
        source = str(self.ckpt.critic_dir(start)) if start else (rm_path if p.critic_init == "reward_model" else init_path)
        self.critic_source = source
        torch.manual_seed(self.cfg.seed)  # a fresh value head starts the same way every run
        critic = load_reward_model(source, self.cfg.model.dtype)
        critic.config.pad_token_id = self.tok.pad_token_id
        if self.rl.disable_dropout:
            disable_dropout(critic)
        optimizer = torch.optim.AdamW(critic.parameters(), lr=p.critic_lr, weight_decay=0.0)
        if start:
            self.ckpt.load_optimizer(start, optimizer, "critic_optimizer")
        return critic, optimizer

    # --- rollout ------------------------------------------------------------------------
    def rollout(self, step: int) -> tuple[Path, dict]:
        """Sample the step's groups. With dynamic sampling, sample further rounds of fresh
        prompts (DAPO) until `prompts_per_step` groups carry a signal or `max_rounds` is reached."""
        if step in self._ahead:  # waited for before a checkpoint
            return self._ahead.pop(step)
        if self._stored("rollouts", step):
            return self.store.path("rollouts", step), {"rollout/reused": 1.0}
        if self.sampler is not None:
            return self._async_rollout(step)
        batch, metrics = self.select_prompts(step)
        t0 = time.perf_counter()
        rows = self._sample(step, 0, batch, first_group=0)
        rounds, ds = 1, self.rl.dynamic_sampling
        while ds.enabled and rounds < ds.max_rounds and self._signal_groups(step, rows) < self.rl.prompts_per_step:
            rows += self._sample(step, rounds, self.round_prompts(step, rounds), first_group=rows[-1]["group"] + 1)
            rounds += 1
        seconds = time.perf_counter() - t0
        if ds.enabled:
            metrics["dynamic_sampling/rounds"] = float(rounds)
        crash_point("rollout", step)
        n_tokens = sum(len(r["completion_ids"]) for r in rows)
        metrics.update(self.worker_metrics)
        metrics.update({"time/rollout_s": seconds, "rollout/tokens_per_s": n_tokens / max(seconds, 1e-9)})
        if self.rollout_workers:  # in this process: how much of it was the engine itself
            metrics["time/compute/generate_s"] = sum(w.compute_s for w in self.rollout_workers)
            for w in self.rollout_workers:
                w.compute_s = 0.0
        return self.store.merge_parts("rollouts", step, sorted({r["group"] for r in rows})), metrics

    def _sample(self, step: int, round_: int, prompts: list[dict], first_group: int) -> list[dict]:
        """One round's groups, leased to the rollout workers through the ledger. A group whose part
        an earlier attempt wrote is sealed by it (a part is written whole or not at all) and kept,
        not sampled again: a worker that died mid-lease loses only the groups it had not finished."""
        tasks = [GroupTask(step=step, group=first_group + i, round=round_, prompt=p) for i, p in enumerate(prompts)]
        todo = self._open_groups(step, tasks)
        if self.pool is not None:
            self.pool.resize(step)
            self.worker_metrics = {**self.pool.dispatch(step, todo, self.store), "workers/rollout": float(len(self.pool.actors))}
        todo = with_batch_mates(todo, tasks, self.rl.rollout.groups_per_batch)
        unit = partial(batch_of, groups_per_batch=self.rl.rollout.groups_per_batch)
        for worker, share in zip(self.rollout_workers, deal(todo, len(self.rollout_workers), unit)):
            mine = [t.group for t in share if t.write]
            if mine:
                self.ledger.move(step, mine, "leased", worker=worker.id, ttl_s=self.rl.workers.lease_ttl_s)
                self.ledger.move(step, worker.generate(share, self.version), "sealed")
        by_group = self.store.groups_rows("rollouts", step, [t.group for t in tasks])
        return [row for t in tasks for row in by_group[t.group]]

    def _open_groups(self, step: int, tasks: list[GroupTask]) -> list[GroupTask]:
        """Open the tasks' groups in the ledger; returns those still to sample. A group whose part
        an earlier attempt wrote is sealed by it (a part is written whole or not at all)."""
        self.ledger.open(step, [t.group for t in tasks])
        self.ledger.take_back(step)  # leases of an interrupted attempt (a Prefect task retry) are void
        entries = self.ledger.read(step)
        parts = self.store.with_parts("rollouts", step, [t.group for t in tasks])
        written = [t.group for t in tasks if entries[t.group].state == "pending" and t.group in parts]
        if written:
            self.ledger.move(step, written, "sealed")
        return [t for t in tasks if entries[t.group].state == "pending" and t.group not in written]

    def _signal_groups(self, step: int, rows: list[dict]) -> int:
        """How many of the rows' groups have rewards that differ: they are scored now (their score
        parts are what `score` then merges, so nothing is scored twice)."""
        groups = sorted({r["group"] for r in rows})
        self._score_groups(step, groups)
        rewards = [s["reward"] for g in groups for s in self.store.read_part("scores", step, g)]
        kept, _ = signal_groups(rewards, self.rl.samples_per_prompt, len(rows))
        return len(kept)

    # --- score --------------------------------------------------------------------------
    def score(self, step: int) -> tuple[Path, dict]:
        """Score the step's groups (scorers write a part per group), then the step's shard."""
        if self._stored("scores", step):
            self._mark(step, "sealed", "scored")  # the shard may have landed just before a crash
            return self.store.path("scores", step), {}
        t0 = time.perf_counter()
        groups = sorted({r["group"] for r in self.store.read("rollouts", step)})
        self._score_groups(step, groups)
        metrics = {f"reward/failures/{k}": float(v) for k, v in self._failures.pop(step, {}).items()}
        metrics["store/regenerated_shards"] = float(self._regenerated.pop(step, 0))
        metrics["time/score_s"] = time.perf_counter() - t0
        if self.scorers:  # in this process: how much of it was the rewards and models themselves
            metrics["time/compute/score_s"] = sum(s.compute_s for s in self.scorers)
            for s in self.scorers:
                s.compute_s = 0.0
        if self.scorer_pool is not None:
            metrics.update(self.scorer_pool.metrics())  # scorer deaths and reassigned groups
        crash_point("score", step)
        path = self.store.merge_parts("scores", step, groups)
        self._mark(step, "sealed", "scored")
        return path, metrics

    def _score_groups(self, step: int, groups: list[int]) -> None:
        """Groups without a score part go to the scorers; their reward failures are counted."""
        done = self.store.with_parts("scores", step, groups)
        todo = [g for g in groups if g not in done]
        counts = self._failures.setdefault(step, {})
        if self.scorer_pool is not None and todo:
            results = [self.scorer_pool.dispatch(step, todo, self.store)]
        else:
            unit = partial(score_batch, groups_per_batch=self.rl.rollout.groups_per_batch)
            results = [s.score(step, share) for s, share in zip(self.scorers, deal(todo, len(self.scorers), unit)) if share]
        for failures in results:
            for name, n in failures.items():
                counts[name] = counts.get(name, 0) + n

    def _stored(self, component: str, step: int) -> bool:
        """The step's shard is stored and intact. A corrupt one was moved aside by the store and
        is generated again from its seed (what was scored from corrupt rollouts is scored again)."""
        if not self.store.has(component, step):
            return False
        if self.store.check(component, step):
            return True
        self._regenerated[step] = self._regenerated.get(step, 0) + 1
        if component == "rollouts":
            self.store.set_aside("scores", step)
            self.ledger.forget(step)
        return False

    def _mark(self, step: int, state: str, to: str, groups: list[int] | None = None) -> None:
        """Move the step's groups in `state` (or just `groups` among them) to `to` in the ledger."""
        found = [g for g in self.ledger.in_state(step, state) if groups is None or g in groups]
        if found:
            self.ledger.move(step, found, to)

    def close(self) -> None:
        self._close_sampler()
        if self.reward_worker is not None:
            self.reward_worker.close()
        for pool in (self.pool, self.scorer_pool, self.learners):
            if pool is not None:
                pool.close()

    # --- update -------------------------------------------------------------------------
    def experience_from_rows(self, rows: list[dict], scores: list[dict] | None = None) -> Experience:
        return experience_from_rows(rows, self.tok.pad_token_id, self.rl.samples_per_prompt, scores)

    def update(self, step: int) -> dict:
        already = self.ledger.in_state(step, "trained")
        if already:  # the kept weights hold this step: training it again would count it twice
            raise CheckpointError(f"{self.ledger.path(step)}: groups {already} of step {step} are already trained "
                                  f"into the weights (resume from step {self.start_step}); refusing to train them twice")
        t0 = time.perf_counter()
        self.updating = True  # until the step is trained and recorded: a failure now is not retried in place
        rows, scores = self.store.read("rollouts", step), self.store.read("scores", step)
        train_rows, train_scores, metrics = self._train_groups(rows, scores)
        if train_rows:  # dynamic sampling may find no group with signal: then the step only logs
            exp = self.experience_from_rows(train_rows, train_scores)
            if self.learners is not None:
                metrics.update(self.learners.update(exp, [r["group"] for r in train_rows], self.policy, self.optimizer,
                                                    self.critic, self.critic_optimizer, self.settings))
            elif self.cfg.resources.num_processes > 1:
                metrics.update(self._launched_update(exp, train_rows))
            else:
                t_learn = time.perf_counter()
                metrics.update(update(self.policy, self.optimizer, exp, self.settings, self.critic, self.critic_optimizer))
                metrics["time/compute/learn_s"] = time.perf_counter() - t_learn
            self._publish_weights()
            self.store.write("advantages", step, advantage_rows(step, train_rows, exp))
            self._mark(step, "sealed", "scored")
            self._mark(step, "scored", "trained", sorted({r["group"] for r in train_rows}))
        metrics.update(rollout_metrics(rows, scores, self.rl.samples_per_prompt, self.rl.rollout.max_new_tokens))
        metrics.update({"time/update_s": time.perf_counter() - t0, "lr": self.optimizer.param_groups[0]["lr"],
                        "lr/alert_multiplier": self.lr_multiplier,
                        **peak_memory()})
        crash_point("update", step)
        done = step + 1
        if checkpoint_due(done, self.rl.steps, self.rl.save_every):
            self.checkpoint(done)
        self.updating = False
        return metrics

    @contextmanager
    def recording(self, step: int):
        """Around a trained step's follow-up (metrics, alerts, evaluation): a failure in it is not
        retried in place, like one inside the update; once it is done, a retry starts after it."""
        self.updating = True
        yield
        self.updating, self.next_step = False, step + 1

    def _launched_update(self, exp: Experience, rows: list[dict]) -> dict:
        """The update under `accelerate launch` (resources.num_processes): the batch's advantages are
        computed here on the whole batch, each process trains on its share, and the new weights and
        optimizer state come back through files (`rl/launch/`)."""
        from hindsight.learning.launch import run_trainer
        from hindsight.learning.update import compute_advantages

        work = self.dir / "launch"
        exp.advantages, _ = compute_advantages(exp, self.settings)
        exp.meta["groups"] = [r["group"] for r in rows]
        self.policy.save_pretrained(work / "policy", safe_serialization=True)
        torch.save(self.optimizer.state_dict(), work / "optimizer.pt")
        torch.save(vars(exp), work / "batch.pt")
        res = self.cfg.resources
        metrics = run_trainer("rl-update", dict(
            policy_dir=str(work / "policy"), optimizer_file=str(work / "optimizer.pt"), batch_file=str(work / "batch.pt"),
            rl=self.rl.model_dump(by_alias=True), dtype=self.cfg.model.dtype, out_dir=str(work / "out")),
            res.num_processes, res.accelerate_config, workdir=work)
        self.policy = load_causal_lm(str(work / "out"), self.cfg.model.dtype)
        if self.rl.disable_dropout:
            disable_dropout(self.policy)
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=self.rl.lr, weight_decay=0.0)
        self.optimizer.load_state_dict(torch.load(work / "out" / "optimizer.pt", weights_only=True))
        return metrics

    def _publish_weights(self) -> None:
        """A new weights version: the in-process workers share the policy object (it may be a new
        one after a launched update), so only its version and their engines need the news."""
        self.version += 1
        for worker in self.rollout_workers:
            worker.policy = self.policy
            worker.load_weights(self.version)
        if self.pool is not None:
            self.pool.publish(self.version, self.policy.state_dict())
        if self.sampler is not None:
            self.sampler.publish(self.version, self.policy.state_dict())
            self._feed()

    def weights_finite(self) -> bool:
        return all(bool(torch.isfinite(p).all()) for p in self.policy.parameters())

    def checkpoint(self, done: int) -> None:
        if self.ckpt.latest_step() == done:
            return
        if self.sampler is not None:
            self._wait_ahead(done)
        self.ckpt.save(done, self.policy, self.tok, self.optimizer, {"fingerprint": self.fingerprint},
                       self.critic, self.critic_optimizer)

    def _set_lr(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.rl.lr * self.lr_multiplier

    # --- look back ----------------------------------------------------------------------
    def observe(self, done: int, metrics: dict) -> list[Alert]:
        """Record step `done`'s metrics on disk and run the alert rules; applies `lower_lr` here
        (as a multiplier of rl.lr saved with each checkpoint, so it survives a resume that
        changes rl.lr)."""
        self.history.append(done, metrics)
        fired = self.monitor.observe(done, metrics)
        for alert in fired:
            append_line(self.dir / "alerts.jsonl", json.dumps(alert.to_dict()))
            if alert.action == "lower_lr":
                self.lr_multiplier *= alert.factor
                self._set_lr()
        return fired

    def _train_groups(self, rows: list[dict], scores: list[dict]) -> tuple[list[dict], list[dict], dict]:
        """All groups, or with dynamic sampling the first prompts_per_step whose rewards differ."""
        if not self.rl.dynamic_sampling.enabled:
            return rows, scores, {}
        size = self.rl.samples_per_prompt
        kept, dropped = signal_groups([s["reward"] for s in scores], size, self.rl.prompts_per_step)
        take = [j for g in kept for j in range(g * size, (g + 1) * size)]
        return [rows[j] for j in take], [scores[j] for j in take], {
            "dynamic_sampling/dropped_groups": float(dropped), "dynamic_sampling/kept_groups": float(len(kept)),
            "replay/trained": float(sum(rows[g * size]["replayed"] for g in kept))}
