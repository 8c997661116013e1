"""Step metrics go to MLflow asynchronously (issue 12, item 3), and none is dropped: ending the
run waits for every queued batch, against a real MLflow store."""
from mlflow.tracking import MlflowClient

from hindsight.config import PipelineConfig
from tasks import tracking


def test_every_queued_metric_is_in_mlflow_once_the_run_ends(tmp_path):
    cfg = PipelineConfig.model_validate({"name": "t", "run_dir": str(tmp_path / "run"),
                                         "tracking": {"tracking_uri": f"sqlite:///{tmp_path}/mlflow.db"}})
    run_id = tracking.start_run(cfg, "rl")
    for step in range(1, 201):
        tracking.log_metrics(cfg, run_id, {"reward/mean": step / 200, "loss": -step}, step)
    assert tracking._PENDING  # queued, not written inline
    tracking.end_run(cfg, run_id)
    assert not tracking._PENDING
    history = MlflowClient(cfg.tracking.tracking_uri).get_metric_history(run_id, "reward/mean")
    assert sorted(m.step for m in history) == list(range(1, 201))
    assert MlflowClient(cfg.tracking.tracking_uri).get_run(run_id).info.status == "FINISHED"
