"""The learning role of the RL stage: the policy it trains, its optimizer, the critic of an
algorithm that has one, and how a batch is trained (in this process, over the learner group, or
under `accelerate launch`). The coordinator hands it a batch and gets metrics back."""
from __future__ import annotations

import time
from pathlib import Path

import torch

from hindsight.experience import Experience
from hindsight.learning.build import build_critic, build_optimizer, build_policy
from hindsight.learning.update import learner_settings, update, whole_batch_advantages


class Learner:
    def __init__(self, cfg, init_path: str, rm_path: str | None, ckpt, start: int | None, pad_id: int):
        rl, model_cfg = cfg.rl, cfg.model
        self.rl, self.cfg, self.settings = rl, cfg, learner_settings(rl)
        self.policy_path = str(ckpt.policy_dir(start)) if start else init_path
        self.policy = build_policy(self.policy_path, model_cfg, rl, base=init_path, seed=cfg.seed, resume=bool(start))
        self.optimizer = build_optimizer(self.policy, rl.lr)
        self.critic = self.critic_optimizer = self.critic_source = None
        if self.settings.estimator.needs_critic:
            p = self.settings.algorithm_settings  # from the checkpoint on resume, else the reward model or the policy
            self.critic_source = str(ckpt.critic_dir(start)) if start else (
                rm_path if p.critic_init == "reward_model" else init_path)
            self.critic = build_critic(self.critic_source, model_cfg, rl, pad_id, cfg.seed)
            self.critic_optimizer = build_optimizer(self.critic, p.critic_lr)
        if start:
            ckpt.load_optimizer(start, self.optimizer)
            if self.critic is not None:
                ckpt.load_optimizer(start, self.critic_optimizer, "critic_optimizer")
        self.group = None  # ranks 1..P-1 (rl.workers.learner = P > 1), started by the coordinator
        self.launch_dir = cfg.root / "rl" / "launch"

    def resume_files(self, ckpt, start: int | None) -> dict:
        """What the other ranks of a learner group build from: this rank's sources and optimizer files."""
        paths = {"policy": self.policy_path, "critic": self.critic_source}
        if start:
            paths["optimizer"] = str(ckpt.tensor_file(start))
            if self.critic is not None:
                paths["critic_optimizer"] = str(ckpt.tensor_file(start, "critic_optimizer"))
        return paths

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def train(self, exp: Experience, groups: list[int]) -> dict:
        """One update on the batch; its advantages are set on `exp` (the coordinator stores them)."""
        whole_batch_advantages(exp, self.settings, self.critic)  # every rank's share comes from the whole
        if self.group is not None:
            return self.group.update(exp, groups, self)
        if self.cfg.resources.num_processes > 1:
            return self._launched(exp, groups)
        t0 = time.perf_counter()
        metrics = update(self.policy, self.optimizer, exp, self.settings, self.critic, self.critic_optimizer)
        return {**metrics, "time/compute/learn_s": time.perf_counter() - t0}

    def _launched(self, exp: Experience, groups: list[int]) -> dict:
        """The update under `accelerate launch` (resources.num_processes): each process trains on its
        share, and the new weights and optimizer state come back through files (`rl/launch/`)."""
        from hindsight.learning.launch import run_trainer

        work: Path = self.launch_dir
        exp.meta["groups"] = groups
        self.policy.save_pretrained(work / "policy", safe_serialization=True)
        torch.save(self.optimizer.state_dict(), work / "optimizer.pt")
        torch.save(vars(exp), work / "batch.pt")
        res = self.cfg.resources
        metrics = run_trainer("rl-update", dict(
            policy_dir=str(work / "policy"), optimizer_file=str(work / "optimizer.pt"), batch_file=str(work / "batch.pt"),
            rl=self.rl.model_dump(by_alias=True), model=self.cfg.model.model_dump(), out_dir=str(work / "out")),
            res.num_processes, res.accelerate_config, workdir=work)
        self.policy = build_policy(str(work / "out"), self.cfg.model, self.rl)
        self.optimizer = build_optimizer(self.policy, self.rl.lr, str(work / "out" / "optimizer.pt"))
        return metrics

    def finite(self) -> bool:
        return all(bool(torch.isfinite(p).all()) for p in self.policy.parameters())

    def save(self, ckpt, step: int, tok, extra: dict) -> None:
        ckpt.save(step, self.policy, tok, self.optimizer, extra, self.critic, self.critic_optimizer)

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
