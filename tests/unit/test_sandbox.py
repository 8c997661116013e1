"""The code reward's sandbox: each limit is exercised by code that tries to break it."""
import socket
import threading
import time

import pytest

from rewards.code import code_tests
from rewards.sandbox import namespaces_available, run_python

pytestmark = pytest.mark.integration  # every test runs code in a sandboxed subprocess


def test_passing_and_failing_code():
    good = "```python\ndef add(a, b):\n    return a + b\n```"
    bad = "```python\ndef add(a, b):\n    return a - b\n```"
    assert code_tests([good, bad], ["assert add(2, 3) == 5"] * 2) == [1.0, 0.0]


def test_infinite_loop_is_stopped_by_the_cpu_limit():
    t0 = time.monotonic()
    res = run_python("while True:\n    pass\n", timeout_s=20, cpu_s=1)
    assert not res.ok and time.monotonic() - t0 < 10


def test_sleeping_forever_is_stopped_by_the_wall_timeout():
    t0 = time.monotonic()
    res = run_python("import time\ntime.sleep(3600)\n", timeout_s=1.5, cpu_s=5)
    assert res.timed_out and time.monotonic() - t0 < 5


def test_memory_bomb_is_stopped_by_the_memory_limit():
    res = run_python("x = bytearray(2 * 1024**3)\nprint('allocated')\n", memory_mb=256)
    assert not res.ok and "allocated" not in res.stdout and "MemoryError" in res.stderr


def test_no_network_even_to_loopback():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(3)
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: _accept(server, accepted), daemon=True).start()
    code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')\n"
    res = run_python(code, timeout_s=10)
    assert not res.ok and "connected" not in res.stdout
    time.sleep(0.5)
    assert accepted == []
    server.close()


def _accept(server, accepted):
    try:
        accepted.append(server.accept())
    except OSError:
        pass


def test_environment_secrets_are_not_inherited(monkeypatch):
    monkeypatch.setenv("HINDSIGHT_TEST_SECRET", "hunter2")
    res = run_python("import os\nprint(os.environ.get('HINDSIGHT_TEST_SECRET'))\n")
    assert res.ok and res.stdout.strip() == "None"


def test_runs_in_a_fresh_temporary_directory():
    res = run_python("import os\nprint(os.getcwd())\nprint(sorted(os.listdir('.')))\n")
    cwd, listing = res.stdout.splitlines()
    assert "hindsight-sandbox-" in cwd and listing == "['main.py']"


def test_isolation_mode_is_reported():
    assert run_python("pass").network_isolated == namespaces_available()
