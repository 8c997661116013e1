"""The RL run: the coordinator that holds the stage's roles and calls them, step by step.

An `RLRun` holds, as fields, the learner (`learning.learner.Learner`), the worker pool where
rollout workers and scorers run (`coordination.pools`), the rollout role (`Rollouts`: when a
step is sampled), the scoring role (`Scorers`), the prompt source, and the run's state (the rollout
store, the ledger, the checkpoints, the metric history). The Prefect tasks only pass step
numbers between its three steps, rollout -> score -> update. Every step reads its input from the
rollout store, so any step can be rerun, and a resumed run trains on shards that were generated
before the crash instead of sampling them again.
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path

from hindsight.coordination.prompts import PromptSource
from hindsight.coordination.replay import signal_groups
from hindsight.coordination.resume import lr_multiplier, prepare_resume
from hindsight.coordination.learner_group import start_learner_group
from hindsight.coordination.learner_recovery import rebuild_learner
from hindsight.coordination.pools import PoolContext, build_pool
from hindsight.coordination.rollouts import Rollouts
from hindsight.coordination.scorers import Scorers
from hindsight.coordination.watchdog import Watchdog
from hindsight.config import PipelineConfig
from hindsight.console import say
from hindsight.data.bounds import longest_prompt
from hindsight.data.rows import load_rows
from hindsight.errors import CheckpointError, NonFiniteError, RewardError
from hindsight.maths.experience import advantage_rows, experience_from_rows
from hindsight.scoring.rewards import reward_weights
from hindsight.faults import crash_point
from hindsight.learning.learner import Learner, PeerLost
from hindsight.learning.strategies import get_strategy
from hindsight.lookback.alerts import Alert, AlertMonitor
from hindsight.lookback.history import MetricsLog, truncate_rows_after
from hindsight.lookback.metrics import peak_memory, rollout_metrics
from hindsight.models.load import load_tokenizer
from hindsight.rollout.decoding import decoding_record
from hindsight.rollout.engines import ENGINES
from hindsight.scoring.rewards import check_reward, reward_source_hash
from hindsight.state.checkpoint import CheckpointManager, checkpoint_due
from hindsight.state.fingerprint import run_fingerprint
from hindsight.fsutil import append_line, atomic_write_json
from hindsight.state.ledger import Ledger
from hindsight.state.rundir import RunDir
from hindsight.state.store import RolloutStore


class RLRun:
    def __init__(self, cfg: PipelineConfig, init_path: str, rm_path: str | None):
        self.cfg, self.rl = cfg, cfg.rl
        self.given_cfg, self.rm_path, self.learner_rebuilds = cfg, rm_path, 0  # what a rebuilt learner starts from
        self.paths = RunDir.of(cfg).rl
        self.dir = self.paths.path
        self.init_path = init_path
        self.store = RolloutStore(self.dir)
        self.ckpt = CheckpointManager(self.paths.checkpoints, keep_last=self.rl.keep_checkpoints)
        rows = load_rows(**cfg.data.reading("prompts"))
        self.tok = load_tokenizer(init_path)
        for call in self.rl.scoring.rewards:
            check_reward(call.fn, call.args)  # an unimportable reward, or one that cannot run here, fails now
        start = self.ckpt.intact_step()  # a corrupt newest version falls back to the newest intact one
        get_strategy(self.rl.learner.strategy).check_resume(self.ckpt, start)  # before anything is written
        self.start_step = start or 0
        self.fingerprint = run_fingerprint(cfg, init_path, rm_path, reward_source_hash, ENGINES)
        self.resume_changes = prepare_resume(self.paths, self.fingerprint, self.start_step, self.rl.steps)
        atomic_write_json(self.paths.config, self.rl.model_dump(mode="json", by_alias=True))

        pad_id = self.tok.pad_token_id
        self.learner = Learner(cfg, init_path, rm_path, self.ckpt, start, pad_id,
                               start_group=start_learner_group(cfg, pad_id, init_path, bool(start)))
        try:
            if start and not self.weights_healthy():  # written by an older hindsight that checked finiteness only
                raise CheckpointError(f"{self.ckpt.policy_dir(start)}: the checkpoint of step {start} holds weights "
                                      f"beyond model.max_weight_abs {cfg.model.max_weight_abs:g}: a diverged run, not "
                                      f"one to resume; rerun with --force to start over")
            self._fit_budget(rows, start)  # before the roles: their forwards read the fitted budget
            entropy = self.ckpt.manifest().get("entropy_control") if start else None
            if entropy is not None:  # the adaptive coefficient where the run it continues left it
                self.learner.restore_entropy(entropy)
            self._start_roles(start, rows, pad_id, rm_path)
        except BaseException:  # what did start (the learner group, Ray pools) stops with the failure
            self._close_started()
            raise

        self._regenerated: dict[int, int] = {}  # corrupt shards generated again, per step
        self.history = MetricsLog(self.paths.metrics)
        self.history.truncate_after(self.start_step)  # steps after the checkpoint are redone
        truncate_rows_after(self.paths.alerts, self.start_step)  # and their alerts fire again
        self.monitor = AlertMonitor(self.rl.alerts, self.history.read())
        self.watchdog = Watchdog(self.paths.stalls, self.rl.workers, self._children)  # no phase wedges the run
        self.pool.on_progress = self.watchdog.progress  # a replaced sampler is progress, not a stall
        self.updating = False  # a step's update or follow-up has begun: a failure now is not retried in place
        self.next_step = self.start_step  # the first step not yet trained and recorded: a retry continues there
        if start:  # last, so that nothing built above draws from the restored generators
            self.ckpt.restore_rng(start)

    def _fit_budget(self, rows: list[dict], start: int | None) -> None:
        """`rl.learner.micro_batch_tokens: auto`: fitted for the widest rows the run can sample (a
        resumed run takes its checkpoint's fit, so its micro-batches are the ones it had); the
        roles built after this see the fitted number."""
        if self.rl.learner.micro_batch_tokens != "auto":
            return
        mt = self.rl.rollout.multi_turn
        completion = mt.max_tokens if mt is not None else self.rl.rollout.max_new_tokens
        kept = self.ckpt.manifest().get("micro_batch_fit") if start else None
        render = None
        if mt is not None:  # the first prompt carries the tools' schemas: hundreds of tokens a user's prompt does not show
            from hindsight.rollout.multiturn.render import first_prompt_text
            from hindsight.rollout.multiturn.setup import tool_schemas

            render = first_prompt_text(self.tok, tool_schemas(mt))
        fit = self.learner.fit_budget(longest_prompt(rows, self.tok, render), completion, kept)
        say(f"micro_batch_tokens: auto -> {fit['budget']} ({fit['budget'] // fit['width']} rows of {fit['width']} "
              f"tokens; {fit['per_token_bytes'] / 2**10:.0f} KiB a token under a cap of {fit['cap_bytes'] / 2**20:.0f} "
              f"MiB{', from the checkpoint' if fit == kept else ''})")
        learner = self.rl.learner.model_copy(update={"micro_batch_tokens": fit["budget"]})
        self.cfg = self.cfg.model_copy(update={"rl": self.rl.model_copy(update={"learner": learner})})
        self.rl = self.cfg.rl

    def _start_roles(self, start: int | None, rows: list[dict], pad_id: int, rm_path: str | None) -> None:
        """The roles around the learner: rollouts, scorers, and the state they share."""
        cfg, init_path = self.cfg, self.init_path
        self.lr_multiplier = lr_multiplier(self.paths.alerts, start) if start else 1.0  # `lower_lr` alerts
        self.set_lr()  # the configured rl.learner.lr applies on resume, not the rate stored in the optimizer
        self.ledger = Ledger(self.dir)
        self.ledger.roll_back_after(self.start_step)  # groups trained into weights that were not kept
        self.prompts = PromptSource(self.rl, cfg.seed, rows, self.store)
        self.pool = build_pool(PoolContext(cfg, self.learner.serving, self.learner.policy_path, init_path, self.tok,
                                           self.store, self.ledger, self.start_step, rm_path, pad_id))
        self.scorers = Scorers(self.rl, self.pool)
        self.decoding = decoding_record(self.tok, self.learner.serving, cfg.eval, self.rl.rollout)
        atomic_write_json(self.paths.decoding, self.decoding)
        # sampling ahead (rl.async.max_staleness >= 1), the first steps are asked for now
        self.rollouts = Rollouts(self.rl, self.pool, self.scorers, self.store, self.prompts, version=self.start_step)

    def _close_started(self) -> None:
        for role in ("pool", "learner"):
            if hasattr(self, role):
                try:
                    getattr(self, role).close()
                except Exception:  # the failure that stopped the start is the one to report
                    pass

    @property
    def policy(self):
        """The whole policy being trained: what evaluation, reports and checkpoints read."""
        return self.learner.serving

    def _children(self) -> list[tuple]:
        """The role processes a stall report asks for their stacks."""
        return self.pool.children()

    # --- rollout ------------------------------------------------------------------------
    def rollout(self, step: int) -> tuple[Path, dict]:
        with self.watchdog.phase("rollout", step):
            return self._rollout(step)

    def _rollout(self, step: int) -> tuple[Path, dict]:
        ahead = self.rollouts.take_ahead(step)  # merged before a checkpoint, metrics and all
        if ahead is not None:
            return ahead
        if self._stored("rollouts", step):
            return self.store.path("rollouts", step), {"rollout/reused": 1.0}
        return self.rollouts.sample(step)

    # --- score --------------------------------------------------------------------------
    def score(self, step: int) -> tuple[Path, dict]:
        """Score the step's groups (scorers write a part per group), then the step's shard."""
        with self.watchdog.phase("score", step):
            return self._score(step)

    def _score(self, step: int) -> tuple[Path, dict]:
        if self._stored("scores", step):
            self.ledger.advance(step, "sealed", "scored")  # the shard may have landed just before a crash
            return self.store.path("scores", step), {}
        t0 = time.perf_counter()
        groups = sorted({r["group"] for r in self.store.read("rollouts", step)})
        self.scorers.score_groups(step, groups, self.store)
        try:
            metrics = self.scorers.step_metrics(step)
        except RewardError:  # scores that are the fallback throughout are not trained on, now or on a rerun
            self.store.drop_parts("scores", step)
            raise
        metrics["store/regenerated_shards"] = float(self._regenerated.pop(step, 0))
        metrics["time/score_s"] = time.perf_counter() - t0
        crash_point("score", step)
        path = self.store.merge_parts("scores", step, groups)
        self.ledger.advance(step, "sealed", "scored")
        return path, metrics

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

    # --- update -------------------------------------------------------------------------
    def update(self, step: int) -> dict:
        with self.watchdog.phase("update", step):
            return self._update(step)

    def _update(self, step: int) -> dict:
        already = self.ledger.in_state(step, "trained")
        if already:  # the kept weights hold this step: training it again would count it twice
            raise CheckpointError(f"{self.ledger.path(step)}: groups {already} of step {step} are already trained "
                                  f"into the weights (resume from step {self.start_step}); refusing to train them twice")
        t0 = time.perf_counter()
        self.updating = True  # until the step is trained and recorded: a failure now is not retried in place
        rows, scores = self.store.read("rollouts", step), self.store.read("scores", step)
        train_rows, train_scores, metrics = self._train_groups(rows, scores)
        if train_rows:  # dynamic sampling may find no group with signal: then the step only logs
            try:
                try:
                    exp, learned = self._train_batch(train_rows, train_scores)
                except PeerLost as lost:  # a rank died or hung: a new group, then this step again
                    metrics["workers/learner_replayed_steps"] = float(len(rebuild_learner(self, step, lost)))
                    exp, learned = self._train_batch(train_rows, train_scores)
                metrics.update(learned)
            except NonFiniteError as exc:
                raise type(exc)(f"step {step}: {exc}, and the run stopped: nothing of this step is saved or registered. "
                            f"{self.newest_checkpoint()}; lower rl.learner.lr (or fix what made the step diverge), then "
                            f"rerun the same command to resume from it") from None
            self.rollouts.publish(self.learner.serving)
            self.store.write("advantages", step, advantage_rows(step, train_rows, exp))
            self.ledger.advance(step, "sealed", "scored")
            self.ledger.advance(step, "scored", "trained", sorted({r["group"] for r in train_rows}))
        metrics.update(rollout_metrics(rows, scores, self.rl.samples_per_prompt, self.rl.rollout.max_new_tokens))
        metrics.update({"time/update_s": time.perf_counter() - t0, "lr": self.learner.optimizer.param_groups[0]["lr"],
                        "lr/alert_multiplier": self.lr_multiplier, **peak_memory()})
        crash_point("update", step)
        done = step + 1
        if checkpoint_due(done, self.rl.steps, self.rl.save_every):
            self.checkpoint(done)
        self.updating = False
        return metrics

    def _train_batch(self, train_rows: list[dict], train_scores: list[dict]) -> tuple:
        """One update on the rows; returns the experience (its advantages set) and the metrics."""
        exp = experience_from_rows(train_rows, self.tok.pad_token_id, self.rl.samples_per_prompt, train_scores)
        exp.meta["reward_weights"] = reward_weights(self.rl.scoring, exp.meta.get("reward_names", []))
        return exp, self.learner.train(exp, [r["group"] for r in train_rows])

    def train_stored(self, step: int) -> None:
        """Train a step already trained once, from its stored shards, into weights that lost it
        (a rebuilt learner group): the same groups, in the same order, nothing recorded."""
        train_rows, train_scores, _ = self._train_groups(self.store.read("rollouts", step),
                                                          self.store.read("scores", step))
        if train_rows:
            self._train_batch(train_rows, train_scores)

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

    @contextmanager
    def recording(self, step: int):
        """Around a trained step's follow-up (metrics, alerts, evaluation): a failure in it is not
        retried in place, like one inside the update; once it is done, a retry starts after it."""
        self.updating = True
        yield
        self.updating, self.next_step = False, step + 1

    def weights_healthy(self) -> bool:
        return self.learner.healthy(self.cfg.model.max_weight_abs)

    def newest_checkpoint(self) -> str:
        """Where a stopped run resumes: checkpoints are written only after healthy steps, from
        weights that are finite and within model.max_weight_abs."""
        step = self.ckpt.latest_step()
        return (f"The newest checkpoint, healthy (written after steps within rl.learner.health's bands, every weight "
                f"finite and within +-{self.cfg.model.max_weight_abs:g}), is step {step} "
                f"({self.ckpt.policy_dir(step)})" if step else "There is no checkpoint yet: a rerun starts from the "
                                                               "beginning")

    def checkpoint(self, done: int) -> None:
        if self.ckpt.latest_step() == done:
            return
        if not self.weights_healthy():  # never a checkpoint a resume would carry on from in NaN or at 1e30
            raise NonFiniteError(f"step {done}: the policy's weights are not finite or beyond model.max_weight_abs "
                                 f"{self.cfg.model.max_weight_abs:g}, so no checkpoint is written. "
                                 f"{self.newest_checkpoint()}")
        self.rollouts.wait_ahead(done)  # async: the shards sampled with versions no checkpoint keeps
        kept = {"micro_batch_fit": self.learner.budget_fit} if self.learner.budget_fit else {}
        if self.learner.settings.entropy is not None:
            kept["entropy_control"] = self.learner.settings.entropy.state()
        self.learner.save(self.ckpt, done, self.tok, {"fingerprint": self.fingerprint, **kept})

    def set_lr(self) -> None:
        self.learner.set_lr(self.rl.learner.lr * self.lr_multiplier)

    # --- look back ----------------------------------------------------------------------
    def observe(self, done: int, metrics: dict) -> list[Alert]:
        """Record step `done`'s metrics on disk and run the alert rules; applies `lower_lr` here
        (as a multiplier of rl.learner.lr saved with each checkpoint, so it survives a resume that
        changes rl.learner.lr)."""
        self.history.append(done, metrics)
        fired = self.monitor.observe(done, metrics)
        for alert in fired:
            append_line(self.paths.alerts, json.dumps(alert.to_dict()))
            if alert.action == "lower_lr":
                self.lr_multiplier *= alert.factor
                self.set_lr()
        return fired

    def close(self) -> None:
        self.watchdog.close()
        self.pool.close()
        self.learner.close()
