"""A Ray cluster of more than one node (issue 47), on this machine: a head without CPUs for
actors and two raylets of one CPU each, so the two rollout workers land one on each node. Mid-step,
one worker stops after writing its first group and its node is removed (raylet, actors and object
store gone at once); the step finishes on the other node, which samples the group left over. A node
added later takes the worker `hindsight scale` asks for. Every group is trained once and the
weights equal a fixed-size, single-node run's: what is sampled never depends on where. The
learner group of two also runs across two nodes: rank 0 in this process, rank 1 on a raylet of
its own, and trains what one process trains."""
import json
import os
import sys
import threading

import pytest
import torch

from helpers import paused_pid
from hindsight.config import PipelineConfig
from hindsight.coordination.run import RLRun

STEPS = 4


@pytest.fixture
def cluster(monkeypatch):
    import ray
    from ray.cluster_utils import Cluster

    ray.shutdown()  # an embedded cluster another test module started in this process
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # every raylet on loopback
    # the raylets' workers inherit this: they import the tests' reward module (tests/helpers.py)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    yield nodes
    ray.shutdown()
    nodes.shutdown()


@pytest.fixture(scope="module")
def reference(tiny_init, tmp_path_factory):
    """The run both tests are held to: one process, no Ray."""
    work, init = tiny_init
    run = RLRun(PipelineConfig.model_validate(_cfg(work, tmp_path_factory.mktemp("reference"))), init, None)
    for step in range(STEPS):
        run.rollout(step), run.score(step), run.update(step)
    run.close()
    return run


def _cfg(work, run_dir, **workers) -> dict:
    return {"name": "nodes", "seed": 1, "run_dir": str(run_dir),
            "data": {"dir": str(work / "data"), "dvc_file": None, "prompts": str(work / "data/prompts.jsonl")},
            "rl": {"steps": STEPS, "prompts_per_step": 4, "samples_per_prompt": 4, "save_every": 1,
                   "learner": {"lr": 1e-2}, "rollout": {"max_new_tokens": 5, "groups_per_batch": 1},
                   "scoring": {"rewards": [{"fn": "helpers:varied"}], "isolation": "inline"}, "workers": workers}}


def _remove_when_paused(cluster, run, marker, removed: list) -> None:
    """Wait for the paused worker's pid, then remove the node its actor lives on."""
    pid = str(paused_pid(marker))
    # the survivor has no CPU free, so the lost worker's replacement cannot be placed: waiting the
    # start-up's long timeout for it would only slow the test (the outcome is the same)
    run.pool.rollout.placement_s = 10
    host = next(h for h in run.pool.rollout.hosts.values() if h.split(":")[1] == pid)
    node = next(n for n in cluster.worker_nodes if n.node_id == host.split(":")[2])
    cluster.remove_node(node, allow_graceful=False)
    removed.append(host)


def test_a_node_removed_mid_step_then_one_added_loses_nothing(tiny_init, reference, tmp_path, cluster, monkeypatch):
    import ray

    work, init = tiny_init

    cluster.add_node(num_cpus=1)
    cluster.add_node(num_cpus=1)
    marker = tmp_path / "paused"  # group 1 of step 1 is written, then its worker stops: mid-lease
    monkeypatch.setenv("HINDSIGHT_FAULT", f"pause:rollout-group1:1:{marker}")
    # an actor's start-up (a fresh worker process importing torch) took over 10 s on a loaded CI machine
    workers = {"placement": "ray", "ray_address": cluster.address, "rollout": 2, "placement_timeout_s": 60,
               "resources": {"rollout": {"num_cpus": 1}, "scorer": {"num_cpus": 0}}}
    run = RLRun(PipelineConfig.model_validate(_cfg(work, tmp_path / "run", **workers)), init, None)
    nodes_used, removed = [], []
    remover = threading.Thread(target=_remove_when_paused, args=(cluster, run, marker, removed), daemon=True)
    remover.start()
    try:
        for step in range(STEPS):
            if step == 3:  # a fresh node, then a request for a second worker again
                cluster.add_node(num_cpus=1)
                run.pool.rollout.placement_s = 60  # this one is placed: give its start-up the time
                (run.dir / "scale.json").write_text(json.dumps({"rollout": 2}))
            run.rollout(step), run.score(step), run.update(step)
            nodes_used.append({e.worker for e in run.ledger.read(step).values()})
    finally:
        run.close()
    assert removed and len({n["NodeID"] for n in ray.nodes() if n["Alive"]}) == 3  # head, survivor, new node
    events = [json.loads(x) for x in (run.dir / "workers.jsonl").read_text().splitlines()]
    deaths = [e for e in events if "why" in e]
    # the scorer (no CPU of its own) may have been placed on the lost node too: then it died with it
    assert {e["host"].split(":")[2] for e in deaths} == {removed[0].split(":")[2]}, events
    lost = [e for e in deaths if e["role"] == "rollout"]
    assert [(e["step"], e["why"], e["host"]) for e in lost] == [(1, "died", removed[0])], events
    assert lost[0]["written"] == [1] and lost[0]["reassigned"] == [3]  # the group it had not finished
    assert lost[0]["replacement"] is None  # no room left on the survivor: the run went on with one
    assert [e["scaled"] for e in events if "scaled" in e] == [[1, 2]]
    assert len(nodes_used[0]) == 2 and len(nodes_used[2]) == 1 and len(nodes_used[3]) == 2, nodes_used
    for step in range(STEPS):
        assert [e.trained for e in run.ledger.read(step).values()] == [1] * 4, step
        assert run.store.read("rollouts", step) == reference.store.read("rollouts", step), step
    for (k, a), (_, b) in zip(reference.policy.state_dict().items(), run.policy.state_dict().items()):
        assert torch.equal(a, b), k


