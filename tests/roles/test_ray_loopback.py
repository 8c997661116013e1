"""The embedded Ray cluster listens on loopback only: every socket its processes (GCS, raylet,
workers, the metrics and runtime-env agents) listen on is bound to 127.0.0.1."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import os, subprocess
from hindsight.coordination.placement import start_ray
ray = start_ray(None)
@ray.remote
def f():
    return 1
assert ray.get(f.remote()) == 1
mine = {str(os.getpid())}
for _ in range(3):  # Ray's processes descend from this one
    for entry in os.listdir("/proc"):
        try:
            ppid = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            continue
        if ppid in mine:
            mine.add(entry)
out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
for line in out.splitlines():
    if any(f"pid={p}," in line for p in mine):
        print("LISTEN", line.split()[3])
ray.shutdown()
"""


def test_the_embedded_cluster_binds_loopback_only():
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=180, cwd=ROOT,
                         env={"PATH": "/usr/bin:/bin:/usr/sbin", "PYTHONPATH": str(ROOT), "HOME": "/tmp"})
    assert res.returncode == 0, res.stderr[-3000:]
    addresses = [line.split()[1] for line in res.stdout.splitlines() if line.startswith("LISTEN")]
    assert len(addresses) >= 3, res.stdout  # the GCS, a raylet and a worker at least
    outside = [a for a in addresses if not a.startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:"))]
    assert outside == [], addresses
