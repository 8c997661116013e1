"""Versioned learner state: weights, optimizer, RNG, each a separate component.

Layout under a run's `checkpoints/`:
    policy/step-000010/       HF folder (safetensors + tokenizer)
    optimizer/step-000010.pt  optimizer state (loaded with weights_only=True)
    rng/step-000010.pt        torch and python RNG states
    critic/step-000010/       PPO's value model (HF folder), and critic_optimizer/step-000010.pt
    learner_state/step-000010/  instead of the optimizer and critic files, an fsdp2 learner's
                              weights and optimizer states: torch.distributed.checkpoint,
                              one file per rank and `.metadata`; the policy folder is still the
                              whole model, gathered from the shards
    manifest.json             newest complete version of each component (the commit point)

Components are written first, the manifest last, so a crash between the two leaves the
previous manifest pointing at the previous complete version.

The manifest records the sha256 of every file of every kept version (`versions`).
`intact_step` verifies the newest version against them before a resume loads it; a corrupt
version is moved under `corrupt/` and the newest intact one is used instead.
"""
from __future__ import annotations

import json
import logging
import os
import random
import shutil
import time
from pathlib import Path

import torch

from hindsight.errors import CheckpointError
from hindsight.faults import crash_point
from hindsight.fsutil import atomic_dir, atomic_write, atomic_write_json, file_sha256, read_json

log = logging.getLogger("hindsight.state.checkpoint")
_COMPONENTS = ("policy", "optimizer", "rng", "critic", "critic_optimizer", "learner_state")
_FOLDERS = ("policy", "critic", "learner_state")  # components kept as a folder per version


def checkpoint_due(done: int, steps: int, save_every: int) -> bool:
    """Whether the RL update writes a checkpoint once `done` steps are trained."""
    return done % save_every == 0 or done == steps


def checkpoint_spans(start: int, steps: int, save_every: int) -> list[tuple[int, int]]:
    """The steps from `start` to `steps` cut after each checkpoint, as (first, last) with last
    excluded. A span is one Prefect task; past its retries the stage resumes at its start."""
    ends = [done for done in range(start + 1, steps + 1) if checkpoint_due(done, steps, save_every)]
    return list(zip([start, *ends], ends))


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

    def learner_state_dir(self, step: int) -> Path:
        return self.root / "learner_state" / f"step-{step:06d}"

    def folder(self, component: str, step: int) -> Path:
        return self.root / component / f"step-{step:06d}"

    def save(self, step: int, model, tokenizer, optimizer=None, extra: dict | None = None,
             critic=None, critic_optimizer=None, state_writer=None) -> Path:
        """`state_writer(folder)`: a learner whose state is not one optimizer file (every rank of
        a sharded one writes its shard there) writes it instead of the optimizer and critic
        components."""
        def fill(model_):
            def write(tmp: Path):
                model_.save_pretrained(tmp, safe_serialization=True)
                tokenizer.save_pretrained(tmp)
            return write

        policy = atomic_dir(self.policy_dir(step), fill(model))
        components = {"policy": step, "rng": step}
        if state_writer is not None:
            atomic_dir(self.learner_state_dir(step), state_writer)
            components["learner_state"] = step
        else:
            self._save_tensor_file(self.tensor_file(step, "optimizer"), optimizer.state_dict())
            components["optimizer"] = step
        rng = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1])}
        self._save_tensor_file(self.tensor_file(step, "rng"), rng)
        if critic is not None:
            atomic_dir(self.critic_dir(step), fill(critic))
            self._save_tensor_file(self.tensor_file(step, "critic_optimizer"), critic_optimizer.state_dict())
            components.update(critic=step, critic_optimizer=step)
        crash_point("checkpoint", step)  # components written, manifest not yet: the torn case
        manifest = {**self.manifest(), **(extra or {}), "step": step, **components}
        versions = {**manifest.get("versions", {}), str(step): self._checksums(step)}
        keep = sorted(versions, key=int)[-self.keep_last:]
        manifest["versions"] = {v: versions[v] for v in keep}
        atomic_write_json(self.manifest_path, manifest)
        self._retain(step)
        return policy

    def _files(self, step: int) -> list[Path]:
        """Every file of a version: its HF folders' files and its tensor files."""
        out = []
        for folder in (self.folder(c, step) for c in _FOLDERS):
            if folder.is_dir():
                out += sorted(p for p in folder.rglob("*") if p.is_file())
        out += [p for c in ("optimizer", "rng", "critic_optimizer") if (p := self.tensor_file(step, c)).exists()]
        return out

    def _checksums(self, step: int) -> dict[str, str]:
        return {str(p.relative_to(self.root)): file_sha256(p) for p in self._files(step)}

    def intact_step(self) -> int | None:
        """The newest version whose files all match their recorded sha256. Corrupt newer versions
        are moved under `corrupt/` and the manifest falls back; none intact is an error."""
        manifest = self.manifest()
        versions = manifest.get("versions")
        if not versions:
            return manifest.get("step")  # written before checksums were recorded
        problems = []
        for step in sorted(map(int, versions), reverse=True):
            bad = [rel for rel, want in versions[str(step)].items()
                   if not (self.root / rel).is_file() or file_sha256(self.root / rel) != want]
            if not bad:
                if step != manifest.get("step"):
                    self._fall_back(manifest, step, problems)
                return step
            problems.append((step, bad))
        detail = "; ".join(f"step {s}: {', '.join(b)}" for s, b in problems)
        raise CheckpointError(f"{self.root}: no intact checkpoint version ({detail} fail their sha256); rerun with "
                              f"--force to move the run aside and start over")

    def _fall_back(self, manifest: dict, step: int, problems: list) -> None:
        corrupt = self.root / "corrupt" / time.strftime("%Y%m%d-%H%M%S")
        for bad_step, _ in problems:
            for path in self._files(bad_step):
                target = corrupt / path.relative_to(self.root)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, target)
            for folder in (self.folder(c, bad_step) for c in _FOLDERS):
                shutil.rmtree(folder, ignore_errors=True)  # emptied above
        versions = {v: c for v, c in manifest["versions"].items() if int(v) <= step}
        atomic_write_json(self.manifest_path, {**manifest, "step": step, "versions": versions,
                                               **{c: step for c in _COMPONENTS if c in manifest}})
        for bad_step, bad in problems:
            log.warning("checkpoint step %d is corrupt (%s fail their sha256): moved to %s; resuming from step %d, "
                        "the newest intact version", bad_step, ", ".join(bad), corrupt, step)

    def restore_rng(self, step: int) -> None:
        """Put the process's torch and python RNG back where they were at `step`."""
        state = load_tensor_file(self.tensor_file(step, "rng"))
        torch.set_rng_state(state["torch"])
        random.setstate((3, tuple(state["python"]), None))

    def tensor_file(self, step: int, component: str = "optimizer") -> Path:
        """Where a component saved as one tensor file (optimizer, critic_optimizer, rng) lives."""
        return self.root / component / f"step-{step:06d}.pt"

    def load_optimizer(self, step: int, optimizer, component: str = "optimizer") -> None:
        optimizer.load_state_dict(load_tensor_file(self.tensor_file(step, component)))

    def _save_tensor_file(self, path: Path, obj) -> None:
        # streamed into the file: an optimizer's state (8 bytes a parameter for AdamW) built as
        # bytes first was two more copies of it in memory, the run's peak at each checkpoint
        atomic_write(path, lambda fh: torch.save(obj, fh))

    def _retain(self, newest: int) -> None:
        """Keep the last `keep_last` versions; the newest (what a resume needs) is never deleted."""
        versions = sorted(int(p.name.split("-")[1]) for p in (self.root / "policy").glob("step-*"))
        for old in versions[: max(0, len(versions) - self.keep_last)]:
            if old == newest:
                continue
            for component in _FOLDERS:
                shutil.rmtree(self.folder(component, old), ignore_errors=True)
            for comp in ("optimizer", "rng", "critic_optimizer"):
                self.tensor_file(old, comp).unlink(missing_ok=True)


