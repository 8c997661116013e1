"""hindsight from Python: run a stage, or the whole pipeline, and get its result.

    import hindsight
    result = hindsight.run("rl", "configs/demo.yaml", overrides=["rl.steps=4"])
    result.model, result.version, result.eval_accuracy, result.run_id

The same as `hindsight run STAGE -c CONFIG --set ...`, minus the console summary: the config is
loaded (its folder made importable, as for the command), the stage runs under the run
directory's lock, and its `StageResult` (a list of them for `pipeline`) comes back. Errors are
raised, not printed: a bad config is a `hindsight.errors.ConfigError` naming the file and line.

It finds the Prefect server the commands share, or starts it, as the command does
(`PREFECT_API_URL` wins). Nothing it starts re-imports the caller's `__main__` (the reward
worker and the samplers are fresh interpreters), so a script without an
`if __name__ == "__main__":` guard, or a notebook cell, works.
"""
from __future__ import annotations

import sys
from pathlib import Path


def run(stage: str, config: str | Path, overrides: list[str] | tuple[str, ...] = (), force: bool = False,
        smoke: bool = False):
    """Run `stage` (sft, reward-model, rl, negative-ft or pipeline) of `config`; returns its result."""
    from cli.runtime import env
    from cli.server import ensure_api
    from flows import registry
    from hindsight.config import load_config
    from hindsight.errors import ConfigError
    from hindsight.state.runlock import run_lock

    names = [s.name for s in registry.STAGES]
    if stage not in names:
        raise ConfigError(f"stage {stage!r}: one of {', '.join(names)}")
    env()
    cfg = load_config(config, list(overrides), smoke=smoke)
    ensure_api(lambda msg: print(msg, file=sys.stderr))
    flow = registry.stage(stage).load_flow()
    with run_lock(cfg.root):
        return flow(cfg, force=force)
