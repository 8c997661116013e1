"""Step metrics go to MLflow asynchronously (issue 12, item 3), and none is dropped: ending the
run waits for every queued batch, against a real MLflow store."""
from mlflow.tracking import MlflowClient

from hindsight.config import PipelineConfig
import tracking


def test_every_queued_metric_is_in_mlflow_once_the_run_ends(tmp_path):
    cfg = PipelineConfig.model_validate({"name": "t", "run_dir": str(tmp_path / "run"),
                                         "tracking": {"tracking_uri": f"sqlite:///{tmp_path}/mlflow.db"}})
    run_id = tracking.start_run(cfg, "rl")
    for step in range(1, 201):
        tracking.log_metrics(cfg, run_id, {"reward/mean": step / 200, "loss": -step}, step)
    assert tracking.metrics._PENDING  # queued, not written inline
    tracking.end_run(cfg, run_id)
    assert not tracking.metrics._PENDING
    history = MlflowClient(cfg.tracking.tracking_uri).get_metric_history(run_id, "reward/mean")
    assert sorted(m.step for m in history) == list(range(1, 201))
    assert MlflowClient(cfg.tracking.tracking_uri).get_run(run_id).info.status == "FINISHED"


def test_metrics_queued_when_the_process_exits_are_written(tmp_path):
    """A process that queues metrics and exits without ending its run (an error, Ctrl-C) still
    writes every one: the writer drains at exit, then the run is ended as FAILED."""
    import subprocess
    import sys
    import textwrap

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    script = textwrap.dedent(f"""
        from hindsight.config import PipelineConfig
        import tracking
        cfg = PipelineConfig.model_validate({{"name": "t", "run_dir": {str(tmp_path / 'run')!r},
                                              "tracking": {{"tracking_uri": {uri!r}}}}})
        run_id = tracking.start_run(cfg, "rl")
        for step in range(1, 101):
            tracking.log_metrics(cfg, run_id, {{"loss": float(step)}}, step)
        print(run_id)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    run_id = out.stdout.strip().splitlines()[-1]
    client = MlflowClient(uri)
    assert sorted(m.step for m in client.get_metric_history(run_id, "loss")) == list(range(1, 101))
    assert client.get_run(run_id).info.status == "FAILED"


def test_mlflow_own_async_logger_is_not_used(tmp_path):
    """MLflow's async logger polls with a 1 s timeout, which every run's end waited for; our
    writer thread replaces it, so MLflow's queue is never started."""
    cfg = PipelineConfig.model_validate({"name": "t", "run_dir": str(tmp_path / "run"),
                                         "tracking": {"tracking_uri": f"sqlite:///{tmp_path}/mlflow.db"}})
    run_id = tracking.start_run(cfg, "rl")
    tracking.log_metrics(cfg, run_id, {"loss": 1.0}, 1)
    tracking.end_run(cfg, run_id)
    assert tracking.client(cfg)._tracking_client.store._async_logging_queue.is_idle()


def test_metrics_logged_within_a_second_leave_in_one_write_and_a_slow_step_writes_at_once(tmp_path, monkeypatch):
    cfg = PipelineConfig.model_validate({"name": "t", "run_dir": str(tmp_path / "run"),
                                         "tracking": {"tracking_uri": f"sqlite:///{tmp_path}/mlflow.db"}})
    run_id = tracking.start_run(cfg, "rl")
    monkeypatch.setattr(tracking.metrics, "BATCH_S", 3600.0)  # every step "within the second"
    for step in range(1, 301):
        tracking.log_metrics(cfg, run_id, {"loss": float(step), "reward/mean": step / 300}, step)
    assert len(tracking.metrics._PENDING) == 1  # the first step went out; 299 wait in the buffer
    monkeypatch.setattr(tracking.metrics, "BATCH_S", 0.0)  # steps slower than the interval: each at once
    tracking.log_metrics(cfg, run_id, {"loss": 301.0}, 301)
    assert len(tracking.metrics._PENDING) == 2 and not tracking.metrics._BUFFER
    tracking.metrics._PENDING[-1][0].result()
    history = MlflowClient(cfg.tracking.tracking_uri).get_metric_history(run_id, "loss")
    assert sorted(m.step for m in history) == list(range(1, 302))  # 600 metrics in one write (MLflow's limit is 1000)
    monkeypatch.setattr(tracking.metrics, "BATCH_S", 3600.0)
    for step in range(302, 1002):  # 1,400 buffered metrics: sent in two writes at the run's end
        tracking.log_metrics(cfg, run_id, {"loss": float(step), "reward/mean": step / 300}, step)
    tracking.end_run(cfg, run_id)
    assert not tracking.metrics._PENDING and not tracking.metrics._BUFFER
    history = MlflowClient(cfg.tracking.tracking_uri).get_metric_history(run_id, "reward/mean")
    assert sorted(m.step for m in history) == [s for s in range(1, 1002) if s != 301]
