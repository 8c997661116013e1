"""Trajectories as MLflow traces, linked to the stage's run: its page's Traces tab shows them.

The records come from `hindsight.lookback.traces` (plain JSON). A step hands the trace writer
(`tracking.trace_writer`, a process of its own) the step number and where its shards are, and
goes on; the writer reads the shards, builds the records and writes them in one batch (one
`start_trace` per trace and one `log_spans` for the batch, `tracking.trace_send`). Without that
process, the same work runs on the tracking writer thread (`write_records`).

Writes go through MLflow's tracing client directly, not its exporter: the exporter logs a
failed write and drops it, and hindsight spools every write the server did not take. A batch
that meets an outage is spooled as its records (`op: traces`) and `hindsight sync` replays it.
A trace's id is derived from its run, step and index, so a replay that repeats a write
replaces the trace instead of adding a second one.
"""
from __future__ import annotations

from pathlib import Path

from hindsight.config import PipelineConfig
from hindsight.lookback.traces import redact, secret_values
from tracking.metrics import submit_write
from tracking.spool import OUTAGE, Spool, unreachable
from tracking.trace_send import send_records
from tracking.trace_writer import PROCESS, records_of
from tracking.store import client, tracking_uri

_EXPERIMENT: dict[tuple[str, str], str] = {}  # (uri, run id) -> its experiment


def log_step_traces(cfg: PipelineConfig, run_id: str, rl_dir: Path, step: int) -> None:
    """Queue the traces of RL step `step` (1-based), read from the store by the trace writer."""
    if cfg.lookback.traces_per_step > 0:
        _queue(cfg, run_id, {"kind": "step", "rl_dir": str(rl_dir), "step": step, "seed": cfg.seed,
                             "budget": cfg.lookback.traces_per_step})


def log_eval_traces(cfg: PipelineConfig, run_id: str, answers: list[dict], step: int) -> None:
    """Queue the traces of evaluation's greedy answers at `step`."""
    if cfg.lookback.eval_traces > 0 and answers:
        _queue(cfg, run_id, {"kind": "eval", "answers": answers, "step": step, "budget": cfg.lookback.eval_traces})


def _queue(cfg: PipelineConfig, run_id: str, job: dict) -> None:
    """To the trace writer's process; on the tracking writer thread when it has none."""
    job = {**job, "uri": tracking_uri(cfg), "root": str(cfg.root), "run_id": run_id}
    if not PROCESS.send(job):
        submit_write(lambda: write_records(cfg, run_id, records_of(job)))


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
