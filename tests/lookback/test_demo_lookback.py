"""After the README's demo (its config, at half its RL steps and one SFT epoch: the same stages,
metrics, reports and plots, in a third of the time), the MLflow run holds what docs/metrics.md
promises; a stop alert on a real run leaves a resumable checkpoint; reports regenerate and runs
compare from the CLI."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[2]


def hindsight(args, cwd, env):
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


def documented_metrics() -> list[str]:
    """Rows of docs/metrics.md's table logged 'always' (placeholders like <fn> filled for the demo)."""
    rows = re.findall(r"^\| `([^`]+)` \|[^|]+\| always \|$", (ROOT / "docs/metrics.md").read_text(), re.M)
    return [r.replace("<fn>", "exact_answer") for r in rows]


STEPS = 20
SHORTER = ["--set", "sft.epochs=1", "--set", f"rl.steps={STEPS}"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory, prefect_api):
    work = tmp_path_factory.mktemp("demo")
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db",
           "PYTHONPATH": str(ROOT)}
    done = hindsight(["run", "pipeline", "-c", str(ROOT / "configs/demo.yaml"), *SHORTER], work, env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("hindsight")
    runs = {r.data.tags["hindsight.stage"]: r for r in client.search_runs([exp.experiment_id])}
    return work, env, client, runs


def test_demo_rl_run_has_documented_metrics_reports_and_plots(demo):
    _, _, client, runs = demo
    rl = runs["rl"]
    names = documented_metrics()
    assert len(names) >= 20
    missing = [m for m in names if m not in rl.data.metrics]
    assert missing == []
    for m in ("reward/mean", "policy/kl", "policy/entropy", "response_length/p95", "runtime/memory/cpu_peak_mb"):
        assert [x.step for x in client.get_metric_history(rl.info.run_id, m)] == list(range(1, STEPS + 1)), m
    assert [x.step for x in client.get_metric_history(rl.info.run_id, "eval/accuracy")] == [0, 10, 20]
    reports = [f.path for f in client.list_artifacts(rl.info.run_id, "reports")]
    assert {"reports/step-000010.html", "reports/step-000020.html", "reports/versions.html"} <= set(reports)
    plots = {f.path for f in client.list_artifacts(rl.info.run_id, "plots")}
    assert plots == {"plots/reward_curve.png", "plots/reward_hist.png", "plots/length_hist.png"}


def test_versions_report_compares_the_start_point_with_the_registered_policy(demo):
    work, _, client, runs = demo
    local = client.download_artifacts(runs["rl"].info.run_id, "reports/versions.html", str(work / "dl"))
    page = Path(local).read_text()
    assert "demo-policy v1" in page and "init (models:/demo-sft@latest)" in page
    cells = re.findall(r'data-version="([^"]+)" data-correct="([01])"', page)
    assert len(cells) == 2 * 8  # 8 fixed prompts x (start point + one registered version)


def test_report_regenerates_from_the_mlflow_run_id(demo):
    work, env, _, runs = demo
    out = work / "again.html"
    res = hindsight(["report", runs["rl"].info.run_id, "--step", "10", "--out", str(out)], work, env)
    assert res.returncode == 0, res.stderr[-2000:]
    original = (work / "runs/demo/rl/reports/step-000010.html").read_text()
    strip = lambda s: re.sub(r"Generated [^.]+\.", "", s)  # noqa: E731
    assert strip(out.read_text()) == strip(original)
    bad = hindsight(["report", "runs/demo", "--step", "99"], work, env)
    assert bad.returncode == 1 and "step 99 has no stored rollouts" in bad.stderr and "Traceback" not in bad.stderr


def test_compare_prints_final_metrics_and_config_differences(demo):
    work, env, _, runs = demo
    res = hindsight(["compare", runs["sft"].info.run_id, "rl"], work, env)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    acc = next(ln for ln in lines if ln.startswith("eval/accuracy"))
    assert len(acc.split()) == 4  # name, sft, rl, delta
    first = [ln.split()[0] for ln in lines if ln.split() and ln.split()[0] in ("reward/mean", "eval/accuracy")]
    assert first == ["reward/mean", "eval/accuracy"]  # what one reads first, before the bookkeeping
    where = {ln.split()[0]: i for i, ln in enumerate(lines) if ln.split()}
    assert where["eval/accuracy"] < where["policy/kl"] < min(i for k, i in where.items() if k.startswith("runtime/"))
    assert "sft · " in lines[0] and "rl · " in lines[0] and "→" in lines[0]  # columns headed by run name
    assert "config differences (0):" in res.stdout  # the same config: no key differs
    missing = hindsight(["compare", "rl", "no-such-run"], work, env)
    assert missing.returncode == 1 and "run 'no-such-run' not found" in missing.stderr


def test_stop_alert_writes_a_checkpoint_and_the_run_resumes(demo):
    work, env, client, _ = demo
    base = ["-c", str(ROOT / "configs/demo.yaml"), "--set", "run_dir=runs/stop", "--set", "rl.steps=4",
            "--set", "rl.save_every=10", "--set", "rl.eval_every=2"]
    stop = hindsight(["run", "rl", *base, "--set", "rl.alerts=[{rule: kl_high, threshold: 0.0, action: stop}]"],
                     work, env)
    assert stop.returncode == 3, stop.stdout[-2000:] + stop.stderr[-2000:]
    assert "stopped: stage rl: stopped by alert at step 2: kl_high" in stop.stderr
    assert "ALERT step 2: kl_high" in stop.stdout + stop.stderr
    manifest = (work / "runs/stop/rl/checkpoints/manifest.json").read_text()
    assert '"step": 2' in manifest  # written by the stop, not by save_every (10)
    stopped = max(client.search_runs([client.get_experiment_by_name("hindsight").experiment_id],
                                     "tags.`hindsight.stage` = 'rl'"), key=lambda r: r.info.start_time)
    assert stopped.info.status == "KILLED" and "kl_high" in stopped.data.tags["hindsight.stopped"]
    assert "hindsight.alert.kl_high" in stopped.data.tags
    assert [f.path for f in client.list_artifacts(stopped.info.run_id)].count("alerts.jsonl") == 1
    assert str(client.get_model_version_by_alias("demo-policy", "latest").version) == "1"  # nothing registered

    resumed = hindsight(["run", "rl", *base, "--set", "rl.alerts=[]"], work, env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    last = max(client.search_runs([stopped.info.experiment_id], "tags.`hindsight.stage` = 'rl'"),
               key=lambda r: r.info.start_time)
    assert last.data.tags["hindsight.resumed_from_step"] == "2" and last.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(last.info.run_id, "reward/mean")] == [3, 4]
    assert str(client.get_model_version_by_alias("demo-policy", "latest").version) == "2"
