"""Rollout workers as Ray actors (issue 16): one or two workers sample the same; a worker
SIGKILLed mid-step loses only the groups it had not written, which are generated again by a
replacement; the run completes, the ledger shows every group trained exactly once, and the
final weights equal an uninterrupted run's."""
import json
import threading

import pytest
import torch

from helpers import stop_when_paused
from hindsight.config import PipelineConfig
from hindsight.coordination.run import RLRun

STEPS = 3



@pytest.fixture(scope="module")
def init(tiny_init):
    import ray

    yield tiny_init
    ray.shutdown()


def _run(work, init, run_dir, multi_turn=None, before_update=None, **workers):
    rollout = {"max_new_tokens": 5, "groups_per_batch": 1}  # per-group leases
    if multi_turn:
        rollout["multi_turn"] = multi_turn
    cfg = PipelineConfig.model_validate({
        "name": "workers", "seed": 1, "run_dir": str(run_dir),
        "data": {"dir": str(work / "data"), "dvc_file": None, "prompts": str(work / "data/prompts.jsonl")},
        "rl": {"steps": STEPS, "prompts_per_step": 4, "samples_per_prompt": 4, "learner": {"lr": 1e-2},
               "save_every": 1, "rollout": rollout,
               "scoring": {"rewards": [{"fn": "helpers:varied"}], "isolation": "inline"},
               "workers": workers}})
    run = RLRun(cfg, init, None)
    metrics = []
    for s in range(STEPS):
        rolled, scored = run.rollout(s)[1], run.score(s)
        if before_update is not None:
            before_update(run, s)
        metrics.append((rolled, scored, run.update(s)))
    return run, metrics


def test_ray_workers_sample_what_in_process_workers_sample(init, tmp_path):
    local, _ = _run(*init, tmp_path / "local")
    ray_two, _ = _run(*init, tmp_path / "ray2", placement="ray", rollout=2)
    for step in range(STEPS):
        assert local.store.read("rollouts", step) == ray_two.store.read("rollouts", step)
    for (k, a), (_, b) in zip(local.policy.state_dict().items(), ray_two.policy.state_dict().items()):
        assert torch.equal(a, b), k
    assert {e.worker for e in ray_two.ledger.read(1).values()} == {"rollout-0", "rollout-1"}
    local.close(), ray_two.close()


def test_a_rollout_worker_killed_mid_step_is_replaced_and_nothing_is_lost(init, tmp_path, monkeypatch):
    reference, _ = _run(*init, tmp_path / "reference")
    # worker rollout-0 takes groups 0 and 2 of each step: it dies right after writing group 0 of step 1
    monkeypatch.setenv("HINDSIGHT_FAULT", f"kill_once:rollout-group0:1:{tmp_path / 'killed'}")
    run, metrics = _run(*init, tmp_path / "killed-run", placement="ray", rollout=2)
    assert (tmp_path / "killed").exists(), "the fault never fired: the test would prove nothing"
    events = [json.loads(line) for line in (run.dir / "workers.jsonl").read_text().splitlines()]
    assert [(e["step"], e["worker"], e["written"], e["reassigned"]) for e in events] == [(1, "rollout-0", [0], [2])]
    assert events[0]["replacement"] == "rollout-2" and ":" in events[0]["host"]  # host:pid of the dead worker
    assert metrics[1][0]["workers/rollout_deaths"] == 1 and metrics[1][0]["workers/rollout_reassigned_groups"] == 1
    for step in range(STEPS):
        entries = run.ledger.read(step)
        assert [e.trained for e in entries.values()] == [1] * 4  # every group trained exactly once
        assert run.store.read("rollouts", step) == reference.store.read("rollouts", step)
    assert run.ledger.read(1)[2].leases == 2  # group 2 was issued twice
    for (k, a), (_, b) in zip(reference.policy.state_dict().items(), run.policy.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-5), k
    reference.close(), run.close()


def test_a_rollout_worker_killed_mid_trajectories_loses_no_turn(init, tmp_path, monkeypatch):
    """Multi-turn: the same kill as above, with a gym-style game answering each model turn."""
    from helpers import short_turn_model

    work, model = init[0], short_turn_model(tmp_path / "turns-init")
    game = {"gym": "helpers:Guess", "max_turns": 3, "max_tokens": 40}
    reference, _ = _run(work, model, tmp_path / "reference", game)
    monkeypatch.setenv("HINDSIGHT_FAULT", f"kill_once:rollout-group0:1:{tmp_path / 'killed'}")
    run, metrics = _run(work, model, tmp_path / "killed-run", game, placement="ray", rollout=2)
    assert (tmp_path / "killed").exists(), "the fault never fired: the test would prove nothing"
    assert metrics[1][0]["workers/rollout_deaths"] == 1
    for step in range(STEPS):
        assert [e.trained for e in run.ledger.read(step).values()] == [1] * 4
        rows = run.store.read("rollouts", step)
        assert rows == reference.store.read("rollouts", step)
    assert any(len(json.loads(r["turns"])) > 1 for r in rows)
    for (k, a), (_, b) in zip(reference.policy.state_dict().items(), run.policy.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-5), k
    reference.close(), run.close()


