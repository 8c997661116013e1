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

import base64
import hashlib
import json
import logging
import time
from datetime import datetime, timezone
from pathlib import Path

from hindsight.config import PipelineConfig
from hindsight.lookback.traces import eval_records, redact, secret_values, step_records
from tracking.metrics import submit_write
from tracking.spool import OUTAGE, Spool, unreachable
from tracking.store import client, tracking_uri

log = logging.getLogger("hindsight.tracking")
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


def send_records(uri: str, run_id: str, records: list[dict], experiment_id: str) -> int:
    """One `start_trace` per record (its info, tags and feedback) and one `log_spans` for all."""
    from mlflow.tracing.client import TracingClient

    tc = TracingClient(uri)
    traces = [to_trace(r, run_id, experiment_id) for r in records]
    for t in traces:
        tc.start_trace(t.info)
    tc.log_spans(experiment_id, [s for t in traces for s in t.data.spans])
    return len(traces)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def to_trace(record: dict, run_id: str, experiment_id: str):
    """An MLflow `Trace` from a record: a root span and its children, finished, with feedback."""
    from mlflow.entities import AssessmentSource, Feedback, Trace

    tid = record["id"]
    # MLflow's own convention: the trace id is `tr-` + the OpenTelemetry trace id in hex (a server
    # taking spans over OTLP derives it that way, so any other id leaves the spans unfound)
    otel_trace, now = _b64(bytes.fromhex(tid[3:])), time.time_ns()
    root_id = hashlib.sha256(tid.encode()).digest()[:8]

    def span(i: int, name: str, kind: str, parent: bytes | None, inputs, outputs, attributes, error=None) -> dict:
        sid = root_id if parent is None else hashlib.sha256(f"{tid}/{i}".encode()).digest()[:8]
        attrs = {"mlflow.traceRequestId": json.dumps(tid), "mlflow.spanType": json.dumps(kind),
                 "mlflow.spanInputs": json.dumps(inputs, default=str),
                 "mlflow.spanOutputs": json.dumps(outputs, default=str),
                 **{k: json.dumps(v, default=str) for k, v in attributes.items()}}
        status = {"code": "STATUS_CODE_ERROR", "message": str(error)[:500]} if error else \
            {"code": "STATUS_CODE_OK", "message": ""}
        return {"trace_id": otel_trace, "span_id": _b64(sid), "parent_span_id": _b64(parent) if parent else None,
                "name": name, "start_time_unix_nano": now + i, "end_time_unix_nano": now + i + 1, "events": [],
                "status": status, "attributes": attrs, "links": []}

    spans = [span(0, record["name"], "CHAIN", None, record["inputs"], record["outputs"], record["attributes"])]
    spans += [span(i, s["name"], s["type"], root_id, s["inputs"], s["outputs"], s["attributes"], s.get("error"))
              for i, s in enumerate(record["spans"], start=1)]
    preview = lambda d: json.dumps(d, default=str)[:1000]  # noqa: E731
    trace = Trace.from_dict({
        "info": {"trace_id": tid, "request_time": datetime.fromtimestamp(now / 1e9, timezone.utc).isoformat(),
                 "trace_location": {"type": "MLFLOW_EXPERIMENT", "mlflow_experiment": {"experiment_id": experiment_id}},
                 "state": "OK", "execution_duration_ms": 0,
                 "trace_metadata": {"mlflow.sourceRun": run_id, "mlflow.trace_schema.version": "3",
                                    "mlflow.traceInputs": preview(record["inputs"]),
                                    "mlflow.traceOutputs": preview(record["outputs"])},
                 "tags": {"mlflow.traceName": record["name"], **record["tags"]},
                 "request_preview": preview(record["inputs"]), "response_preview": preview(record["outputs"])},
        "data": {"spans": spans}})
    source = AssessmentSource(source_type="CODE", source_id="hindsight")
    trace.info.assessments = [Feedback(name=k, value=v, source=source, trace_id=tid)
                              for k, v in record["feedback"].items()]
    return trace
