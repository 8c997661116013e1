"""What runs inside the sandbox: the limits, the program, then the judge's requests.

Not imported by hindsight: `rewards/sandbox.py` passes this file's source to `python -I -c`.
Its request (JSON on stdin, read whole before the program runs) holds the rlimits, the
program and the steps; each step's answer goes out as a JSON line on the channel fd.

Nothing here is trusted by the judge. The program runs in this process and can rewrite any
of it; what it cannot do is know the expected values, which never enter the sandbox.
"""
import json
import os
import resource
import sys

_LIMITS = {"cpu_s": resource.RLIMIT_CPU, "memory_bytes": resource.RLIMIT_AS, "processes": resource.RLIMIT_NPROC,
           "file_bytes": resource.RLIMIT_FSIZE, "open_files": resource.RLIMIT_NOFILE}


def encode(value, depth=0):
    """A Python literal for plain data of exactly the built-in types, else None: a subclass
    could lie in its repr, so `type(v) is int`, not isinstance."""
    t = type(value)
    if depth > 50:
        return None
    if value is None or t in (bool, int, float, str, bytes, complex):
        return t.__repr__(value)
    if t in (list, tuple, set, frozenset):
        parts = [encode(v, depth + 1) for v in value]
        if any(p is None for p in parts):
            return None
        inner = ", ".join(parts)
        return {list: f"[{inner}]", tuple: f"({inner},)" if len(parts) == 1 else f"({inner})",
                set: f"{{{inner}}}" if parts else "set()", frozenset: f"frozenset({{{inner}}})"}[t]
    if t is dict:
        items = [(encode(k, depth + 1), encode(v, depth + 1)) for k, v in value.items()]
        if any(k is None or v is None for k, v in items):
            return None
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    return None


def main():
    channel = int(sys.argv[1])
    request = json.loads(sys.stdin.buffer.read())
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the program cannot read the requests as its input
    for name, value in request["limits"].items():
        soft = hard = int(value)
        if name == "cpu_s":
            hard = soft + 1  # SIGXCPU at the soft limit, SIGKILL one second later
        resource.setrlimit(_LIMITS[name], (soft, hard))

    def answer(i, **kw):
        os.write(channel, (json.dumps({"i": i, **kw}) + "\n").encode())

    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(request["program"], "<program>", "exec"), scope)
    except BaseException as exc:  # SystemExit included: exiting early answers nothing
        answer(-1, error=type(exc).__name__)
        return
    answer(-1, ok=True)
    for i, (kind, source) in enumerate(request["steps"]):
        try:
            if kind == "exec":
                exec(compile(source, f"<test {i}>", "exec"), scope)
                answer(i, ok=True)
            else:
                value = eval(compile(source, f"<test {i}>", "eval"), scope)
                literal = encode(value)
                answer(i, value=literal) if literal is not None else answer(i, truth=bool(value))
        except BaseException as exc:
            answer(i, error=type(exc).__name__)


if __name__ == "__main__":  # `python -c` runs it as __main__; an import does nothing
    main()
