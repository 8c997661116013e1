"""Tools report failure as failure: the built-in python tool returns a failing program's exception
(its type and message, MemoryError included) with error=True, and a sandboxed user tool's
exception reaches the model as its type and message (it read `RuntimeError: exit 0`)."""
import pytest

from hindsight.rollout.multiturn.tools import Tool, ToolCall, Toolbox
from rewards.sandbox import Limits
from rewards.tools import ToolSandbox
from tests.sandbox.sandboxed_divide import divide

PROGRAMS = {
    "raises-after-printing": ("print('partial')\n1 / 0\n", "ZeroDivisionError: division by zero", "partial"),
    "out-of-memory": ("x = bytearray(2 * 1024**3)\n", "MemoryError", None),
    "read-only-path": ("open('/usr/lib/x', 'w').write('y')\n", "Error: [Errno", None),
    "exits": ("import sys\nprint('bye')\nsys.exit(3)\n", "SystemExit: 3", "bye"),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_failing_program_is_an_error_turn_with_its_exception(name):
    code, said, printed = PROGRAMS[name]
    box = ToolSandbox(Limits(timeout_s=20, cpu_s=10, memory_mb=256))
    turn = Toolbox([Tool(box.python_tool(20.0), "t", "in_process", 60.0)]).call(ToolCall("python", {"code": code}))
    assert turn.error, turn.content
    assert turn.content.startswith("error: ") and said in turn.content, turn.content
    if printed:
        assert printed in turn.content


def test_a_good_program_is_its_output():
    box = ToolSandbox(Limits(timeout_s=20, cpu_s=10, memory_mb=256))
    turn = Toolbox([Tool(box.python_tool(20.0), "t", "in_process", 60.0)]).call(
        ToolCall("python", {"code": "print(6 * 7)"}))
    assert not turn.error and turn.content.strip() == "42"


def test_a_sandboxed_tools_exception_reaches_the_model():
    box = ToolSandbox(Limits(timeout_s=20, cpu_s=10, memory_mb=256))
    tools = Toolbox([Tool(divide, "t", "sandbox", 20.0, box)])
    bad, good = tools.call_all([ToolCall("divide", {"a": 1, "b": 0}), ToolCall("divide", {"a": 7, "b": 2})])
    assert bad.error and bad.content == "error: ZeroDivisionError: integer division or modulo by zero"
    assert not good.error and good.content == "3"
