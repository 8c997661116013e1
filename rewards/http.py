"""One HTTP request to a server hindsight does not control (an LLM judge), bounded every way:

- one deadline for the whole request, connect to last byte: the socket's timeout is set to what
  is left before every read, so a server that sends a byte every few seconds is cut at the
  deadline, not at (bytes x timeout);
- a cap on the answer's size, read a block at a time: a 200 MB answer costs at most the cap;
- redirects: a 307 or 308 to the same origin is followed (the method and body stay); one to
  another origin is refused before any request goes there, so credentials never leave the
  origin they were meant for; other redirects are not followed.
"""
from __future__ import annotations

import http.client
import time
from urllib.parse import urljoin, urlsplit

MAX_REDIRECTS = 3


class RequestFailed(Exception):
    """The request did not give a complete answer within its limits."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or (443 if parts.scheme == "https" else 80)


def request(method: str, url: str, body: bytes | None, headers: dict, timeout_s: float,
            max_bytes: int) -> tuple[int, bytes]:
    """(status, body) of a 2xx answer; RequestFailed for anything else (an HTTP error carries its status)."""
    deadline = time.monotonic() + timeout_s
    for _ in range(MAX_REDIRECTS + 1):
        status, location, data = _once(method, url, body, headers, deadline, max_bytes)
        if status in (307, 308) and location:
            target = urljoin(url, location)
            if origin(target) != origin(url):
                raise RequestFailed(f"redirect to another origin ({origin(target)[1]}) refused", status)
            url = target
            continue
        if 200 <= status < 300:
            return status, data
        raise RequestFailed(f"HTTP {status}", status)
    raise RequestFailed("too many redirects")


def _once(method: str, url: str, body: bytes | None, headers: dict, deadline: float,
          max_bytes: int) -> tuple[int, str | None, bytes]:
    scheme, host, port = origin(url)
    if scheme not in ("http", "https"):
        raise RequestFailed(f"{scheme}: not an http(s) URL")
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    conn = cls(host, port, timeout=_left(deadline))
    try:
        conn.request(method, path, body=body, headers=headers)
        sock = conn.sock  # the connection lets go of it once the answer is whole; the reads still use it
        sock.settimeout(_left(deadline))
        response = conn.getresponse()
        data = bytearray()
        while not response.isclosed():  # it closes itself once the whole answer is read
            sock.settimeout(_left(deadline))
            block = response.read1(65536)  # what has come: one read of the socket, so the deadline holds
            if not block:
                break
            data += block
            if len(data) > max_bytes:
                raise RequestFailed(f"answer larger than {max_bytes} bytes")
        return response.status, response.getheader("Location"), bytes(data)
    except (OSError, http.client.HTTPException) as exc:
        raise RequestFailed(f"{type(exc).__name__}: {exc}") from None
    finally:
        conn.close()


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise RequestFailed("deadline passed")
    return left
