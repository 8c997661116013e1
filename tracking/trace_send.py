"""MLflow traces from hindsight's trace records (`hindsight.lookback.traces`), sent through MLflow's
tracing client directly: one `start_trace` per record (its info, tags and feedback) and one
`log_spans` for the batch. Used by the writer (`tracking.traces`) and by a spool's replay."""
from __future__ import annotations

import base64
import hashlib
import json
import time
from datetime import datetime, timezone


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
