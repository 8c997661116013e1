"""Reports and plots rebuilt from what an RL run stored: any past step can be looked at again.

Everything here reads the run directory (`<run_dir>/rl`): rollout, score and advantage
shards, `metrics.jsonl` and the checkpoints' tokenizer. The training loop calls the same
functions as `hindsight report`, so a regenerated report is the report the run wrote.
"""
from __future__ import annotations

from pathlib import Path

from hindsight.errors import CheckpointError
from hindsight.fsutil import atomic_write_bytes, read_json
from hindsight.lookback.history import MetricsLog
from hindsight.lookback.plots import write_run_plots
from hindsight.lookback.report import render_step_report
from hindsight.state.checkpoint import CheckpointManager
from hindsight.state.rundir import RLDir
from hindsight.state.store import RolloutStore


def rl_dir_of(path: str | Path) -> Path:
    """Accept a run directory (runs/NAME) or its rl/ folder."""
    path = RLDir.find(path).path
    if not (path / "rollouts").is_dir():
        raise CheckpointError(f"{path}: no stored rollouts here (expected a run directory such as runs/demo)")
    return path


def tokenizer_for(rl_dir: Path):
    """The tokenizer saved with the newest checkpoint, else the one the run started from."""
    from hindsight.models.load import load_tokenizer

    ckpt = CheckpointManager(RLDir(rl_dir).checkpoints)
    step = ckpt.latest_step()
    if step:
        return load_tokenizer(str(ckpt.policy_dir(step)))
    init = (read_json(RLDir(rl_dir).fingerprint, default={}) or {}).get("sampling", {}).get("init")
    if not init:
        raise CheckpointError(f"{rl_dir}: no checkpoint yet, so no tokenizer to decode the stored tokens with")
    return load_tokenizer(init)


def step_report_html(rl_dir: Path, step: int, tok, run_name: str, max_groups: int = 4) -> str:
    """Report for RL step `step` (1-based as in MLflow; its rollouts are shard step - 1)."""
    store = RolloutStore(rl_dir)
    shard = step - 1
    if not (store.has("rollouts", shard) and store.has("scores", shard)):
        have = [s + 1 for s in store.steps("scores")]
        span = f"{have[0]}..{have[-1]}" if have else "none"
        raise CheckpointError(f"{rl_dir}: step {step} has no stored rollouts and scores (stored steps: {span})")
    rows, scores = store.read("rollouts", shard), store.read("scores", shard)
    advantages = {a["index"]: a["advantage"] for a in store.read("advantages", shard)} \
        if store.has("advantages", shard) else {}
    paths = RLDir(rl_dir)
    metrics = next((h for h in MetricsLog(paths.metrics).read() if h["step"] == step), {})
    estimator = (read_json(paths.config, default={}) or {}).get("kl", {}).get("estimator", "k3")
    return render_step_report(run_name, step, rows, scores, advantages, metrics,
                              lambda i: tok.decode([i]), max_groups, estimator)


def owns(rl_dir: Path, run_id: str) -> bool:
    """Whether the RL folder was written by MLflow run `run_id` (a tag alone can point anywhere):
    its `mlflow_run_ids` lists the runs that wrote it, one per line."""
    try:
        return run_id in RLDir(rl_dir).run_ids.read_text().split()
    except OSError:
        return False


def write_step_report(rl_dir: Path, step: int, tok, run_name: str, max_groups: int = 4,
                      out: Path | None = None) -> Path:
    out = out or RLDir(rl_dir).report(step)
    atomic_write_bytes(out, step_report_html(rl_dir, step, tok, run_name, max_groups).encode("utf-8"))
    return out


def write_plots(rl_dir: Path, step: int) -> list[Path]:
    """Curves up to now, and the reward and length distributions at `step`."""
    store = RolloutStore(rl_dir)
    rows, scores = store.read("rollouts", step - 1), store.read("scores", step - 1)
    history = MetricsLog(RLDir(rl_dir).metrics).read()
    return write_run_plots(RLDir(rl_dir).plots, history, [s["reward"] for s in scores],
                           [len(r["completion_ids"]) for r in rows], step)