def test_a_scorer_killed_mid_step_is_replaced_and_nothing_is_lost(init, tmp_path, monkeypatch):
    reference, _ = _run(*init, tmp_path / "reference")
    # scorer-0 scores all four groups of a step: it dies right after writing group 1's score of step 1
    monkeypatch.setenv("HINDSIGHT_FAULT", f"kill_once:score-group1:1:{tmp_path / 'killed'}")
    run, metrics = _run(*init, tmp_path / "killed-run", placement="ray", rollout=1, scorer=1)
    assert (tmp_path / "killed").exists(), "the fault never fired: the test would prove nothing"
    events = [json.loads(line) for line in (run.dir / "workers.jsonl").read_text().splitlines()]
    assert [(e["step"], e["role"], e["written"], e["reassigned"]) for e in events] == [(1, "scorer", [0, 1], [2, 3])]
    assert metrics[1][1][1]["workers/scorer_deaths"] == 1 and metrics[1][1][1]["workers/scorer_reassigned_groups"] == 2
    for step in range(STEPS):
        assert [e.trained for e in run.ledger.read(step).values()] == [1] * 4
        assert run.store.read("scores", step) == reference.store.read("scores", step)
    for (k, a), (_, b) in zip(reference.policy.state_dict().items(), run.policy.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-5), k
    reference.close(), run.close()


@pytest.mark.parametrize("role, point, events", [
    ("rollout", "rollout-group0", [(1, "rollout-0", [0], [2])]),  # rollout-0 leases groups 0 and 2
    ("scorer", "score-group1", [(1, "scorer-0", [0, 1], [2, 3])]),  # scorer-0 scores all four
])
def test_a_stopped_worker_is_replaced_when_its_lease_expires(init, tmp_path, monkeypatch, role, point, events):
    """No wedge (issue 47): a Ray actor SIGSTOPped mid-lease neither dies nor answers; its lease
    (lease_ttl_s + lease_s_per_token x its tokens) expires, it is killed, and what it had not
    written is done by its replacement in the same step."""
    reference, _ = _run(*init, tmp_path / "reference")
    marker = tmp_path / "paused"
    monkeypatch.setenv("HINDSIGHT_FAULT", f"pause:{point}:1:{marker}")
    stop_when_paused(marker)
    run, metrics = _run(*init, tmp_path / "stopped", placement="ray", rollout=1 + (role == "rollout"),
                        scorer=1, lease_ttl_s=5.0, lease_s_per_token=0.0)
    found = [json.loads(line) for line in (run.dir / "workers.jsonl").read_text().splitlines()]
    assert [(e["step"], e["worker"], e["written"], e["reassigned"]) for e in found] == events
    assert [e["why"] for e in found] == ["lease expired"]
    timing = metrics[1][0] if role == "rollout" else metrics[1][1][1]
    print(f"{role}: the step's phase took {timing.get('time/rollout_s', timing.get('time/score_s')):.1f} s "
          f"with a lease of 5 s")  # a figure for the notes; no timed assertion
    for step in range(STEPS):
        assert [e.trained for e in run.ledger.read(step).values()] == [1] * 4  # once each, none lost
        assert run.store.read("rollouts", step) == reference.store.read("rollouts", step)
        assert run.store.read("scores", step) == reference.store.read("scores", step)
    for (k, a), (_, b) in zip(reference.policy.state_dict().items(), run.policy.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-5), k
    reference.close(), run.close()


def test_a_worker_stopped_between_steps_is_replaced_when_it_takes_no_weights(init, tmp_path):
    """No wedge (issue 47): a Ray rollout actor SIGSTOPped while idle holds no lease, but the next
    weights version is delivered to it; with no answer within lease_ttl_s it is killed and replaced
    (the replacement takes the full copy), and the next step samples on the new one as the
    reference does."""
    import os
    import signal

    reference, _ = _run(*init, tmp_path / "reference")
    stopped = []

    def stop(run, step):
        if step == 0:
            stopped.append(int(run.pool.rollout.hosts["rollout-0"].split(":")[1]))
            os.kill(stopped[0], signal.SIGSTOP)

    run, metrics = _run(*init, tmp_path / "stopped", placement="ray", rollout=2, scorer=1, lease_ttl_s=4.0,
                        lease_s_per_token=0.0, before_update=stop)
    found = [json.loads(line) for line in (run.dir / "workers.jsonl").read_text().splitlines()]
    assert [(e["step"], e["worker"], e["written"], e["reassigned"], e["replacement"]) for e in found] \
        == [(0, "rollout-0", [], [], "rollout-2")], found
    assert found[0]["why"] == "no answer to weights version 1 within 4 s" and str(stopped[0]) in found[0]["host"]
    for step in range(STEPS):
        assert [e.trained for e in run.ledger.read(step).values()] == [1] * 4  # once each, none lost
        assert run.store.read("rollouts", step) == reference.store.read("rollouts", step)
    for (k, a), (_, b) in zip(reference.policy.state_dict().items(), run.policy.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-5), k
    print(f"the update that found it stopped took {metrics[0][2].get('time/update_s', float('nan')):.1f} s")
    reference.close(), run.close()


