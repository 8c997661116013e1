"""Async RL (issue 12): step s is sampled with weights version s - k exactly, by a sampler
process, while the learner trains; a run SIGKILLed at any point resumes to the weights an
uninterrupted run ends with, training on the shards it had sampled ahead."""
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hindsight.config import PipelineConfig
from hindsight.coordination.run import RLRun

DRIVER = Path(__file__).with_name("async_driver.py")


def _cfg(work, run_dir, k, steps=8, scoring=None, learner=None, **rl) -> dict:
    return {"name": "async", "seed": 3, "run_dir": str(run_dir),
            "data": {"dir": str(work / "data"), "dvc_file": None, "prompts": str(work / "data/prompts.jsonl")},
            "rl": {"steps": steps, "prompts_per_step": 4, "samples_per_prompt": 4, "learner": {"lr": 1e-2, **(learner or {})},
                   "save_every": 2, "rollout": {"max_new_tokens": 5, "groups_per_batch": 4},
                   "scoring": {"rewards": [{"fn": "helpers:varied"}], "isolation": "inline", **(scoring or {})},
                   "async": {"max_staleness": k}, **rl}}


@pytest.mark.parametrize("k", [1, 2])
def test_every_sample_is_exactly_k_versions_behind(tiny_init, tmp_path, k):
    work, init = tiny_init
    run = RLRun(PipelineConfig.model_validate(_cfg(work, tmp_path / "run", k, steps=6)), init, None)
    try:
        for step in range(6):
            _, metrics = run.rollout(step)
            run.score(step), run.update(step)
            assert metrics["async/staleness"] == step - max(step - k, 0)
        for step in range(6):
            versions = {r["weights_version"] for r in run.store.read("rollouts", step)}
            assert versions == {max(step - k, 0)}, (step, versions)  # exactly s - k, never more or less
            assert [e.trained for e in run.ledger.read(step).values()] == [1] * 4
    finally:
        run.close()
    assert run.pool.sampler.proc.poll() is not None  # closed with the run


def test_a_correction_in_an_async_run_weighs_the_staleness(tiny_init, tmp_path):
    """k = 1 with the correction on: the ratio is anchored on the learner's weights at each step's
    start (1 on the first pass), and the gap to the version s - 1 that sampled is measured and
    corrected: none at step 0 (version 0 is the learner's), some after."""
    work, init = tiny_init
    correction = {"level": "token", "action": "truncate", "clip_min": 0.95, "clip_max": 1.05}
    run = RLRun(PipelineConfig.model_validate(_cfg(work, tmp_path / "run", 1, steps=4,
                                                   learner={"correction": correction})), init, None)
    try:
        gaps = []
        for step in range(4):
            run.rollout(step), run.score(step)
            m = run.update(step)
            assert abs(m["ratio_mean/iter0"] - 1.0) < 1e-5
            gaps.append((m["offpolicy/mismatch_kl_k3"], m["offpolicy/corrected_fraction"]))
        assert gaps[0] == (0.0, 0.0) or gaps[0][0] < 1e-9
        assert all(k3 > 0 and frac > 0 for k3, frac in gaps[2:]), gaps
    finally:
        run.close()


def _drive(cfg_path, init, env=None, kill_after=None):
    """Run the driver; SIGKILL it after `kill_after` seconds if given. Returns its JSON lines
    (and the tail of its stderr as the last line when it failed)."""
    err = open(Path(cfg_path).with_suffix(".stderr"), "w+")
    proc = subprocess.Popen([sys.executable, str(DRIVER), str(cfg_path), init], stdout=subprocess.PIPE,
                            stderr=err, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})},
                            cwd=Path(__file__).parent)
    if kill_after is not None:
        time.sleep(kill_after)
        proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=600)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if proc.returncode > 0:
        err.seek(0)
        lines.append({"stderr": err.read()[-3000:]})
    return lines, proc.returncode


def _final_weights(run_dir: Path) -> dict:
    return load_file(run_dir / "rl" / "checkpoints" / "policy" / "step-000008" / "model.safetensors")


def test_an_async_run_killed_at_random_points_ends_where_an_uninterrupted_one_does(tiny_init, tmp_path):
    work, init = tiny_init
    clean_cfg, cut_cfg = tmp_path / "clean.json", tmp_path / "cut.json"
    clean_cfg.write_text(json.dumps(_cfg(work, tmp_path / "clean", 2)))
    cut_cfg.write_text(json.dumps(_cfg(work, tmp_path / "cut", 2)))
    lines, rc = _drive(clean_cfg, init)
    assert rc == 0 and lines[-1]["step"] == 7

    # a kill at a fixed point first: after training step 4, past the checkpoint at 4. The
    # shards of steps 4 and 5 (sampled with versions 2 and 3, which no checkpoint holds) are
    # stored, and the resume must train on them rather than sample them again.
    _, rc = _drive(cut_cfg, init, {"HINDSIGHT_FAULT": "update:4"})
    assert rc == -signal.SIGKILL
    store = tmp_path / "cut" / "rl" / "rollouts"
    assert (store / "step-000006.parquet").exists()
    rng = random.Random(12)
    for _ in range(2):  # then kills at random moments (start-up included)
        _drive(cut_cfg, init, kill_after=rng.uniform(1.0, 8.0))
    lines, rc = _drive(cut_cfg, init)
    assert rc == 0 and lines[-1]["step"] == 7, lines
    clean, cut = _final_weights(tmp_path / "clean"), _final_weights(tmp_path / "cut")
    for name in clean:
        assert torch.allclose(clean[name], cut[name], atol=1e-5), name
    moved = max((clean[n] - load_file(Path(init) / "model.safetensors")[n]).abs().max().item() for n in clean)
    assert moved > 1e-3  # it trained, so the equality means something


def test_the_resume_trains_on_the_shards_sampled_ahead(tiny_init, tmp_path):
    work, init = tiny_init
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(_cfg(work, tmp_path / "run", 2)))
    _, rc = _drive(cfg, init, {"HINDSIGHT_FAULT": "update:4"})
    assert rc == -signal.SIGKILL
    lines, rc = _drive(cfg, init)
    assert rc == 0 and lines[0] == {"start": 4}
    by_step = {x["step"]: x for x in lines[1:]}
    assert by_step[4].get("rollout/reused") == 1.0 and by_step[5].get("rollout/reused") == 1.0
    from hindsight.state.store import RolloutStore

    store = RolloutStore(tmp_path / "run" / "rl")  # the shard kept the version it was sampled with
    assert {r["weights_version"] for r in store.read("rollouts", 5)} == {3}
