"""Metrics through one writer thread of ours, in order; flushed before a run ends and at exit."""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from mlflow.entities import Metric

from hindsight.config import PipelineConfig
from tracking.spool import OUTAGE, Spool, unreachable
from tracking.trace_writer import PROCESS
from tracking.store import client, tracking_uri
from tracking.writes import write

_PENDING: list = []  # metric writes handed to the writer thread, not yet confirmed written
# One writer thread of our own, not MLflow's async logging: MLflow's logger polls its queue with
# a 1 s timeout, so each run's end (`set_terminated` shuts it down) and the process's exit
# waited up to a second for it, and its buffered mode deadlocks in 3.17. One worker keeps the
# writes in order; the executor's own exit hook drains it, and what is still buffered then is
# written by the exit's `end_run`, so no metric is lost at exit.
_WRITER: list[ThreadPoolExecutor] = []  # made with the first metric, not at import
BATCH_S = 1.0          # a run's metrics go out at most this often (`log_metrics`)
MAX_PER_BATCH = 1000   # MLflow's limit on the metrics of one log_batch
_BUFFER: dict[tuple[str, str], tuple[PipelineConfig, list]] = {}  # (tracking uri, run id) -> rows not yet sent
_SENT_AT: dict[tuple[str, str], float] = {}
_LOCK = threading.Lock()
_OTHER: list[Future] = []  # other writes on the writer thread (traces), not yet done
log = logging.getLogger("hindsight.tracking")


def _writer() -> ThreadPoolExecutor:
    if not _WRITER:
        _WRITER.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="hindsight-metrics"))
    return _WRITER[0]


def log_metrics(cfg: PipelineConfig, run_id: str, metrics: dict[str, float], step: int) -> None:
    """Queue the step's metrics: the training loop does not wait for the tracking store.
    `flush_metrics` waits for them; `end_run` calls it, so a run never ends with a metric
    missing, and a write that failed raises there.

    A run's metrics go out at most once every `BATCH_S`: those logged sooner wait for the next
    call, and then leave in one `log_batch`. Each write is SQLAlchemy work on a Python thread
    that takes the interpreter from the decode loop (measured: 6.3 ms a step at one step a write,
    3.5 ms at three); a step slower than `BATCH_S` still writes its metrics at once."""
    now = int(time.time() * 1000)
    rows = [[_metric_key(k), float(v), now, step] for k, v in metrics.items() if v is not None]
    if not rows:
        return
    key = (tracking_uri(cfg), run_id)
    with _LOCK:
        _BUFFER.setdefault(key, (cfg, []))[1].extend(rows)
        if time.monotonic() - _SENT_AT.get(key, float("-inf")) >= BATCH_S:
            _send(key)


def _send(key: tuple[str, str]) -> None:
    """Hand a run's buffered metrics to the writer thread (under `_LOCK`)."""
    cfg, rows = _BUFFER.pop(key)
    _SENT_AT[key] = time.monotonic()
    run_id = key[1]
    op = write(cfg, run_id, "metrics", lambda: _submit(_log_batches, client(cfg), run_id, rows), metrics=rows)
    if op is not None:
        _PENDING.append((op, cfg, run_id, rows))


def _submit(fn, *args) -> Future:
    try:
        return _writer().submit(fn, *args)
    except RuntimeError:  # the interpreter is exiting and the executor takes no more work: write here
        done = Future()
        try:
            done.set_result(fn(*args))
        except Exception as exc:
            done.set_exception(exc)
        return done


def submit_write(fn) -> None:
    """Run `fn` on the writer thread, after the writes queued before it (traces use this); it
    spools its own writes during an outage. `flush_metrics` waits for it; a failure that is not
    an outage is said once as a warning: a look-back write never fails the training."""
    while _OTHER and _OTHER[0].done():
        _report(_OTHER.pop(0))
    _OTHER.append(_submit(fn))


def _report(done: Future) -> None:
    try:
        done.result()
    except Exception as exc:
        log.warning("a trace write failed (%s: %s); training goes on without it", type(exc).__name__,
                    (str(exc).splitlines() or [""])[0][:300])


def _log_batches(c, run_id: str, rows: list) -> None:
    for i in range(0, len(rows), MAX_PER_BATCH):
        c.log_batch(run_id, metrics=[Metric(*r) for r in rows[i:i + MAX_PER_BATCH]])


def flush_metrics() -> None:
    """Send what is buffered and wait for the queued metric writes; those the server never got
    (it went down) are spooled."""
    with _LOCK:
        for key in list(_BUFFER):
            _send(key)
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
    while _OTHER:
        _report(_OTHER.pop(0))
    PROCESS.flush()  # the trace writer's jobs, sent before this


def _metric_key(key: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "_-./ " else "_" for ch in key)
