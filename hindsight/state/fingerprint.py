"""The RL run's fingerprint: everything that determines what the run stores, written to
`rl/fingerprint.json` before its first shard, and compared on every resume.

    sampling   what the rollout shards hold (prompts, seed, group size, engine, temperature)
    algorithm  the algorithm itself
    scoring    what the score shards hold (rewards with their arguments and source, the
               reward model, the KL settings)
    training   how the learner turns them into weights: the whole `rl.learner` block (lr,
               clipping, loss aggregation, batching, the learner group), the algorithm's own
               block and the importance correction, and `rl.forward` (the worker's and the
               scorer's forward budgets)

A resume refuses a sampling or algorithm change (the stored rollouts would be trained as if
they fit), re-scores the stored rollouts after a scoring change (the look-back the project is
named for), and applies a training change from the resume step on, recording it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hindsight.errors import CheckpointError
from hindsight.fsutil import file_sha256

SECTIONS = ("sampling", "algorithm", "scoring", "training")


def run_fingerprint(cfg, init_path: str, rm_path: str | None, reward_hash, engines: dict) -> dict[str, dict]:
    """`reward_hash(spec)`: the reward module's source hash (hindsight.stage.reward_source_hash);
    `engines`: the rollout engine registry, whose blocks are left out but for the chosen engine's
    settings that change what it samples."""
    rl, d = cfg.rl, cfg.data
    dumped = rl.model_dump(mode="json", by_alias=True)
    rollout = sampling_settings(dumped["rollout"], rl.rollout.backend, engines)
    return {
        "sampling": {"init": init_path, "prompts": d.prompts, "prompts_sha256": file_sha256(d.prompts),
                     "split": d.split, "columns": d.columns_for("prompts"), "prompt_format": d.prompt_format,
                     "system_prompt": d.system_prompt, "seed": cfg.seed,
                     "samples_per_prompt": rl.samples_per_prompt, "prompts_per_step": rl.prompts_per_step,
                     "dynamic_sampling": dumped["dynamic_sampling"], "replay": dumped["replay"],
                     "rollout": rollout, "max_staleness": rl.async_.max_staleness},
        "algorithm": {"algorithm": rl.algorithm},
        "scoring": {"rewards": [{**r, "source": reward_hash(r["fn"])} for r in dumped["scoring"]["rewards"]],
                    "reward_model": rm_path if rl.scoring.reward_model_weight > 0 else None,
                    "reward_model_weight": rl.scoring.reward_model_weight, "reward_fallback": rl.scoring.fallback,
                    "kl": dumped["kl"]},
        # the loss's block is in the learner's dump, under the loss's name (grpo is a loss and an algorithm)
        "training": {**dumped["learner"], f"algorithm.{rl.algorithm}": dumped.get(rl.algorithm),
                     "forward": dumped["forward"]},
    }


def sampling_settings(rollout: dict, backend: str, engines: dict) -> dict:
    """The rollout section as far as it decides what is sampled: no engine's block but the chosen
    one's, and of that only what its engine says changes a sampled token."""
    out = {k: v for k, v in rollout.items() if k not in engines}
    if isinstance(rollout.get(backend), dict):
        kept = {k: v for k, v in rollout[backend].items() if k not in engines[backend].not_sampling}
        if kept:
            out[backend] = kept
    return out


@dataclass
class Changes:
    """What differs between the stored fingerprint and the config, by section, as
    `key: (stored, config)`."""
    by_section: dict[str, dict[str, tuple]] = field(default_factory=dict)

    def keys(self, *sections: str) -> list[str]:
        return [k for s in sections for k in self.by_section.get(s, {})]

    def describe(self, *sections: str) -> str:
        return ", ".join(f"{k}: stored {old!r}, config {new!r}" for s in sections
                         for k, (old, new) in self.by_section.get(s, {}).items())


def _flat(value, prefix: str = "") -> dict:
    """Nested settings as dotted keys (`rewards.0.args.value`), so a diff names the leaf."""
    if not isinstance(value, (dict, list)) or not value:
        return {prefix: value}
    items = value.items() if isinstance(value, dict) else enumerate(value)
    out = {}
    for k, v in items:
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def compare(stored: dict, current: dict) -> Changes:
    out = Changes()
    for section in SECTIONS:
        old, new = _flat(stored.get(section, {})), _flat(current.get(section, {}))
        diff = {k: (old.get(k), new.get(k)) for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)}
        if diff:
            out.by_section[section] = diff
    return out


def check_resume(changes: Changes, run_dir: Path, start: int, steps: int) -> None:
    """Refuse what a resume cannot honour: a sampling or algorithm change, and any change to a
    run that has finished (training it 0 steps would register its old weights as new)."""
    refused = changes.keys("sampling", "algorithm")
    if refused:
        raise CheckpointError(f"{run_dir}: cannot resume, the stored state is incompatible "
                              f"({changes.describe('sampling', 'algorithm')}); "
                              f"rerun with --force to move it aside and start over")
    if start >= steps and changes.by_section:
        raise CheckpointError(f"{run_dir}: the run finished at step {start} under other settings "
                              f"({changes.describe(*SECTIONS)}); nothing was trained or registered: rerun with "
                              f"--force to move it aside and train anew, or use another run_dir")



def check_not_finished(run_dir: Path, start: int, steps: int) -> None:
    """The RL stage on a run that has finished (a cache miss: the code or the MLflow store
    changed) would train nothing and register the old weights as a new version: refused."""
    if start >= steps:
        raise CheckpointError(f"{run_dir}: the run already finished at step {start}; nothing to train, so nothing "
                              f"is registered again: rerun with --force to retrain it from its inputs, raise "
                              f"rl.steps to train on, or use another run_dir")
