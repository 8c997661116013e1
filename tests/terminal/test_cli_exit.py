"""The CLI ends with os._exit to skip the interpreter's teardown (cli.runtime.exit_now); what a normal exit
does that matters must still happen first: queued work in non-daemon threads finishes, atexit
handlers run, buffered output is flushed, and the status is the command's."""
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import atexit, sys, time
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path
    out = Path(sys.argv[1])
    pool = ThreadPoolExecutor(max_workers=1)
    pool.submit(lambda: (time.sleep(0.5), (out / "from-thread").write_text("done")))
    atexit.register(lambda: (out / "from-atexit").write_text("done"))
    sys.stdout.write("buffered, no newline")
    from cli.runtime import exit_now
    exit_now({code})
    (out / "after-exit").write_text("never")
""")


@pytest.mark.parametrize("code, status", [("0", 0), ("3", 3), ("None", 0), ("'error: bad input'", 1)])
def test_exit_finishes_threads_and_atexit_then_returns_the_status(tmp_path, code, status):
    res = subprocess.run([sys.executable, "-c", SCRIPT.format(code=code), str(tmp_path)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == status, res.stderr
    assert (tmp_path / "from-thread").read_text() == "done"  # the queued write was not cut off
    assert (tmp_path / "from-atexit").read_text() == "done"
    assert not (tmp_path / "after-exit").exists()
    assert res.stdout == "buffered, no newline"
    if status == 1:
        assert res.stderr.strip() == "error: bad input"


def test_the_interpreter_calls_the_fast_exit_relies_on_still_exist():
    """exit_now runs what Py_Finalize runs first through two private calls (cli/runtime._finalize):
    if a Python version renames them, this fails before any command silently loses queued work."""
    import atexit
    import threading

    assert callable(threading._shutdown) and callable(atexit._run_exitfuncs)
