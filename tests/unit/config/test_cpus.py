"""The CPUs a stage's process may use: cgroup v2 and v1 quotas along the process's own cgroup path
(the tightest wins), the affinity mask, and the setting that overrides both."""
import os

import torch

from hindsight import cpus


def _tree(tmp_path, files: dict[str, str]):
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def test_quota_lines():
    assert cpus.quota_v2("max 100000\n") is None
    assert cpus.quota_v2("150000 100000\n") == 1.5
    assert cpus.quota_v1("-1\n", "100000\n") is None
    assert cpus.quota_v1("50000", "100000") == 0.5


def test_a_pod_limit_on_a_v2_path_is_found_and_the_tightest_ancestor_wins(tmp_path):
    root = _tree(tmp_path, {"cpu.max": "max 100000", "kubepods/cpu.max": "800000 100000",
                            "kubepods/pod1/cpu.max": "250000 100000", "kubepods/pod1/c1/cpu.max": "max 100000"})
    assert cpus.quota_cpus(root, "0::/kubepods/pod1/c1\n") == 2.5
    assert cpus.quota_cpus(root, "0::/kubepods\n") == 8.0
    assert cpus.quota_cpus(root, "0::/\n") is None


def test_a_v1_quota_on_the_cpu_controller_path(tmp_path):
    root = _tree(tmp_path, {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000",
                            "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000",
                            "cpu,cpuacct/cpu.cfs_quota_us": "-1", "cpu,cpuacct/cpu.cfs_period_us": "100000"})
    text = "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n0::/\n"
    assert cpus.quota_cpus(root, text) == 3.0
    assert cpus.quota_cpus(root, "2:cpu,cpuacct:/\n") is None


def test_usable_cpus_is_the_affinity_mask_capped_by_the_quota_rounded_up(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(cpus, "quota_cpus", lambda: None)
    assert cpus.usable_cpus() == 4
    monkeypatch.setattr(cpus, "quota_cpus", lambda: 1.5)
    assert cpus.usable_cpus() == 2
    monkeypatch.setattr(cpus, "quota_cpus", lambda: 0.2)
    assert cpus.usable_cpus() == 1


def test_the_setting_overrides_and_the_default_is_the_usable_cpus(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(cpus, "usable_cpus", lambda: 1)
        assert cpus.set_stage_threads(None) == 1 and torch.get_num_threads() == 1
        assert cpus.set_stage_threads(3) == 3 and torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_threads_sleep_at_once_where_the_cpus_are_already_busy(tmp_path, monkeypatch):
    from hindsight import cpus
    from hindsight.cpus import omp_wait_env, runnable_threads

    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3\nprocs_running 3\nprocs_blocked 0\n")
    assert runnable_threads(samples=3, interval_s=0, stat=stat) == 2  # this process's own thread is not other work
    assert runnable_threads(stat=tmp_path / "missing") is None
    assert omp_wait_env(busy=2, cpus=2) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert omp_wait_env(busy=1, cpus=2) == {"GOMP_SPINCOUNT": "10000"}
    monkeypatch.setattr(cpus, "runnable_threads", lambda: None)  # no /proc/stat (macOS): a quiet machine's choice
    assert omp_wait_env(cpus=2) == {"GOMP_SPINCOUNT": "10000"}


def test_a_command_keeps_the_users_openmp_setting(monkeypatch):
    import os

    from cli import runtime

    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    runtime.env()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE" and "GOMP_SPINCOUNT" not in os.environ
