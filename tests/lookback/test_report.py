"""The HTML rollout report of a real tiny run: its structure, and a headless Chromium load."""
import math
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
import torch

from hindsight.config import PipelineConfig
from hindsight.data.demo import build_demo_data
from hindsight.lookback.rebuild import tokenizer_for, write_plots, write_step_report
from hindsight.models.tiny import build_tiny_model
from hindsight.lookback.report import token_kl
from hindsight.coordination.run import RLRun
from hindsight.state.store import RolloutStore


def varied_reward(completions, **_):
    return [float(len(c) % 3) for c in completions]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """Two real RL steps (tiny model, KL on so reference log-probs are stored), metrics observed."""
    work = tmp_path_factory.mktemp("report")
    build_demo_data(work / "data", seed=0)
    init = str(build_tiny_model(work / "init", hidden=32, layers=1, heads=2))
    cfg = PipelineConfig.model_validate({
        "name": "tiny", "seed": 0, "run_dir": str(work / "run"),
        "data": {"dir": str(work / "data"), "dvc_file": None, "prompts": str(work / "data/prompts.jsonl")},
        "rl": {"steps": 2, "prompts_per_step": 3, "samples_per_prompt": 4, "save_every": 1,
               "kl": {"coef": 0.05}, "rollout": {"max_new_tokens": 5},
               "scoring": {"isolation": "inline", "rewards": [{"fn": "test_report:varied_reward"}]}}})
    run = RLRun(cfg, init, None)
    for step in range(2):
        metrics = {**run.rollout(step)[1], **run.score(step)[1], **run.update(step)}
        run.observe(step + 1, {k: v for k, v in metrics.items() if isinstance(v, (int, float))})
    run.close()
    rl_dir = cfg.root / "rl"
    return rl_dir, write_step_report(rl_dir, 2, tokenizer_for(rl_dir), "tiny", max_groups=3)


class Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tokens, self.rewards, self.advantages, self.tags, self._in = [], [], [], set(), None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.add(tag)
        cls = a.get("class", "")
        if tag == "span" and cls == "tok":
            self.tokens.append(a)
        elif tag == "td" and "reward" in cls.split():
            self.rewards.append(a)
        elif tag == "td" and "advantage" in cls.split():
            self._in = "adv"
        for key in ("src", "href"):
            assert not (a.get(key) or "").startswith(("http:", "https:", "//")), f"external {key}: {a[key]}"

    def handle_data(self, data):
        if self._in == "adv":
            self.advantages.append(float(data))
            self._in = None


def test_report_has_one_span_per_token_with_its_logprob_and_reward_cells(tiny_run):
    rl_dir, path = tiny_run
    page = Collect()
    page.feed(path.read_text())
    store = RolloutStore(rl_dir)
    rows, scores = store.read("rollouts", 1), store.read("scores", 1)
    advantages = {a["index"]: a["advantage"] for a in store.read("advantages", 1)}
    assert len(rows) == 12  # 3 groups x 4, all shown
    assert len(page.tokens) == sum(len(r["completion_ids"]) for r in rows)
    logprobs = [lp for r in rows for lp in r["logprobs"]]
    refs = [lp for s in scores for lp in s["ref_logprobs"]]
    for span, lp, ref in zip(page.tokens, logprobs, refs):
        assert float(span["data-logprob"]) == pytest.approx(lp, abs=1e-4)
        assert float(span["data-ref-logprob"]) == pytest.approx(ref, abs=1e-4)
        assert float(span["data-kl"]) == pytest.approx(token_kl(lp, ref), abs=1e-4)
        assert f"logprob {lp:.3f}" in span["title"] and "KL" in span["title"]
    assert [float(c["data-reward"]) for c in page.rewards] == pytest.approx([s["reward"] for s in scores])
    assert page.advantages == pytest.approx([advantages[r["index"]] for r in rows], abs=1e-3)
    assert "script" not in page.tags  # self-contained and inert


def test_token_kl_is_k3():
    assert token_kl(-1.0, -1.0) == 0.0
    assert token_kl(-0.5, -1.5) == pytest.approx(math.exp(-1.0) + 1.0 - 1.0)


def test_plots_are_pngs(tiny_run):
    rl_dir, _ = tiny_run
    for p in write_plots(rl_dir, 2):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 2000


def chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: .ci/run installs Debian's chromium package")
        pytest.skip("chromium not installed (apt-get install chromium); CI installs it")
    return exe


