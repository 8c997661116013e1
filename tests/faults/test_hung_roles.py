"""No wedge (issue 47): an async sampler that stops (SIGSTOP), hangs while alive, or dies is
replaced within its deadline; the run loses no group, trains none twice, and ends with the
weights an uninterrupted run ends with. Each stall leaves a report with the stacks."""
import json
import os
import signal
import time

import pytest
import torch

from hindsight.config import PipelineConfig
from hindsight.coordination.liveness import RoleStalled
from hindsight.coordination.run import RLRun
from test_async import _cfg

# the phase that waits on a replaced sampler restarts its clock then (Watchdog.progress), but the new
# sampler's start-up on a loaded machine (a fresh interpreter, torch, the model) took over 6 s in CI
SLOW_MACHINE_S = 30.0
LIVENESS = {"heartbeat_s": 0.25, "silent_after_s": 4.0, "lease_ttl_s": 6.0, "lease_s_per_token": 0.0,
            "stall_first_s": 30.0, "stall_min_s": 6.0}


def _train(work, init, run_dir, steps=4, before_step=None, reward="helpers:varied", k=1, isolation="inline",
           **workers):
    """Run `steps` steps (async, k = 1, unless `k` says) in this process; `before_step(run, step)`
    may break a role; a phase the watchdog stops is run again, as the steps task's retry does.
    Returns (the final weights, the run, seconds each rollout took)."""
    cfg = _cfg(work, run_dir, k, steps=steps, workers={**LIVENESS, **workers},
               scoring={"rewards": [{"fn": reward}], "isolation": isolation})
    run = RLRun(PipelineConfig.model_validate(cfg), init, None)
    took, run.score_metrics = [], []  # each step's scoring metrics, for the tests to read
    try:
        for step in range(steps):
            if before_step is not None:
                before_step(run, step)
            t0 = time.monotonic()
            run.rollout(step)
            took.append(time.monotonic() - t0)
            try:
                run.score_metrics.append(run.score(step)[1])
            except RoleStalled:
                run.score_metrics.append(run.score(step)[1])
            run.update(step)
        return {k: v.detach().clone() for k, v in run.policy.state_dict().items()}, run, took
    finally:
        run.close()


@pytest.fixture(scope="module")
def clean(tiny_init, tmp_path_factory):
    work, init = tiny_init
    weights, _, _ = _train(work, init, tmp_path_factory.mktemp("clean") / "run")
    return weights


def _same_run(clean_weights, weights, run):
    """Equal weights, every group trained once, and the training moved the weights."""
    from safetensors.torch import load_file

    for name in clean_weights:
        assert torch.equal(clean_weights[name], weights[name]), name
    init = load_file(f"{run.init_path}/model.safetensors")
    assert max((weights[n] - init[n]).abs().max().item() for n in init) > 1e-3  # so the equality means something
    for step in range(4):
        assert [e.trained for e in run.ledger.read(step).values()] == [1] * 4, step


def test_a_stopped_sampler_is_replaced_and_the_run_ends_as_an_uninterrupted_one(tiny_init, tmp_path, clean):
    work, init = tiny_init

    def stop(run, step):
        """Stop the sampler the moment version 1 is sent and step 2 submitted: steps 1 and/or 2 are in
        flight, due versions 0 and 1, while the learner moves on to 2 (sent into a stopped pipe), so
        the replacement must be given the old versions, not the newest."""
        if step:
            return
        publish = run.rollouts.publish

        def then_stop(policy):
            sent = publish(policy)
            if run.rollouts.version == 1:
                os.kill(run.pool.sampler.proc.pid, signal.SIGSTOP)
            return sent
        run.rollouts.publish = then_stop

    weights, run, took = _train(work, init, tmp_path / "run", before_step=stop, stall_min_s=SLOW_MACHINE_S)
    _same_run(clean, weights, run)
    events = [json.loads(x) for x in (tmp_path / "run/rl/workers.jsonl").read_text().splitlines()]
    assert len(events) == 1 and events[0]["role"] == "sampler" and events[0]["step"] in (1, 2), events
    assert "no heartbeat" in events[0]["why"]
    report = open(events[0]["report"]).read()
    assert "its state was T (stopped" in report and "the coordinator's threads" in report
    assert "AsyncSampler.wait" in report or "in wait" in report  # the stack names where the coordinator waited
    print(f"rollout seconds a step {[round(t, 1) for t in took]}; silent_after_s {LIVENESS['silent_after_s']}")


def test_a_sampler_hung_in_a_reward_is_replaced_with_its_stacks(tiny_init, tmp_path, clean, monkeypatch):
    work, init = tiny_init
    marker = tmp_path / "hang"
    monkeypatch.setenv("HINDSIGHT_TEST_HANG", str(marker))

    def hang(run, step):
        if step == 1:
            marker.touch()  # the sampler's next reward call (scoring step 2, or 1) never returns

    weights, run, took = _train(work, init, tmp_path / "run", before_step=hang, reward="helpers:hangs_once",
                                stall_min_s=SLOW_MACHINE_S)
    _same_run(clean, weights, run)
    events = [json.loads(x) for x in (tmp_path / "run/rl/workers.jsonl").read_text().splitlines()]
    assert len(events) == 1 and "alive but nothing written" in events[0]["why"], events
    report = open(events[0]["report"]).read()
    assert "hangs_once" in report  # the child's own stack, dumped on SIGUSR1, names the stuck reward
    print(f"rollout seconds a step {[round(t, 1) for t in took]}; deadline {LIVENESS['lease_ttl_s']}")


