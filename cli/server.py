"""One local Prefect server, shared and long-lived, instead of a temporary one per command.

`hindsight server start` runs Prefect's own `prefect server start` on loopback, detached,
and records it in `$PREFECT_HOME/hindsight-server.json` (pid, URL, log file). Every
`hindsight run ...` then talks to it: an explicit `PREFECT_API_URL` wins, else the recorded
server if it answers, else one is started once (and the command says so). A file lock
around that check-and-start makes two commands started at once share one server.
"""
from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from hindsight.errors import HindsightError

DEFAULT_PORT = 4200


class ServerError(HindsightError):
    pass


def home() -> Path:
    return Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser()


def state_file() -> Path:
    return home() / "hindsight-server.json"


def healthy(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as resp:
            return resp.status == 200
    except (OSError, ValueError):
        return False


def status() -> dict | None:
    """The recorded server if its process lives and it answers, else None (a stale record is removed)."""
    try:
        info = json.loads(state_file().read_text())
    except (OSError, ValueError):
        return None
    try:
        os.kill(info["pid"], 0)
    except (OSError, KeyError, TypeError):
        state_file().unlink(missing_ok=True)
        return None
    return info if healthy(info.get("url", "")) else None


@contextmanager
def _start_lock():
    home().mkdir(parents=True, exist_ok=True)
    with open(home() / "hindsight-server.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # a second command waits here, then finds the first one's server
        yield


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def start(port: int | None = None, wait_s: float = 90.0) -> tuple[dict, bool]:
    """(the server's record, whether this call started it)."""
    with _start_lock():
        running = status()
        if running:
            return running, False
        port = port or next((p for p in range(DEFAULT_PORT, DEFAULT_PORT + 50) if _port_free(p)), 0)
        if not port:
            raise ServerError(f"no free port in {DEFAULT_PORT}..{DEFAULT_PORT + 49} for the Prefect server; "
                              f"pass --port, or set PREFECT_API_URL to a server you run")
        url, log = f"http://127.0.0.1:{port}/api", home() / "hindsight-server.log"
        # the UI asks its server's `ui-settings` where the API is: without these it says the default
        # port, so on any other port every page (and every printed link) showed another server's runs
        env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_HOME": str(home()),
               "PREFECT_SERVER_API_HOST": "127.0.0.1", "PREFECT_SERVER_API_PORT": str(port), "PREFECT_UI_API_URL": url}
        for stale in ("PREFECT_API_URL", "PREFECT_UI_URL"):
            env.pop(stale, None)
        with open(log, "ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                     "--port", str(port)], stdout=out, stderr=subprocess.STDOUT, env=env,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + wait_s
        while not healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                _kill(proc.pid)
                tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                why = "exited" if proc.returncode is not None else f"did not answer within {wait_s:.0f} s"
                raise ServerError(f"the local Prefect server {why} (last log line: {tail[0][:200]}; full log: {log}); "
                                  f"retry `hindsight server start`, or set PREFECT_API_URL to a server you run")
            time.sleep(0.5)
        info = {"pid": proc.pid, "url": url, "log": str(log), "started": time.time()}
        state_file().write_text(json.dumps(info))
        return info, True


def stop() -> dict | None:
    info = status()
    if info is None:
        state_file().unlink(missing_ok=True)
        return None
    _kill(info["pid"])
    state_file().unlink(missing_ok=True)
    return info


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
        for _ in range(100):
            os.kill(pid, 0)
            time.sleep(0.1)
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def ensure_api(echo) -> str:
    """The Prefect API every run command uses: PREFECT_API_URL if set, else the shared local
    server (started now if none runs, which `echo` reports)."""
    url = os.environ.get("PREFECT_API_URL")
    if url:
        if not healthy(url.rstrip("/"), timeout_s=5.0):
            raise ServerError(f"PREFECT_API_URL={url} does not answer; start that server, or unset PREFECT_API_URL "
                              f"to use the local one (`hindsight server start`)")
        return url
    info, started = start()
    if started:
        echo(f"started a local Prefect server at {info['url']} (pid {info['pid']}, log {info['log']}); "
             f"later commands reuse it, `hindsight server stop` stops it")
    os.environ["PREFECT_API_URL"] = info["url"]
    os.environ["PREFECT_UI_URL"] = info["url"].removesuffix("/api")  # the "View at" links: this server's UI
    return info["url"]
