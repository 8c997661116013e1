"""The RL stage's state and its three steps: rollout -> score -> update.

An `RLRun` holds the models resident for the life of the process; the Prefect tasks only
pass step numbers and shard paths between these methods. Every step reads its input from
the rollout store, so any step can be rerun, and a resumed run trains on shards that were
generated before the crash instead of sampling them again.
"""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch

from hindsight.algorithms.losses import LossSettings
from hindsight.checkpoint import CheckpointManager
from hindsight.config import PipelineConfig
from hindsight.errors import CheckpointError
from hindsight.data import load_rows
from hindsight.faults import crash_point
from hindsight.experience import Experience, pad_left, pad_right
from hindsight.learner import LearnerSettings, update
from hindsight.logprobs import sequence_scores, token_logprobs
from hindsight.models import load_causal_lm, load_reward_model, load_tokenizer
from hindsight.reward_worker import RewardWorker
from hindsight.rollout.hf import generate
from hindsight.scoring import load_reward_fn, score_completions
from hindsight.store import RolloutStore


def step_seed(seed: int, step: int) -> int:
    return seed * 1_000_003 + step


def prompt_indices(n_rows: int, per_step: int, step: int, seed: int) -> list[int]:
    """The data cursor is the step: a fresh permutation per epoch, so resume needs no state."""
    out = []
    for k in range(step * per_step, (step + 1) * per_step):
        epoch, pos = divmod(k, n_rows)
        order = list(range(n_rows))
        random.Random(f"{seed}-{epoch}").shuffle(order)
        out.append(order[pos])
    return out


def check_compatible(manifest: dict, fingerprint: dict, run_dir: Path) -> None:
    """Refuse to resume state produced under settings that change what was stored."""
    stored = manifest.get("fingerprint")
    if not stored:
        return
    diff = sorted(k for k in set(stored) | set(fingerprint) if stored.get(k) != fingerprint.get(k))
    if diff:
        detail = ", ".join(f"{k}: stored {stored.get(k)!r}, config {fingerprint.get(k)!r}" for k in diff)
        raise CheckpointError(f"{run_dir}: cannot resume, the stored state is incompatible ({detail}); "
                              f"rerun with --force-new-run to move it aside and start over")


