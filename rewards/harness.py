"""What runs inside the sandbox: the limits, the program, then the judge's calls.

Not imported by hindsight: `rewards/sandbox.py` passes this file's source to `python -I -c`.
Its start request (JSON on stdin, read whole before the program runs) holds the rlimits and
the program. After the program has run, the harness answers with the names it defined, then
serves calls from the requests fd, one JSON line each ({"i": nonce, "name", "args", "kwargs"},
the arguments as literals), answering each with the function's return value as a literal of
built-in types on the channel fd.

Nothing here is trusted by the judge. The program runs in this process and can rewrite any
of it, answer for the harness or forge answer lines: what it cannot do is see the tests, which
run outside (`rewards/code.py`), or make a value that is anything but plain data come out.
"""
import ast
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


def listing(scope):
    """The program's top-level names: "callable", or the value as a literal (None: neither)."""
    out = {}
    for name, value in list(scope.items()):
        if name.startswith("__") or type(value).__name__ == "module":
            continue
        out[name] = "callable" if callable(value) else encode(value)
    return out


def main():
    channel, requests = int(sys.argv[1]), int(sys.argv[2])
    request = json.loads(sys.stdin.buffer.read())
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the program cannot read the requests as its input
    for name, value in request["limits"].items():
        soft = hard = int(value)
        if name == "cpu_s":
            hard = soft + 1  # SIGXCPU at the soft limit, SIGKILL one second later
        resource.setrlimit(_LIMITS[name], (soft, hard))

    def answer(i, **kw):
        os.write(channel, (json.dumps({"i": i, **kw}) + "\n").encode())

    calls = os.fdopen(requests, "rb")
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(request["program"], "<program>", "exec"), scope)
    except BaseException as exc:  # SystemExit included: exiting early answers nothing
        answer(-1, error=type(exc).__name__)
        return
    answer(-1, ok=True, names=listing(scope))
    for line in calls:
        try:
            call = json.loads(line)
            i = call["i"]
        except (ValueError, KeyError, TypeError):
            continue
        try:
            value = scope[call["name"]](*ast.literal_eval(call["args"]), **ast.literal_eval(call["kwargs"]))
            literal = encode(value)
            if literal is None:
                answer(i, error="NotPlainData", type=type(value).__name__)
            else:
                answer(i, value=literal)
        except BaseException as exc:
            answer(i, error=type(exc).__name__)


if __name__ == "__main__":  # `python -c` runs it as __main__; an import does nothing
    main()
