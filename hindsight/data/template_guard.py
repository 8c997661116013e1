"""A chat template is code that comes with a model (a GGUF, a tokenizer folder): transformers
renders it in a sandboxed Jinja environment, so it cannot run Python, but nothing bounds its
work: a nested loop of 99,999 x 99,999 ran past 120 s, and `'x' * 3000000000` took 8 GB. At
preflight it compiles and renders a sample conversation in a forked child under a time and a
memory budget; a template that overruns either is one error naming
its source, before any model loads."""
from __future__ import annotations

import os
import resource
import select
import signal

from hindsight.errors import ConfigError

SAMPLE = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "What is 2 + 3?"},
          {"role": "assistant", "content": "5"}, {"role": "user", "content": "And 4 + 4?"}]


def check_template(tok, source: str, tools: list[dict] | None = None, timeout_s: float = 20.0,
                   memory_mb: int = 1024) -> None:
    """Render the tokenizer's chat template once in a child bounded by `timeout_s` and `memory_mb`
    (beyond what the process already holds); a ConfigError naming `source` if it overruns."""
    if not getattr(tok, "chat_template", None):
        return
    _import_here()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: render, say how it went in one byte, and leave without cleanup
        os.close(read)
        status = b"?"
        try:
            held = _address_space()
            resource.setrlimit(resource.RLIMIT_AS, (held + memory_mb * 2**20, held + memory_mb * 2**20))
            tok.apply_chat_template(SAMPLE, tools=tools or None, tokenize=False, add_generation_prompt=True)
            status = b"0"
        except MemoryError:
            status = b"M"
        except BaseException:  # a template that fails on its own is not this check's to report
            status = b"E"
        finally:
            os.write(write, status)
            os._exit(0)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], timeout_s)
        status = os.read(read, 1) if ready else b"T"
    finally:
        os.close(read)
        if status == b"T":
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if status == b"T":
        raise ConfigError(f"{source}: its chat template did not render a two-turn conversation within {timeout_s:g} s; "
                          f"a template is refused past that (a loop over a huge range?)")
    if status in (b"M", b""):  # b"": the child was killed (the kernel, at its memory limit)
        raise ConfigError(f"{source}: its chat template needed more than {memory_mb} MB to render a two-turn "
                          f"conversation; a template is refused past that")


def _import_here() -> None:
    """Import what compiling and rendering a template uses, in this process: the forked child then
    imports nothing (an import lock another thread of this process held at the fork would hang
    the child, and read as a slow template). The compiling itself happens in the child: Jinja
    folds constants at compile time, so `'x' * 3000000000` is a bomb there already."""
    import jinja2.compiler  # noqa: F401
    import jinja2.ext  # noqa: F401
    import jinja2.sandbox  # noqa: F401
    import transformers.utils.chat_template_utils  # noqa: F401


def _address_space() -> int:
    """This process's virtual memory, in bytes (what the child inherits and already holds)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
