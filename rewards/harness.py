"""What runs inside each of the two sandboxes of the code reward (`rewards/judging.py`).

Not imported by hindsight: `rewards/sandbox.py` passes this file's source to `python -I -c`,
with the role as its first argument:

- `program`: runs the model's program, then answers with the names it defined (functions,
  modules it imported, small values), then serves calls to its functions;
- `tests`: runs the dataset's tests (and the helpers the prompt defined) with the program's
  names bound to proxies, and answers with its verdict.

The two never share memory: every call and every value crosses the host as one JSON line, the
values as Python literals of exactly the built-in types, parsed inside the receiving sandbox
under its own limits. The host relays lines and parses nothing but their envelopes. Calls go
both ways with one protocol (a test passes a lambda: the program calls it back; the program
returns a function: the test calls it), so each side is a `Peer`: while it waits for the answer
to its own call, it serves the other side's calls.

Nothing the program's side says is trusted: it runs the program, which can rewrite any of it.
What it cannot do is reach the tests' sandbox, or send anything but plain data there.
"""
import ast
import builtins
import importlib
import json
import os
import resource
import sys
import types

_LIMITS = {"cpu_s": resource.RLIMIT_CPU, "memory_bytes": resource.RLIMIT_AS, "processes": resource.RLIMIT_NPROC,
           "file_bytes": resource.RLIMIT_FSIZE, "open_files": resource.RLIMIT_NOFILE}
VALUE_CAP = 1_000_000      # characters of one value as a literal
LISTED_CAP = 65_536        # a top-level value listed with the names (larger ones are not sent)
ITEMS_CAP = 100_000        # items taken from a returned generator or iterator
MESSAGE_CAP = 500          # characters of an exception's message
DEPTH_CAP = 50
_ITERATORS = (types.GeneratorType, map, filter, zip, enumerate, reversed)


def encode(value, handle=None, depth=0):
    """A Python literal for plain data of exactly the built-in types, else None: a subclass
    could lie in its repr, so `type(v) is int`, not isinstance. A callable becomes a handle's
    marker (`handle(fn)`) when the caller can serve calls to it; an iterator, its items."""
    t = type(value)
    if depth > DEPTH_CAP:
        return None
    if value is None or t in (bool, int, float, str, bytes, complex):
        return t.__repr__(value)
    if isinstance(value, _ITERATORS):
        value, t = _items(value), list
    if t in (list, tuple, set, frozenset):
        parts = [encode(v, handle, depth + 1) for v in value]
        if any(p is None for p in parts):
            return None
        inner = ", ".join(parts)
        return {list: f"[{inner}]", tuple: f"({inner},)" if len(parts) == 1 else f"({inner})",
                set: f"{{{inner}}}" if parts else "set()", frozenset: f"frozenset({{{inner}}})"}[t]
    if t is dict:
        items = [(encode(k, handle, depth + 1), encode(v, handle, depth + 1)) for k, v in value.items()]
        if any(k is None or v is None for k, v in items):
            return None
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    if handle is not None and callable(value):
        return repr(handle(value))
    return None


def _items(iterator) -> list:
    out = []
    for item in iterator:
        out.append(item)
        if len(out) >= ITEMS_CAP:
            break
    return out


def builtin_error(exc: BaseException) -> str:
    """The nearest built-in exception type of `exc` (a program's own ValueError subclass is a
    ValueError); RuntimeError for what must not end the other side (SystemExit, KeyboardInterrupt)."""
    for cls in type(exc).__mro__:
        if getattr(builtins, cls.__name__, None) is cls and issubclass(cls, Exception):
            return cls.__name__
    return "RuntimeError"


class CandidateError(RuntimeError):
    """A call that gave no plain-data value (its answer was not a literal, or never came)."""


