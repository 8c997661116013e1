"""The MLflow UI, in headless Chromium, shows hindsight's runs as training runs through the link
hindsight prints (not the GenAI Traces overview it opens by default), and the registry page
shows the aliases set on versions."""
import html
import re
import subprocess

from hindsight.config import PipelineConfig
import tracking
from tests.lookback.test_report import chromium


def _page(url: str, png=None) -> str:
    exe = chromium()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=20000", "--window-size=1400,900"]
    if png is not None:
        subprocess.run([exe, *flags, f"--screenshot={png}", url], capture_output=True, timeout=120)
    dom = subprocess.run([exe, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    text = re.sub(r"<style.*?</style>", " ", dom, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", text)))


def test_the_printed_link_opens_the_runs_table_and_the_registry_shows_aliases(mlflow_server, tmp_path, monkeypatch):
    url, _ = mlflow_server
    monkeypatch.chdir(tmp_path)
    cfg = PipelineConfig.model_validate({"name": "ui", "run_dir": str(tmp_path / "run"),
                                         "tracking": {"tracking_uri": url, "experiment": "hindsight-ui"}})
    run_id = tracking.start_run(cfg, "rl-ui-run")
    tracking.log_metrics(cfg, run_id, {"reward/mean": 0.5}, 1)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    tracking.register(cfg, run_id, tmp_path / "model", "ui-policy", aliases=("best",))
    tracking.end_run(cfg, run_id)
    exp = tracking.experiment_id(tracking.client(cfg), cfg)

    training = _page(tracking.ui_url(url, exp), tmp_path / "runs.png")
    assert "Runs" in training and "rl-ui-run" in training and "Tokens per Trace" not in training
    assert (tmp_path / "runs.png").read_bytes()[:4] == b"\x89PNG"
    default = _page(f"{url}/#/experiments/{exp}")  # the same experiment without the link's parameter
    # what users saw: the GenAI overview, its trace charts or (MLflow's UI, on an experiment with no
    # traces yet, as of December 2026) its first-trace onboarding; never the runs
    genai = "Tokens per Trace" in default or "Send your first trace" in default
    assert genai and "Overview" in default and "rl-ui-run" not in default, default[:2000]

    registry = _page(tracking.ui_url(url, model="ui-policy"), tmp_path / "registry.png")
    assert "Version 1" in registry and re.search(r"@\s*best", registry), registry[:2000]
