"""How many intra-op threads a stage's process should run: the CPUs it may really use.

`os.cpu_count()` is the node's core count. In a Kubernetes pod with a CPU limit, or a process
pinned to some cores, that is more threads than there are CPUs to run them, and an
oversubscribed parallel region waits for its slowest thread: on a loaded 2-core machine a second
thread made a step ~3x slower and ~4x costlier in CPU. So the count is the smallest of:

- the affinity mask (`sched_getaffinity`: taskset, cpuset, a pinned container);
- the cgroup CPU quota, rounded up (`cpu.max` in cgroup v2, `cpu.cfs_quota_us` in v1), the
  tightest along the process's cgroup path: a pod's `limits.cpu`.

The setting `resources.threads` overrides it. Roles that run beside each other in one node (the
async sampler beside the learner) split that count (`coordination.sampler.split_threads`).

The count is a property of where the process runs, never of the moment's load, so a resumed run
computes with the same number of threads as the run it resumes (a matmul's reduction order, and
so its round-off, can depend on it).
"""
from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path

log = logging.getLogger("hindsight")
CGROUP = Path("/sys/fs/cgroup")


def quota_v2(cpu_max: str) -> float | None:
    """CPUs from a cgroup v2 `cpu.max` line, "QUOTA PERIOD" or "max PERIOD" (no limit)."""
    quota, _, period = cpu_max.strip().partition(" ")
    if quota == "max" or not period:
        return None
    return int(quota) / int(period)


def quota_v1(quota_us: str, period_us: str) -> float | None:
    """CPUs from cgroup v1's `cpu.cfs_quota_us` (-1: no limit) and `cpu.cfs_period_us`."""
    quota = int(quota_us.strip())
    return None if quota <= 0 else quota / int(period_us.strip())


def _own_paths(proc_cgroup: str) -> tuple[str | None, str | None]:
    """(the v2 path, the v1 `cpu` controller's path) from /proc/self/cgroup's text."""
    v2 = v1 = None
    for line in proc_cgroup.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _ancestors(base: Path, path: str) -> list[Path]:
    """The cgroup folder of `path` and every folder above it, up to the hierarchy's root."""
    parts = [p for p in path.strip("/").split("/") if p]
    return [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def quota_cpus(root: Path = CGROUP, proc_cgroup: str | None = None) -> float | None:
    """The tightest CPU quota along this process's cgroup path, in CPUs; None if there is none."""
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
    v2, v1 = _own_paths(proc_cgroup)
    found: list[float] = []
    for d in _ancestors(root, v2) if v2 is not None else []:
        if (d / "cpu.max").is_file():
            found.append(quota_v2((d / "cpu.max").read_text()) or math.inf)
    for base in (root / "cpu", root / "cpu,cpuacct"):
        for d in _ancestors(base, v1) if v1 is not None else []:
            if (d / "cpu.cfs_quota_us").is_file() and (d / "cpu.cfs_period_us").is_file():
                found.append(quota_v1((d / "cpu.cfs_quota_us").read_text(),
                                      (d / "cpu.cfs_period_us").read_text()) or math.inf)
    limit = min(found, default=math.inf)
    return None if limit == math.inf else limit


def usable_cpus() -> int:
    """The CPUs this process may really use: its affinity mask, capped by its cgroup quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS has no affinity call
        cpus = os.cpu_count() or 1
    quota = quota_cpus()
    return max(1, min(cpus, math.ceil(quota))) if quota else max(1, cpus)


def set_stage_threads(setting: int | None) -> int:
    """Set torch's intra-op threads for this process: `setting`, else the usable CPUs. Returns it."""
    import torch

    threads = setting or usable_cpus()
    if torch.get_num_threads() != threads:
        log.info("intra-op threads: %d (%s)", threads, "resources.threads" if setting else
                 f"{os.cpu_count()} cores on the node; affinity and the cgroup quota allow {threads}")
        torch.set_num_threads(threads)
    return threads


def runnable_threads(samples: int = 5, interval_s: float = 0.02, stat: Path = Path("/proc/stat")) -> int | None:
    """The node's runnable threads now, less this one: the median of a few reads of
    `procs_running` (the load average lags a minute behind, too late for a process's start).
    None where /proc/stat is not there (macOS)."""
    counts = []
    for i in range(samples):
        try:
            line = next(ln for ln in stat.read_text().splitlines() if ln.startswith("procs_running"))
        except (OSError, StopIteration):
            return None
        counts.append(max(int(line.split()[1]) - 1, 0))
        if i + 1 < samples:
            time.sleep(interval_s)
    return sorted(counts)[len(counts) // 2]


def omp_wait_env(busy: int | None = None, cpus: int | None = None) -> dict[str, str]:
    """How OpenMP's idle threads wait, chosen at a process's start (before torch loads).

    libgomp's default spins ~300,000 rounds between parallel regions; beside busy processes that
    spinning doubled a step's CPU (bench/threads.py). On a machine whose usable CPUs are already
    taken, threads sleep at once (`OMP_WAIT_POLICY=PASSIVE`: 0.86x SFT, 0.82x RL loaded); on a
    quiet one they spin 10,000 rounds (`GOMP_SPINCOUNT=10000`), which keeps its speed where
    PASSIVE cost 1.5-1.9x the wall time."""
    busy = runnable_threads() if busy is None else busy
    cpus = usable_cpus() if cpus is None else cpus
    if busy is not None and busy >= cpus:
        return {"OMP_WAIT_POLICY": "PASSIVE"}
    return {"GOMP_SPINCOUNT": "10000"}
