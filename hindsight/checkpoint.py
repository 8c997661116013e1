"""Versioned learner state: weights, optimizer, RNG, each a separate component.

Layout under a run's `checkpoints/`:
    policy/step-000010/       HF folder (safetensors + tokenizer)
    optimizer/step-000010.pt  optimizer state (loaded with weights_only=True)
    rng/step-000010.pt        torch and python RNG states
    critic/step-000010/       PPO's value model (HF folder), and critic_optimizer/step-000010.pt
    manifest.json             newest complete version of each component (the commit point)

Components are written first, the manifest last, so a crash between the two leaves the
previous manifest pointing at the previous complete version.
"""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import torch

from hindsight.errors import CheckpointError
from hindsight.faults import crash_point
from hindsight.fsutil import atomic_dir, atomic_write_bytes, atomic_write_json, read_json


class CheckpointManager:
    def __init__(self, root: str | Path, keep_last: int = 2):
        self.root = Path(root)
        self.keep_last = keep_last

    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    def manifest(self) -> dict:
        return read_json(self.manifest_path, default={}) or {}

    def latest_step(self) -> int | None:
        return self.manifest().get("step")

    def policy_dir(self, step: int) -> Path:
        return self.root / "policy" / f"step-{step:06d}"

    def critic_dir(self, step: int) -> Path:
        return self.root / "critic" / f"step-{step:06d}"

    def save(self, step: int, model, tokenizer, optimizer, extra: dict | None = None,
             critic=None, critic_optimizer=None) -> Path:
        def fill(model_):
            def write(tmp: Path):
                model_.save_pretrained(tmp, safe_serialization=True)
                tokenizer.save_pretrained(tmp)
            return write

        policy = atomic_dir(self.policy_dir(step), fill(model))
        self._save_tensor_file(self.root / "optimizer" / f"step-{step:06d}.pt", optimizer.state_dict())
        rng = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1])}
        self._save_tensor_file(self.root / "rng" / f"step-{step:06d}.pt", rng)
        components = {"policy": step, "optimizer": step, "rng": step}
        if critic is not None:
            atomic_dir(self.critic_dir(step), fill(critic))
            self._save_tensor_file(self.root / "critic_optimizer" / f"step-{step:06d}.pt", critic_optimizer.state_dict())
            components.update(critic=step, critic_optimizer=step)
        crash_point("checkpoint", step)  # components written, manifest not yet: the torn case
        manifest = {**self.manifest(), **(extra or {}), "step": step, **components}
        atomic_write_json(self.manifest_path, manifest)
        self._retain(step)
        return policy

    def restore_rng(self, step: int) -> None:
        """Put the process's torch and python RNG back where they were at `step`."""
        state = self._load_tensor_file(self.root / "rng" / f"step-{step:06d}.pt")
        torch.set_rng_state(state["torch"])
        random.setstate((3, tuple(state["python"]), None))

    def load_optimizer(self, step: int, optimizer, component: str = "optimizer") -> None:
        path = self.root / component / f"step-{step:06d}.pt"
        optimizer.load_state_dict(self._load_tensor_file(path))

    def _save_tensor_file(self, path: Path, obj) -> None:
        import io

        buf = io.BytesIO()
        torch.save(obj, buf)
        atomic_write_bytes(path, buf.getvalue())

    def _load_tensor_file(self, path: Path):
        if not path.exists():
            raise CheckpointError(f"{path}: checkpoint component missing")
        try:
            return torch.load(path, weights_only=True)
        except Exception as exc:  # a truncated or corrupt file surfaces as many exception types
            raise CheckpointError(f"{path}: corrupt or truncated checkpoint ({type(exc).__name__})") from None

    def _retain(self, newest: int) -> None:
        """Keep the last `keep_last` versions; the newest (what a resume needs) is never deleted."""
        versions = sorted(int(p.name.split("-")[1]) for p in (self.root / "policy").glob("step-*"))
        for old in versions[: max(0, len(versions) - self.keep_last)]:
            if old == newest:
                continue
            shutil.rmtree(self.policy_dir(old), ignore_errors=True)
            shutil.rmtree(self.critic_dir(old), ignore_errors=True)
            for comp in ("optimizer", "rng", "critic_optimizer"):
                (self.root / comp / f"step-{old:06d}.pt").unlink(missing_ok=True)