def test_a_dead_sampler_is_replaced_and_past_the_limit_fails_naming_its_log(tiny_init, tmp_path, clean):
    from hindsight.errors import StageError

    work, init = tiny_init
    weights, run, _ = _train(work, init, tmp_path / "run", stall_min_s=SLOW_MACHINE_S,
                             before_step=lambda run, step: step == 1 and run.pool.sampler.proc.kill())
    _same_run(clean, weights, run)
    assert run.pool.replaced == 1
    with pytest.raises(StageError, match=r"the process died \(exit -9\) before finishing step 0 \(its log: "
                                         r".*sampler.log\), and 0 replacements were made already "
                                         r"\(rl.workers.replacements 0\); rerun to resume"):
        _train(work, init, tmp_path / "limit", replacements=0,
               before_step=lambda run, step: step == 0 and run.pool.sampler.proc.kill())


@pytest.fixture(scope="module")
def clean_sync(tiny_init, tmp_path_factory):
    work, init = tiny_init
    weights, _, _ = _train(work, init, tmp_path_factory.mktemp("clean-sync") / "run", k=0)
    return weights


def test_a_score_phase_hung_in_this_process_is_stopped_by_the_watchdog_and_retried(tiny_init, tmp_path,
                                                                                   clean_sync, monkeypatch):
    """Synchronous (k = 0): the reward runs in the stage's own process and hangs there. The
    watchdog stops the phase after its limit, with a report naming the score phase and the
    reward's frame; the retried phase keeps what was scored and the run ends as a clean one."""
    work, init = tiny_init
    clean = clean_sync
    marker = tmp_path / "hang"
    monkeypatch.setenv("HINDSIGHT_TEST_HANG", str(marker))
    weights, run, _ = _train(work, init, tmp_path / "run", k=0, reward="helpers:hangs_once",
                             before_step=lambda run, step: step == 2 and marker.touch())
    _same_run(clean, weights, run)
    reports = sorted((tmp_path / "run/rl/stalls").iterdir())
    assert len(reports) == 1 and reports[0].name.startswith("step-000002-score-"), reports
    text = reports[0].read_text()
    assert text.startswith("score stalled at step 2: no progress for 6 s") and "hangs_once" in text


def test_a_stopped_reward_worker_is_replaced_and_the_run_ends_as_a_clean_one(tiny_init, tmp_path, clean_sync):
    """Synchronous, rewards in their worker process (rl.scoring.isolation: process): the worker is
    stopped between steps 1 and 2. Step 2's reward call hears no heartbeat for silent_after_s, so
    the worker is replaced and the call made again: no score falls back, and the run ends as a clean
    one (the scores are the same inline or in a worker)."""
    work, init = tiny_init
    stopped = []

    def stop(run, step):
        if step == 2:
            stopped.append(run.pool.scoring.reward_worker.pid)
            os.kill(stopped[0], signal.SIGSTOP)

    t0 = time.monotonic()
    weights, run, _ = _train(work, init, tmp_path / "run", k=0, isolation="process", before_step=stop)
    took = time.monotonic() - t0
    _same_run(clean_sync, weights, run)
    assert run.pool.scoring.reward_worker.replaced == 1 and run.pool.scoring.reward_worker.pid != stopped[0]
    assert not any(v for m in run.score_metrics for k, v in m.items() if k.startswith("reward/failures/")), \
        run.score_metrics  # no score fell back
    assert [m["workers/reward_worker_replaced"] for m in run.score_metrics] == [0.0, 0.0, 1.0, 1.0]
    score_s = [m["time/score_s"] for m in run.score_metrics]
    assert score_s[2] >= LIVENESS["silent_after_s"]  # it waited out the silence, not the 60 s reward timeout...
    # ...and no more than that plus a fresh worker's start: a figure for the notes (no timed upper
    # bound in a test; bench/chaos.py's ratio holds recoveries to their bound)
    print(f"4 steps in {took:.1f} s; scoring took {[round(t, 2) for t in score_s]} s, "
          f"silent_after_s {LIVENESS['silent_after_s']}")


def test_a_short_disk_full_is_waited_out_and_the_run_ends_as_a_clean_one(tiny_init, tmp_path, clean_sync,
                                                                         monkeypatch):
    """The disk is full for 2 s from the start of step 2 (every write of the run fails with ENOSPC
    while it lasts): the writes wait for space and go on, and the run ends as a clean one."""
    import threading

    work, init = tiny_init
    full = tmp_path / "full"
    monkeypatch.setenv("HINDSIGHT_FAULT", f"disk_full_while:{full}")

    def fill(run, step):
        if step == 2:
            full.touch()
            threading.Timer(2.0, full.unlink).start()

    t0 = time.monotonic()
    weights, run, _ = _train(work, init, tmp_path / "run", k=0, before_step=fill)
    assert not full.exists() and time.monotonic() - t0 >= 2.0
    _same_run(clean_sync, weights, run)
