"""Sandbox uids are claimed host-wide: a uid another live process holds is never handed out, and a
dead holder's uid is free again (the kernel drops its lock)."""
import subprocess
import sys
from pathlib import Path

import pytest

from rewards.uids import UidClaim

ROOT = Path(__file__).resolve().parents[3]
HOLD = ("import sys, time\nfrom pathlib import Path\nfrom rewards.uids import UidClaim\n"
        "claim = UidClaim(100, span=2, folder=Path(sys.argv[1]))\nprint(claim.uid, flush=True)\ntime.sleep(600)\n")


def test_claims_in_one_process_differ_and_a_released_uid_is_claimed_again(tmp_path):
    first, second = UidClaim(100, span=2, folder=tmp_path), UidClaim(100, span=2, folder=tmp_path)
    assert {first.uid, second.uid} == {100, 101}
    with pytest.raises(RuntimeError, match="every sandbox uid from 100 to 101 is held"):
        UidClaim(100, span=2, folder=tmp_path)
    first.release()
    assert UidClaim(100, span=2, folder=tmp_path).uid == first.uid


def test_a_uid_held_by_another_process_is_skipped_until_that_process_dies(tmp_path):
    other = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        held = int(other.stdout.readline())
        mine = UidClaim(100, span=2, folder=tmp_path)
        assert mine.uid == ({100, 101} - {held}).pop()  # before: every process's first uid was the same
        with pytest.raises(RuntimeError, match="is held by a live sandbox"):
            UidClaim(100, span=2, folder=tmp_path)
    finally:
        other.kill()
        other.wait()
    assert UidClaim(100, span=2, folder=tmp_path).uid == held
