"""Trajectories as MLflow traces, linked to the stage's run: its page's Traces tab shows them.

The records come from `hindsight.lookback.traces` (plain JSON). Here they become MLflow
`Trace`s and are written by the metrics writer thread, never on the step's path: a step hands
over the folder and step number, and the thread reads the stored shards, builds the records
and writes them in one batch (one `start_trace` per trace and one `log_spans` for the batch).

Writes go through MLflow's tracing client directly, not its exporter: the exporter logs a
failed write and drops it, and hindsight spools every write the server did not take. A batch
that meets an outage is spooled as its records (`op: traces`) and `hindsight sync` replays it.
A trace's id is derived from its run, step and index, so a replay that repeats a write
replaces the trace instead of adding a second one.
"""
from __future__ import annotations

from pathlib import Path

from hindsight.config import PipelineConfig
from hindsight.lookback.traces import eval_records, redact, secret_values, step_records
from tracking.metrics import submit_write
from tracking.spool import OUTAGE, Spool, unreachable
from tracking.trace_send import send_records
from tracking.store import client, tracking_uri

_EXPERIMENT: dict[tuple[str, str], str] = {}  # (uri, run id) -> its experiment


def log_step_traces(cfg: PipelineConfig, run_id: str, rl_dir: Path, step: int, seed_of) -> None:
    """Queue the traces of RL step `step` (1-based): read from the store on the writer thread."""
    budget = cfg.lookback.traces_per_step
    if budget <= 0:
        return

    def records() -> list[dict]:
        from hindsight.state.store import RolloutStore

        store, shard = RolloutStore(rl_dir), step - 1
        if not (store.has("rollouts", shard) and store.has("scores", shard)):
            return []
        adv = ({a["index"]: a["advantage"] for a in store.read("advantages", shard)}
               if store.has("advantages", shard) else {})
        report = f"reports/step-{step:06d}.html (or: hindsight report {run_id} --step {step})"
        return step_records(store.read("rollouts", shard), store.read("scores", shard), adv, step, run_id, seed_of,
                            budget, report)

    submit_write(lambda: write_records(cfg, run_id, records()))


def log_eval_traces(cfg: PipelineConfig, run_id: str, answers: list[dict], step: int) -> None:
    """Queue the traces of evaluation's greedy answers at `step`."""
    if cfg.lookback.eval_traces <= 0 or not answers:
        return
    submit_write(lambda: write_records(cfg, run_id, eval_records(answers, step, run_id, cfg.lookback.eval_traces)))


def write_records(cfg: PipelineConfig, run_id: str, records: list[dict]) -> int:
    """Write records as traces of `run_id`; spooled instead while the server is unreachable."""
    if not records:
        return 0
    records = redact(records, secret_values())
    uri, spool = tracking_uri(cfg), Spool(cfg.root)
    if OUTAGE.offline(uri):
        spool.add("traces", uri, run_id, records=records)
        return 0
    try:
        return send_records(uri, run_id, records, _experiment(cfg, run_id))
    except Exception as exc:
        if not unreachable(exc):
            raise
        OUTAGE.went_down(uri, spool, exc)
        spool.add("traces", uri, run_id, records=records)
        return 0


def _experiment(cfg: PipelineConfig, run_id: str) -> str:
    key = (tracking_uri(cfg), run_id)
    if key not in _EXPERIMENT:
        _EXPERIMENT[key] = client(cfg).get_run(run_id).info.experiment_id
    return _EXPERIMENT[key]
