"""A sandbox's memory cgroup does not outlive its process: on SIGTERM the process closes its
groups, then dies by the signal as it would have; one left by a SIGKILL is swept by the next
sandbox started on the machine, which kills what is left in it; a live process's groups are never
touched."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rewards import cgroup

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import subprocess, sys, time
from rewards.cgroup import MemoryGroup
group = MemoryGroup(64 << 20)
sleeper = subprocess.Popen(["sleep", "600"])
open(group.procs, "w").write(str(sleeper.pid))
print(group.path, sleeper.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(cgroup.problem() is not None, reason="no memory cgroup can be made on this machine")
def test_sigterm_closes_the_processs_groups_and_still_ends_it_by_the_signal():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    path, sleeper = child.stdout.readline().split()
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=60) == -signal.SIGTERM
    assert not Path(path).exists()


@pytest.mark.skipif(cgroup.problem() is not None, reason="no memory cgroup can be made on this machine")
def test_a_group_left_by_a_killed_process_is_swept_by_the_next_sandbox():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    path, sleeper = child.stdout.readline().split()
    path, sleeper = Path(path), int(sleeper)
    live = cgroup.MemoryGroup(64 << 20)  # this process's own: the sweep must leave it
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    assert path.is_dir() and str(sleeper) in (path / "cgroup.procs").read_text()  # left behind, still holding
    removed = cgroup.sweep_orphans(path.parent)
    assert path in removed and not path.exists()
    for _ in range(100):  # the sleeper was killed with it
        if not Path(f"/proc/{sleeper}").exists() or "Z" in Path(f"/proc/{sleeper}/stat").read_text().split()[2]:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the group's process survived the sweep")
    assert live.path.is_dir()
    live.close()
    assert not live.path.exists()
