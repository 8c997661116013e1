"""The run directory lock: one holder at a time, named when refused, taken over once its holder is dead."""
import logging
import os
import signal
import subprocess
import sys

import pytest

from hindsight.state.runlock import LOCK_NAME, RunLocked, run_lock

pytestmark = pytest.mark.integration  # the holder is another process

HOLD = ("import sys\nfrom hindsight.state.runlock import run_lock\n"
        "with run_lock(sys.argv[1]):\n    print('held', flush=True)\n    sys.stdin.read()\n")


def _holder(run_dir):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_run_is_refused_naming_the_holder(tmp_path):
    holder = _holder(tmp_path / "run")
    try:
        with pytest.raises(RunLocked, match=rf"run: in use by another hindsight run \(pid {holder.pid} on .*, started "):
            with run_lock(tmp_path / "run"):
                pass
    finally:
        holder.stdin.close()
        holder.wait()
    assert not (tmp_path / "run" / LOCK_NAME).exists()  # released and removed
    with run_lock(tmp_path / "run"):  # free again
        pass


def test_the_lock_of_a_dead_holder_is_taken_over_and_logged(tmp_path, caplog):
    holder = _holder(tmp_path / "run")
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert (tmp_path / "run" / LOCK_NAME).exists()  # a SIGKILL leaves the file, not the flock
    with caplog.at_level(logging.WARNING, logger="hindsight.lock"):
        with run_lock(tmp_path / "run"):
            pass
    assert f"taking over the lock of pid {holder.pid}" in caplog.text


def test_the_lock_is_reentrant_within_a_process(tmp_path):
    with run_lock(tmp_path / "run") as path:
        with run_lock(tmp_path / "run"):
            pass
        assert path.exists()  # the outer hold is still on
    assert not path.exists()