def load_in_chromium(html_path, out_png):
    """Screenshot the page, then dump its DOM; returns (console lines, DOM)."""
    exe = chromium()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0"]
    shot = subprocess.run([exe, *flags, f"--screenshot={out_png}", "--window-size=1200,1600", html_path.as_uri()],
                          capture_output=True, text=True, timeout=120)
    dom = subprocess.run([exe, *flags, "--dump-dom", html_path.as_uri()], capture_output=True, text=True, timeout=120)
    console = [ln for ln in (shot.stderr + dom.stderr).splitlines() if ":CONSOLE" in ln]
    return console, dom.stdout


def test_report_loads_in_headless_chromium_without_console_errors(tiny_run, tmp_path):
    rl_dir, path = tiny_run
    console, dom = load_in_chromium(path, tmp_path / "report.png")
    assert console == []
    assert (tmp_path / "report.png").read_bytes()[:4] == b"\x89PNG"
    n_tokens = sum(len(r["completion_ids"]) for r in RolloutStore(rl_dir).read("rollouts", 1))
    assert len(re.findall(r'<span class="tok"', dom)) == n_tokens


def test_the_chromium_check_does_see_console_errors(tmp_path):
    """The check above could not fail if console messages never reached us: show they do."""
    broken = tmp_path / "broken.html"
    broken.write_text("<html><body><script>console.error('boom'); missing();</script></body></html>")
    console, _ = load_in_chromium(broken, tmp_path / "broken.png")
    assert any("boom" in ln for ln in console) and any("missing is not defined" in ln for ln in console)


def test_lower_lr_alert_lowers_the_rate_and_it_survives_resume(tiny_run, tmp_path):
    rl_dir, _ = tiny_run
    shutil.copytree(rl_dir.parent, tmp_path / "run")
    cfg = PipelineConfig.model_validate({
        "name": "tiny", "run_dir": str(tmp_path / "run"),
        "data": {"dir": str(rl_dir.parents[1] / "data"), "dvc_file": None,
                 "prompts": str(rl_dir.parents[1] / "data/prompts.jsonl")},
        "rl": {"steps": 3, "prompts_per_step": 3, "samples_per_prompt": 4,
               "kl": {"coef": 0.05}, "rollout": {"max_new_tokens": 5},
               "scoring": {"isolation": "inline", "rewards": [{"fn": "test_report:varied_reward"}]},
               "alerts": [{"rule": "kl_high", "threshold": 0.5, "action": "lower_lr", "factor": 0.5}]}})
    init = str(rl_dir.parents[1] / "init")
    run = RLRun(cfg, init, None)
    assert run.start_step == 2 and len(run.monitor.history) == 2  # history reloaded from metrics.jsonl
    fired = run.observe(3, {"policy/kl": 0.9})
    assert [a.rule for a in fired] == ["kl_high"]
    assert run.learner.optimizer.param_groups[0]["lr"] == pytest.approx(5e-5)
    assert '"rule": "kl_high"' in (run.dir / "alerts.jsonl").read_text()
    run.checkpoint(3)
    run.close()
    resumed = RLRun(cfg, init, None)
    assert resumed.start_step == 3 and resumed.learner.optimizer.param_groups[0]["lr"] == pytest.approx(5e-5)
    resumed.close()


def test_stop_checkpoints_finite_weights_only(tiny_run, tmp_path):
    from flows.rl import _checkpoint_for_resume

    rl_dir, _ = tiny_run
    shutil.copytree(rl_dir.parent, tmp_path / "run")
    cfg = PipelineConfig.model_validate({
        "name": "tiny", "run_dir": str(tmp_path / "run"),
        "data": {"dir": str(rl_dir.parents[1] / "data"), "dvc_file": None,
                 "prompts": str(rl_dir.parents[1] / "data/prompts.jsonl")},
        "rl": {"steps": 4, "prompts_per_step": 3, "samples_per_prompt": 4,
               "kl": {"coef": 0.05}, "rollout": {"max_new_tokens": 5},
               "scoring": {"isolation": "inline", "rewards": [{"fn": "test_report:varied_reward"}]}}})
    run = RLRun(cfg, str(rl_dir.parents[1] / "init"), None)
    assert _checkpoint_for_resume(run, 3) == "A checkpoint was saved at step 3" and run.ckpt.latest_step() == 3
    with torch.no_grad():
        next(run.policy.parameters())[0, 0] = float("nan")  # what a NaN loss's update leaves behind
    msg = _checkpoint_for_resume(run, 4)
    assert "not finite" in msg and "step 3" in msg and run.ckpt.latest_step() == 3
    run.close()
