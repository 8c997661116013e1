"""Metrics through one writer thread of ours, in order; flushed before a run ends and at exit."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from mlflow.entities import Metric

from hindsight.config import PipelineConfig
from tracking.spool import OUTAGE, Spool, unreachable
from tracking.store import client, tracking_uri
from tracking.writes import write

_PENDING: list = []  # metric writes handed to the writer thread, not yet confirmed written
# One writer thread of our own, not MLflow's async logging: MLflow's logger polls its queue with
# a 1 s timeout, so each run's end (`set_terminated` shuts it down) and the process's exit
# waited up to a second for it, and its buffered mode deadlocks in 3.17. One worker keeps the
# writes in order; the executor's own exit hook drains it, so no metric is lost at exit.
_WRITER: list[ThreadPoolExecutor] = []  # made with the first metric, not at import


def _writer() -> ThreadPoolExecutor:
    if not _WRITER:
        _WRITER.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="hindsight-metrics"))
    return _WRITER[0]


def log_metrics(cfg: PipelineConfig, run_id: str, metrics: dict[str, float], step: int) -> None:
    """Queue the step's metrics: the training loop does not wait for the tracking store.
    `flush_metrics` waits for them; `end_run` calls it, so a run never ends with a metric
    missing, and a write that failed raises there."""
    now = int(time.time() * 1000)
    batch = [Metric(_metric_key(k), float(v), now, step) for k, v in metrics.items() if v is not None]
    if not batch:
        return
    rows = [[m.key, m.value, m.timestamp, m.step] for m in batch]
    op = write(cfg, run_id, "metrics", lambda: _writer().submit(client(cfg).log_batch, run_id, metrics=batch),
                metrics=rows)
    if op is not None:
        _PENDING.append((op, cfg, run_id, rows))


def flush_metrics() -> None:
    """Wait for the queued metric writes; those the server never got (it went down) are spooled."""
    while _PENDING:
        op, cfg, run_id, rows = _PENDING.pop(0)
        try:
            op.result()
        except Exception as exc:
            if not unreachable(exc):
                raise
            uri = tracking_uri(cfg)
            OUTAGE.went_down(uri, Spool(cfg.root), exc)
            Spool(cfg.root).add("metrics", uri, run_id, metrics=rows)


def _metric_key(key: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "_-./ " else "_" for ch in key)