def test_the_learner_group_across_two_nodes_trains_what_one_process_trains(tiny_init, reference, tmp_path, cluster):
    import ray

    work, init = tiny_init
    cluster.add_node(num_cpus=1)
    cluster.add_node(num_cpus=1)
    # one CPU for the rollout worker, one for learner rank 1, none on the head: two raylets
    workers = {"placement": "ray", "ray_address": cluster.address, "rollout": 1, "placement_timeout_s": 60,
               "resources": {"rollout": {"num_cpus": 1}, "scorer": {"num_cpus": 0}, "learner": {"num_cpus": 1}}}
    cfg = _cfg(work, tmp_path / "run", **workers)
    cfg["rl"]["learner"]["processes"] = 2
    run = RLRun(PipelineConfig.model_validate(cfg), init, None)
    try:
        used = ray.available_resources().get("CPU", 0.0)
        for step in range(STEPS):
            run.rollout(step), run.score(step), run.update(step)
    finally:
        run.close()
    assert used == 0.0  # both worker nodes' CPUs taken: the peer rank is on the other raylet
    for step in range(STEPS):  # the same tokens sampled (log-probs differ by the sums' order)
        ids = [[r["completion_ids"] for r in x.store.read("rollouts", step)] for x in (run, reference)]
        assert ids[0] == ids[1], step
    for (k, a), (_, b) in zip(reference.policy.state_dict().items(), run.policy.state_dict().items()):
        assert torch.allclose(a, b, atol=5e-4), k  # the two ranks sum gradients in another order


def _wait_gone(pid: int, limit_s: float = 60.0) -> None:
    import time

    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        try:
            if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
                return
        except FileNotFoundError:
            return
        time.sleep(0.1)
    raise AssertionError(f"pid {pid} outlived its node by {limit_s:g} s")


def test_the_node_of_a_learner_rank_removed_the_group_is_rebuilt_on_another(tiny_init, reference, tmp_path,
                                                                           cluster):
    """Rank 1's raylet removed between steps 1 and 2 (the process, its node and its object store
    gone at once): step 2's update finds the rank lost, the group is rebuilt in the same attempt
    with rank 1 on the spare raylet, from step 2's checkpoint, and the run ends as one process's."""
    work, init = tiny_init
    for _ in range(3):  # the rollout worker, rank 1, and a spare
        cluster.add_node(num_cpus=1)
    workers = {"placement": "ray", "ray_address": cluster.address, "rollout": 1, "placement_timeout_s": 60,
               "collective_min_s": 10,
               "resources": {"rollout": {"num_cpus": 1}, "scorer": {"num_cpus": 0}, "learner": {"num_cpus": 1}}}
    cfg = _cfg(work, tmp_path / "run", **workers)
    cfg["rl"]["learner"]["processes"] = 2
    run = RLRun(PipelineConfig.model_validate(cfg), init, None)
    removed = []
    try:
        for step in range(STEPS):
            if step == 2:
                rank = run.learner.group.ray.get(run.learner.group.peers[0].pid.remote())
                parent = int(open(f"/proc/{rank}/stat").read().rsplit(")", 1)[1].split()[1])  # its raylet
                node = next(n for n in cluster.worker_nodes if n.all_processes["raylet"][0].process.pid == parent)
                cluster.remove_node(node, allow_graceful=False)
                removed.append(node.node_id)
                _wait_gone(rank)  # a raylet's workers exit a moment after it: the steps are faster
            run.rollout(step), run.score(step), run.update(step)
    finally:
        run.close()
    events = [json.loads(x) for x in (run.dir / "workers.jsonl").read_text().splitlines()]
    rebuilt = [e for e in events if e["role"] == "learner"]
    assert removed and [(e["step"], e["checkpoint"], e["replayed"]) for e in rebuilt] == [(2, 2, [])], events
    for step in range(STEPS):
        assert [e.trained for e in run.ledger.read(step).values()] == [1] * 4, step
        ids = [[r["completion_ids"] for r in x.store.read("rollouts", step)] for x in (run, reference)]
        assert ids[0] == ids[1], step
    for (k, a), (_, b) in zip(reference.policy.state_dict().items(), run.policy.state_dict().items()):
        assert torch.allclose(a, b, atol=5e-4), k