def load_tensor_file(path: str | Path):
    """A component saved as one tensor file (optimizer state, RNG), read with weights_only."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: checkpoint component missing")
    try:
        return torch.load(path, weights_only=True)
    except Exception as exc:  # a truncated or corrupt file surfaces as many exception types
        raise CheckpointError(f"{path}: corrupt or truncated checkpoint ({type(exc).__name__})") from None


def require_healthy(folder, stage: str, max_abs: float) -> None:
    """Every tensor of the folder's safetensors files is finite and within +-`max_abs`
    (`model.max_weight_abs`), read a chunk at a time (`float_chunks`); else a `NonFiniteError`
    naming the file and tensor: a model whose training diverged, to NaN or to 1e30, is never
    registered."""
    from hindsight.errors import NonFiniteError

    for path in sorted(Path(folder).glob("*.safetensors")):
        for name, values in float_chunks(path):
            if not bool(torch.isfinite(values).all()):
                raise NonFiniteError(f"stage {stage}: {path.name} holds non-finite weights ({name}): the training "
                                     f"diverged, so nothing is registered; lower the stage's lr and rerun")
            peak = float(values.abs().max()) if values.numel() else 0.0
            if peak > max_abs:
                raise NonFiniteError(f"stage {stage}: {path.name} holds a weight of {peak:.3g} ({name}), beyond "
                                     f"model.max_weight_abs {max_abs:g}: the training diverged, so nothing is "
                                     f"registered; lower the stage's lr and rerun")


_FLOATS = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


def float_chunks(path: Path, chunk_bytes: int = 64 << 20):
    """(name, values) of each floating tensor of a safetensors file, at most `chunk_bytes` at a time,
    read with plain file reads: the pages of a mapped file (safetensors' `safe_open`) count in the
    process's resident set as it reads them, a whole model's worth at the end of a run."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header, base = json.loads(f.read(n)), 8 + n
        for name, info in header.items():
            dtype = _FLOATS.get(info.get("dtype")) if name != "__metadata__" else None
            if dtype is None:
                continue
            size = dtype.itemsize
            begin, end = info["data_offsets"]
            for at in range(begin, end, chunk_bytes // size * size):
                f.seek(base + at)
                values = torch.frombuffer(bytearray(f.read(min(chunk_bytes // size * size, end - at))), dtype=dtype)
                yield name, values.float() if size == 1 else values  # float8: no isfinite of its own