def archive_run_dir(run_dir: Path) -> Path | None:
    """--force-new-run: move old state aside (never delete it) so the run starts fresh."""
    if not run_dir.exists():
        return None
    target = run_dir.with_name(f"{run_dir.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.rename(target)
    return target


class RLRun:
    def __init__(self, cfg: PipelineConfig, init_path: str, rm_path: str | None):
        self.cfg, self.rl = cfg, cfg.rl
        self.dir = cfg.root / "rl"
        self.store = RolloutStore(self.dir)
        self.ckpt = CheckpointManager(self.dir / "checkpoints", keep_last=self.rl.keep_checkpoints)
        self.rows = load_rows(cfg.data.prompts, required=("prompt",), split=cfg.data.split,
                              columns=cfg.data.columns or None)
        self.tok = load_tokenizer(init_path)
        self.fingerprint = {"init": init_path, "algorithm": self.rl.algorithm, "seed": cfg.seed,
                            "samples_per_prompt": self.rl.samples_per_prompt,
                            "prompts_per_step": self.rl.prompts_per_step, "prompts": cfg.data.prompts}
        check_compatible(self.ckpt.manifest(), self.fingerprint, self.dir)
        for spec in [f.fn for f in self.rl.rewards]:
            load_reward_fn(spec)  # an unimportable reward fails now, before any sampling
        start = self.ckpt.latest_step()
        policy_path = str(self.ckpt.policy_dir(start)) if start else init_path
        self.policy = load_causal_lm(policy_path, cfg.model.dtype)
        self.ref = load_causal_lm(init_path, cfg.model.dtype).eval() if self.rl.kl.coef > 0 else None
        self.rm = load_reward_model(rm_path).eval() if rm_path and self.rl.reward_model_weight > 0 else None
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=self.rl.lr, weight_decay=0.0)
        if start:
            self.ckpt.load_optimizer(start, self.optimizer)
        self.start_step = start or 0
        self.reward_worker = RewardWorker() if self.rl.reward_isolation == "process" else None
        self.settings = LearnerSettings(
            num_iterations=self.rl.num_iterations, max_grad_norm=self.rl.max_grad_norm,
            temperature=self.rl.rollout.temperature, scale_rewards=self.rl.scale_rewards,
            loss=LossSettings(self.rl.clip_eps_low, self.rl.clip_eps_high, self.rl.kl.coef,
                              self.rl.kl.estimator, self.rl.loss_agg, self.rl.rollout.max_new_tokens))

    # --- rollout ------------------------------------------------------------------------
    def rollout(self, step: int) -> tuple[Path, dict]:
        if self.store.has("rollouts", step):
            return self.store.path("rollouts", step), {"rollout/reused": 1.0}
        idx = prompt_indices(len(self.rows), self.rl.prompts_per_step, step, self.cfg.seed)
        batch = [self.rows[i] for i in idx]
        r = self.rl.rollout
        t0 = time.perf_counter()
        exp = generate(self.policy, self.tok, [b["prompt"] for b in batch], self.rl.samples_per_prompt,
                       r.max_new_tokens, r.temperature, r.top_p, seed=step_seed(self.cfg.seed, step))
        seconds = time.perf_counter() - t0
        texts = self.tok.batch_decode(exp.completion_ids, skip_special_tokens=True)
        rows = []
        for j in range(len(exp)):
            src = batch[j // exp.group_size]
            n = int(exp.completion_mask[j].sum())
            rows.append({
                "step": step, "index": j, "group": j // exp.group_size, "prompt_id": str(src.get("id", idx[j // exp.group_size])),
                "prompt": src["prompt"], "completion": texts[j],
                "prompt_ids": exp.prompt_ids[j][exp.prompt_mask[j].bool()].tolist(),
                "completion_ids": exp.completion_ids[j, :n].tolist(), "logprobs": exp.logprobs[j, :n].tolist(),
                "ended_with_eos": bool(n and exp.completion_ids[j, n - 1] == self.tok.eos_token_id),
                "columns": json.dumps({k: v for k, v in src.items() if k != "prompt"}),
            })
        n_tokens = int(exp.completion_mask.sum())
        crash_point("rollout", step)
        return self.store.write("rollouts", step, rows), {"time/rollout_s": seconds,
                                                          "rollout/tokens_per_s": n_tokens / max(seconds, 1e-9)}

    # --- score --------------------------------------------------------------------------
    def score(self, step: int) -> tuple[Path, dict]:
        if self.store.has("scores", step):
            return self.store.path("scores", step), {}
        t0 = time.perf_counter()
        rows = self.store.read("rollouts", step)
        columns = [json.loads(r["columns"]) for r in rows]
        keys = sorted({k for c in columns for k in c})
        result = score_completions([(f.fn, f.weight) for f in self.rl.rewards], [r["completion"] for r in rows],
                                   {k: [c.get(k) for c in columns] for k in keys}, self.rl.reward_fallback,
                                   self.reward_worker, self.rl.reward_timeout_s)
        exp = self.experience_from_rows(rows)
        ref = None
        with torch.no_grad():
            if self.ref is not None:
                ref, _ = token_logprobs(self.ref, exp.input_ids, exp.attention_mask, exp.completion_ids.size(1),
                                        self.rl.rollout.temperature)
            rm = sequence_scores(self.rm, exp.input_ids, exp.attention_mask).tolist() if self.rm else None
        out = []
        for j, r in enumerate(rows):
            total = result.total[j] + (self.rl.reward_model_weight * rm[j] if rm else 0.0)
            n = len(r["completion_ids"])
            out.append({"step": step, "index": j, "reward": total, "rm_score": rm[j] if rm else None,
                        **{f"reward_{k}": v[j] for k, v in result.per_fn.items()},
                        "ref_logprobs": ref[j, :n].tolist() if ref is not None else None})
        metrics = {f"reward/failures/{k}": float(v) for k, v in result.failures.items()}
        metrics["time/score_s"] = time.perf_counter() - t0
        crash_point("score", step)
        return self.store.write("scores", step, out), metrics

    def close(self) -> None:
        if self.reward_worker is not None:
            self.reward_worker.close()

    # --- update -------------------------------------------------------------------------
    def experience_from_rows(self, rows: list[dict], scores: list[dict] | None = None) -> Experience:
        prompt_ids, prompt_mask = pad_left([r["prompt_ids"] for r in rows], self.tok.pad_token_id)
        completion_ids, mask = pad_right([r["completion_ids"] for r in rows], self.tok.pad_token_id)
        logprobs, _ = pad_right([r["logprobs"] for r in rows], 0.0, dtype=torch.float32)
        exp = Experience(prompt_ids, prompt_mask, completion_ids, mask, logprobs, self.rl.samples_per_prompt)
        if scores is not None:
            exp.rewards = torch.tensor([s["reward"] for s in scores], dtype=torch.float32)
            if scores[0]["ref_logprobs"] is not None:
                exp.ref_logprobs, _ = pad_right([s["ref_logprobs"] for s in scores], 0.0, dtype=torch.float32)
        return exp

    def update(self, step: int) -> dict:
        t0 = time.perf_counter()
        rows, scores = self.store.read("rollouts", step), self.store.read("scores", step)
        exp = self.experience_from_rows(rows, scores)
        metrics = update(self.policy, self.optimizer, exp, self.settings)
        lengths = torch.tensor([len(r["completion_ids"]) for r in rows], dtype=torch.float32)
        metrics.update({
            "reward/mean": float(exp.rewards.mean()), "reward/std": float(exp.rewards.std()),
            "reward/min": float(exp.rewards.min()), "reward/max": float(exp.rewards.max()),
            "response_length/mean": float(lengths.mean()),
            "rollout/completion_rate": sum(r["ended_with_eos"] for r in rows) / len(rows),
            "time/update_s": time.perf_counter() - t0,
        })
        for key in [k for k in scores[0] if k.startswith("reward_")]:
            metrics[f"reward/{key.removeprefix('reward_')}"] = sum(s[key] for s in scores) / len(scores)
        crash_point("update", step)
        done = step + 1
        if done % self.rl.save_every == 0 or done == self.rl.steps:
            self.ckpt.save(done, self.policy, self.tok, self.optimizer, {"fingerprint": self.fingerprint})
        return metrics