def test_a_worker_added_mid_run_joins_and_the_weights_match_a_fixed_size_run(init, tmp_path):
    """`hindsight scale RUN_DIR --rollout 2` between steps 1 and 2 of a run that started with one."""
    import subprocess
    import sys

    work, path = init
    fixed, _ = _run(work, path, tmp_path / "fixed")
    cfg = fixed.cfg.model_copy(update={"run_dir": str(tmp_path / "grown")})
    cfg.rl.workers.placement = "ray"
    run = RLRun(cfg, path, None)
    for step in range(STEPS):
        if step == 2:
            out = subprocess.run([sys.executable, "-m", "cli", "scale", str(tmp_path / "grown"), "--rollout", "2",
                                  "--wait", "0"], capture_output=True, text=True)
            assert out.returncode == 0, out.stderr
        run.rollout(step), run.score(step), run.update(step)
    workers = [{e.worker for e in run.ledger.read(s).values()} for s in range(STEPS)]
    assert workers == [{"rollout-0"}, {"rollout-0"}, {"rollout-0", "rollout-1"}]
    events = [json.loads(line) for line in (run.dir / "workers.jsonl").read_text().splitlines()]
    assert [e.get("scaled") for e in events] == [[1, 2]]
    for (k, a), (_, b) in zip(fixed.policy.state_dict().items(), run.policy.state_dict().items()):
        assert torch.equal(a, b), k
    fixed.close(), run.close()


def test_a_scale_the_cluster_cannot_place_is_refused_and_the_run_keeps_its_workers(init, tmp_path):
    """`--rollout 64` on this machine's embedded cluster (a CPU or two): refused with what it needs
    against what is free, the run keeps its one worker and goes on; the request's answer is what
    `hindsight scale` prints."""
    import subprocess
    import sys

    from hindsight.coordination.scale import request_scale, scale_outcome

    work, path = init
    cfg = _run(work, path, tmp_path / "unused")[0].cfg.model_copy(update={"run_dir": str(tmp_path / "asked")})
    cfg.rl.workers.placement = "ray"
    run = RLRun(cfg, path, None)
    answer = {}

    def ask():
        answer["cli"] = subprocess.run([sys.executable, "-m", "cli", "scale", str(tmp_path / "asked"), "--rollout",
                                        "64", "--wait", "120"], capture_output=True, text=True)

    asker = threading.Thread(target=ask)
    asker.start()
    while not (run.dir / "scale.json").exists():
        pass
    for step in range(STEPS):
        run.rollout(step), run.score(step), run.update(step)
    asker.join(timeout=150)
    res = answer["cli"]
    assert res.returncode == 1, res.stdout + res.stderr
    assert "error: hindsight scale: refused at step 0: --rollout 64 needs 31.5 more CPUs (0.5 CPU, 0 GPU each), " \
           "but the Ray cluster has" in res.stderr and "kept 1 workers" in res.stderr
    assert [{e.worker for e in run.ledger.read(s).values()} for s in range(STEPS)] == [{"rollout-0"}] * STEPS
    again = request_scale(tmp_path / "asked", 64)  # a new request is answered anew, not from the old answer
    assert scale_outcome(again, wait_s=0) is None
    run.close()


class Probe:
    def __init__(self, actor_id):
        self.id = actor_id

    def where(self):
        return "here"


def test_an_actor_the_cluster_cannot_place_is_dropped_after_the_timeout(tmp_path, caplog):
    """A GPU actor on this CPU-only cluster: dropped with a log line after placement_timeout_s,
    instead of the run waiting for it forever (the reported freeze at step 28)."""
    import logging

    from hindsight.config.rl import WorkersConfig
    from hindsight.coordination.placement import _Pool
    from hindsight.errors import ConfigError

    class GPUPool(_Pool):
        role = "rollout"

    workers = WorkersConfig.model_validate({"placement": "ray", "placement_timeout_s": 2,
                                            "resources": {"rollout": {"num_cpus": 0.1, "num_gpus": 1}}})
    with caplog.at_level(logging.WARNING, logger="hindsight"):
        with pytest.raises(ConfigError, match="no rollout actor could be placed on the Ray cluster within 2 s"):
            GPUPool(Probe, 1, workers, tmp_path, ())
    assert "rollout rollout-0 could not be placed on the Ray cluster within 2 s: dropped" in caplog.text