class Peer:
    """One side of the call protocol over two fds: `call` sends a call and serves the other
    side's calls until its own answer comes; `serve` answers calls until the other side is done."""

    def __init__(self, out_fd: int, in_fd: int, token: str, targets: dict):
        self.out, self.inp, self.token, self.targets = out_fd, os.fdopen(in_fd, "rb"), token, targets
        self.handles, self.calls = {}, 0

    def send(self, **msg) -> None:
        os.write(self.out, (json.dumps(msg) + "\n").encode())

    def handle(self, fn) -> str:
        key = f"h{len(self.handles)}"
        self.handles[key] = fn
        return f"\x00{self.token}:{key}"

    def decode(self, literal: str):
        if len(literal) > VALUE_CAP:
            raise ValueError("a value past the size limit")
        return self._proxies(ast.literal_eval(literal))

    def _proxies(self, value):
        if type(value) is str and value.startswith(f"\x00{self.token}:"):
            return Remote(self, value.split(":", 1)[1])
        if type(value) in (list, tuple, set, frozenset):
            return type(value)(self._proxies(v) for v in value)
        if type(value) is dict:
            return {self._proxies(k): self._proxies(v) for k, v in value.items()}
        return value

    def call(self, target: str, args: tuple, kwargs: dict):
        literal_args, literal_kwargs = encode(list(args), self.handle), encode(kwargs, self.handle)
        if literal_args is None or literal_kwargs is None:
            raise CandidateError(f"{target}: an argument is not plain data, so it cannot be sent")
        self.calls += 1
        i = f"{self.token}.{self.calls}"
        self.send(op="call", i=i, target=target, args=literal_args, kwargs=literal_kwargs)
        while True:
            msg = self._receive()
            if msg is None:
                raise CandidateError(f"{target}: unanswered")
            if msg.get("op") == "call":
                self._answer(msg)
            elif msg.get("op") == "answer" and msg.get("i") == i:
                return self._result(msg, target)

    def _result(self, msg: dict, target: str):
        if "error" in msg:
            cls = getattr(builtins, str(msg["error"]), None)
            message = str(msg.get("message", ""))[:MESSAGE_CAP]
            if isinstance(cls, type) and issubclass(cls, Exception):
                try:
                    raise cls(message)
                except TypeError:  # a built-in type that takes other arguments (UnicodeDecodeError)
                    pass
            raise CandidateError(f"{target}: {msg['error']}: {message}")
        value = msg.get("value")
        if not isinstance(value, str):
            raise CandidateError(f"{target}: no value")
        try:
            decoded = self.decode(value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise CandidateError(f"{target}: its answer is not a literal") from None
        return iter(decoded) if msg.get("iterator") and isinstance(decoded, list) else decoded

    def _receive(self):
        while True:
            line = self.inp.readline(VALUE_CAP * 4)
            if not line:
                return None
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict):
                return msg

    def _answer(self, msg: dict) -> None:
        i = msg.get("i")
        try:
            fn = self.targets.get(msg.get("target")) or self.handles.get(msg.get("target"))
            if fn is None:
                raise NameError(f"no callable {msg.get('target')!r}")
            value = fn(*self.decode(msg["args"]), **self.decode(msg["kwargs"]))
            literal = encode(value, self.handle)
            if literal is None or len(literal) > VALUE_CAP:
                self.send(op="answer", i=i, error="TypeError",
                          message=f"the answer, a {type(value).__name__}, is not plain data within the size limit")
            else:
                self.send(op="answer", i=i, value=literal, iterator=isinstance(value, _ITERATORS))
        except BaseException as exc:  # the other side's caller decides what it means
            self.send(op="answer", i=i, error=builtin_error(exc), message=str(exc)[:MESSAGE_CAP])

    def serve(self) -> None:
        while (msg := self._receive()) is not None:
            if msg.get("op") == "call":
                self._answer(msg)


class Remote:
    """A name of the other side (a function, or a handle to one), called with plain data."""

    def __init__(self, peer: Peer, target: str):
        self._peer, self._target = peer, target

    def __call__(self, *args, **kwargs):
        return self._peer.call(self._target, args, kwargs)

    def __repr__(self) -> str:
        return f"<remote {self._target}>"


def listing(scope: dict) -> dict:
    """The program's top-level names: {"kind": "callable"}, {"kind": "module", "module": its name},
    or {"kind": "value", "value": literal} (a value too large or not plain data is left out)."""
    out = {}
    for name, value in list(scope.items()):
        if name.startswith("__"):
            continue
        if type(value).__name__ == "module":
            out[name] = {"kind": "module", "module": getattr(value, "__name__", name)}
        elif callable(value):
            out[name] = {"kind": "callable"}
        else:
            literal = encode(value)
            if literal is not None and len(literal) <= LISTED_CAP:
                out[name] = {"kind": "value", "value": literal}
    return out


def program_side(request: dict, peer_fds) -> None:
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    out = peer_fds[0]
    try:
        exec(compile(request["program"], "<program>", "exec"), scope)
    except BaseException as exc:  # SystemExit included: exiting early answers nothing
        try:
            message = str(exc)[:MESSAGE_CAP]
        except Exception:  # an exception whose __str__ raises still says its type
            message = ""
        os.write(out, (json.dumps({"op": "started", "ok": False, "error": type(exc).__name__[:100],
                                   "message": message}) + "\n").encode())
        return
    names = listing(scope)
    os.write(out, (json.dumps({"op": "started", "ok": True, "names": names}) + "\n").encode())
    Peer(*peer_fds, request["token"], {n: scope[n] for n, kind in names.items() if kind["kind"] == "callable"}).serve()


def tests_side(request: dict, peer_fds) -> None:
    peer = Peer(*peer_fds, request["token"], {})
    scope = {"__builtins__": builtins, "__name__": "__tests__"}
    for name, kind in request["names"].items():
        if not isinstance(name, str) or not name.isidentifier() or hasattr(builtins, name):
            continue  # a program's `abs` would judge the tests' own checks
        try:
            if kind["kind"] == "callable":
                scope[name] = Remote(peer, name)
            elif kind["kind"] == "module":
                scope[name] = importlib.import_module(kind["module"])
            elif kind["kind"] == "value":
                scope[name] = ast.literal_eval(kind["value"])
        except Exception:
            continue  # a module the tests' sandbox lacks, a value it cannot read: as if never defined
    passed = True
    try:
        if request.get("helpers"):  # the prompt's own definitions win over the program's
            exec(compile(request["helpers"], "<prompt>", "exec"), scope)
        exec(compile(request["tests"], "<tests>", "exec"), scope)
    except BaseException:  # an assert that failed, a candidate's error, the test's own error
        passed = False
    os.write(peer.out, (json.dumps({"op": "verdict", "passed": passed}) + "\n").encode())


def main() -> None:
    role, out_fd, in_fd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    request = json.loads(sys.stdin.buffer.read())
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # nothing else comes in on stdin
    for name, value in request["limits"].items():
        soft = hard = int(value)
        if name == "cpu_s":
            hard = soft + 1  # SIGXCPU at the soft limit, SIGKILL one second later
        resource.setrlimit(_LIMITS[name], (soft, hard))
    (program_side if role == "program" else tests_side)(request, (out_fd, in_fd))


if __name__ == "__main__":  # `python -c` runs it as __main__; an import does nothing
    main()
