"""MLflow, and only here: the tracking store (`store`), runs (`runs`), metrics through one writer
thread (`metrics`), the model registry (`registry`), writes that spool during an outage
(`writes`, `spool`) and the look-back that reads MLflow (`lookback`).

The flows and tasks call it as `tracking.X`; the names below are that surface.
"""
from tracking.metrics import flush_metrics, log_metrics
from tracking.registry import SPOOLED, base_reference, register, resolve_model, withdraw
from tracking.runs import (end_orphaned_runs, end_run, git_commit, log_artifact, log_context, log_decoding, log_json,
                           name_registered, set_tags, stage_run, start_run, sweep_parent_run)
from tracking.traces import log_eval_traces, log_step_traces
from tracking.store import EXPERIMENT_KIND, client, client_for, experiment_id, store_id, tracking_uri, ui_url
from tracking.writes import sync_spool

__all__ = ["EXPERIMENT_KIND", "SPOOLED", "base_reference", "client", "client_for", "end_orphaned_runs", "end_run",
           "experiment_id", "flush_metrics", "git_commit", "log_artifact", "log_context", "log_decoding", "log_json",
           "log_eval_traces", "log_metrics", "log_step_traces", "name_registered", "register", "resolve_model",
           "set_tags", "stage_run", "start_run", "store_id", "sweep_parent_run", "sync_spool", "tracking_uri", "ui_url",
           "withdraw"]
