"""Rollout workers (issue 16): groups are seeded each on their own, so the number of workers
never changes what is sampled; the ledger records every group trained exactly once; a step
cut short resumes from the groups already sealed."""
import pytest

from hindsight.errors import CheckpointError
import torch

from hindsight.config import PipelineConfig
from hindsight.coordination.run import RLRun



@pytest.fixture(scope="module")
def init(tiny_init):
    return tiny_init


def _cfg(work, run_dir, **rl):
    return PipelineConfig.model_validate({
        "name": "roles", "seed": 3, "run_dir": str(run_dir),
        "data": {"dir": str(work / "data"), "dvc_file": None, "prompts": str(work / "data/prompts.jsonl")},
        "rl": {"steps": 3, "prompts_per_step": 5, "samples_per_prompt": 4, "learner": {"lr": 1e-2},
               "scoring": {"isolation": "inline", "rewards": [{"fn": "helpers:varied"}]},
               "save_every": 1, "rollout": {"max_new_tokens": 5}, **rl}})


def _train(run, steps):
    for step in steps:
        run.rollout(step), run.score(step), run.update(step)


@pytest.mark.parametrize("groups_per_batch", [1, 2])
def test_one_or_two_rollout_workers_sample_and_train_the_same(init, tmp_path, groups_per_batch):
    """Also with batched sampling: batches are fixed by group index ({0,1}, {2,3}, {4}) and
    dealt whole, so two workers sample the very batches one worker does."""
    work, path = init
    runs = {}
    for n in (1, 2):
        run = RLRun(_cfg(work, tmp_path / f"n{n}", workers={"rollout": n},
                         rollout={"max_new_tokens": 5, "groups_per_batch": groups_per_batch}), path, None)
        _train(run, range(3))
        runs[n] = run
    for step in range(3):
        a, b = runs[1].store.read("rollouts", step), runs[2].store.read("rollouts", step)
        assert a == b  # every row, token and log-prob, bit for bit
    assert {r["weights_version"] for r in runs[2].store.read("rollouts", 2)} == {2}
    for (k, x), (_, y) in zip(runs[1].policy.state_dict().items(), runs[2].policy.state_dict().items()):
        assert torch.equal(x, y), k
    leases = runs[2].ledger.read(0)
    assert {e.worker for e in leases.values()} == {"local-0", "local-1"}  # both workers really served
    for step in range(3):
        assert [e.trained for e in runs[2].ledger.read(step).values()] == [1] * 5
    for run in runs.values():
        run.close()


@pytest.mark.parametrize("groups_per_batch, sealed, calls_after", [(1, [0, 1, 2], [3, 4]), (2, [0, 1], [2, 3, 4])])
def test_a_step_cut_short_keeps_its_sealed_groups(init, tmp_path, monkeypatch, groups_per_batch, sealed, calls_after):
    """A worker dies while building group 3: the groups already written are kept, the rerun
    samples only the rest, and the step's shard equals an uninterrupted run's. One group at a
    time, 0-2 were written; in batches of 2, a batch is written whole, so {0, 1} was and
    {2, 3} was not."""
    from hindsight.rollout.worker import RolloutWorker

    work, path = init
    rollout = {"max_new_tokens": 5, "groups_per_batch": groups_per_batch}
    clean = RLRun(_cfg(work, tmp_path / "clean", rollout=rollout), path, None)
    clean.rollout(0)
    cfg = _cfg(work, tmp_path / "cut", rollout=rollout)
    run = RLRun(cfg, path, None)
    real = RolloutWorker._group_rows
    calls = []

    def dies_at_group_3(self, task, exp):
        if task.group == 3 and 3 not in calls:
            calls.append(3)
            raise RuntimeError("worker died")
        calls.append(task.group)
        return real(self, task, exp)

    monkeypatch.setattr(RolloutWorker, "_group_rows", dies_at_group_3)
    with pytest.raises(RuntimeError):
        run.rollout(0)
    # the coordinator never heard back: all five are still leased; the written ones are on disk
    assert run.ledger.in_state(0, "leased") == [0, 1, 2, 3, 4]
    assert [g for g in range(5) if run.store.has_part("rollouts", 0, g)] == sealed
    calls.clear()
    monkeypatch.setattr(RolloutWorker, "_group_rows", lambda self, task, exp: calls.append(task.group) or real(self, task, exp))
    resumed = RLRun(cfg, path, None)  # a new process: the dead one's leases end
    assert resumed.ledger.in_state(0, "pending") == [0, 1, 2, 3, 4]  # the dead process's leases ended
    resumed.rollout(0)
    assert calls == calls_after  # the sealed groups were not sampled again
    assert resumed.store.read("rollouts", 0) == clean.store.read("rollouts", 0)
    for r in (clean, run, resumed):
        r.close()


def test_a_batch_split_by_an_earlier_run_is_sampled_whole_again(init, tmp_path):
    """Group 2 was written alone (say by a run with batches of 1) but group 3, its batch-mate
    in batches of 2, was not: 2 is sampled again beside 3 and not written, so 3 holds exactly
    what an uninterrupted run samples."""
    work, path = init
    rollout = {"max_new_tokens": 5, "groups_per_batch": 2}
    clean = RLRun(_cfg(work, tmp_path / "clean", rollout=rollout), path, None)
    clean.rollout(0)
    run = RLRun(_cfg(work, tmp_path / "split", rollout=rollout), path, None)
    run.store.write_part("rollouts", 0, 2, clean.store.groups_rows("rollouts", 0, [2])[2])
    run.rollout(0)
    assert run.store.read("rollouts", 0) == clean.store.read("rollouts", 0)
    assert run.ledger.read(0)[2].leases == 0  # sealed from its part, never leased
    for r in (clean, run):
        r.close()


def test_a_retried_rollout_task_releases_its_work_in_the_same_process(init, tmp_path, monkeypatch):
    """A Prefect retry calls rollout(step) again on the same run: the first attempt's leases
    are void, its written groups kept, the rest issued again."""
    from hindsight.rollout.worker import RolloutWorker

    work, path = init
    run = RLRun(_cfg(work, tmp_path / "retry", rollout={"max_new_tokens": 5, "groups_per_batch": 1}), path, None)
    real, calls = RolloutWorker._group_rows, []

    def flaky(self, task, exp):
        if task.group == 2 and task.group not in calls:
            calls.append(task.group)
            raise RuntimeError("transient")
        calls.append(task.group)
        return real(self, task, exp)

    monkeypatch.setattr(RolloutWorker, "_group_rows", flaky)
    with pytest.raises(RuntimeError):
        run.rollout(0)
    run.rollout(0)  # the retry
    assert calls == [0, 1, 2, 2, 3, 4]
    assert sorted({r["group"] for r in run.store.read("rollouts", 0)}) == [0, 1, 2, 3, 4]
    assert run.ledger.read(0)[2].leases == 2
    run.close()


def test_a_step_already_trained_into_the_kept_weights_is_refused(init, tmp_path):
    work, path = init
    cfg = _cfg(work, tmp_path / "twice")
    run = RLRun(cfg, path, None)
    _train(run, [0])
    with pytest.raises(CheckpointError, match="groups \\[0, 1, 2, 3, 4\\] of step 0 are already trained"):
        run.update(0)
    run.close()
    resumed = RLRun(cfg, path, None)  # resumes from step 1: step 0 stays trained
    with pytest.raises(CheckpointError, match="refusing to train them twice"):
        resumed.update(0)
    resumed.close()
