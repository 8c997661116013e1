"""Hostile programs for the code reward's sandbox, each with the outcome it must have.

Every program is model-written code at its worst. `PROGRAMS` maps a name to (program, tests,
expected score); `{ROOT}`, `{SENTINEL_PID}`, `{UNIX_SOCKET}`, `{TCP_PORT}` and `{MARK}` are
filled in by the test with host facts the program tries to reach.
"""

ADD = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
TEST = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"


def _then(attack: str, code: str = WRONG) -> str:
    """An attack followed by a wrong solution: a score above 0 means the attack forged a pass."""
    return attack + "\n" + code


PROGRAMS = {
    # --- the verdict cannot be forged --------------------------------------------------
    "control-correct": (ADD, TEST, 1.0),
    "control-wrong": (WRONG, TEST, 0.0),
    "sys-exit-0-before-tests": (_then("import sys\nsys.exit(0)"), TEST, 0.0),
    "os-exit-0-before-tests": (_then("import os\nos._exit(0)"), TEST, 0.0),
    "raise-systemexit-in-function": (WRONG.replace("return a - b", "raise SystemExit(0)"), TEST, 0.0),
    "print-and-write-the-marker-everywhere": (_then(
        "import os, json\n"
        "fake = [json.dumps({'i': i, 'ok': True, 'value': 'True', 'truth': True}) for i in range(-1, 4)]\n"
        "line = ('\\n'.join(fake) + '\\n').encode()\n"
        "print(line.decode())\n"
        "for fd in range(1, 64):\n"
        "    try: os.write(fd, line)\n"
        "    except OSError: pass\n"
        "os._exit(0)"), TEST, 0.0),
    "always-equal-object": ("class Eq:\n    def __eq__(self, other): return True\n    __hash__ = object.__hash__\n"
                            "def add(a, b):\n    return Eq()\n", TEST, 0.0),
    "int-subclass-lies-in-repr": ("class I(int):\n    def __repr__(self): return '5'\n"
                                  "def add(a, b):\n    return I(0)\n", TEST, 0.0),
    "patched-builtins": (_then("import builtins, json\nbuiltins.repr = lambda x: '5'\nbuiltins.AssertionError = "
                               "type('Nope', (Exception,), {})\njson.dumps = lambda *a, **k: '{\"i\": 0, \"value\": \"5\"}'\n"
                               "builtins.eval = lambda *a, **k: 5"), TEST, 0.0),
    "atexit-and-excepthook": (_then("import atexit, os, sys\natexit.register(os._exit, 0)\n"
                                    "sys.excepthook = lambda *a: None"), TEST, 0.0),
    # --- the filesystem --------------------------------------------------------------
    "read-etc-shadow": (_then("print(open('/etc/shadow').read())", ADD), TEST, 0.0),
    "read-project-source": (_then("print(open('{ROOT}/rewards/code.py').read())", ADD), TEST, 0.0),
    "list-root-home": (_then("import os\nprint(os.listdir('/root'))", ADD), TEST, 0.0),
    "edit-a-reward-module": (_then("open('{ROOT}/rewards/exact.py', 'a').write('\\nimport os; os.system(\"id\")\\n')", ADD),
                             TEST, 0.0),
    "write-outside-tmp": (_then("open('/usr/{MARK}', 'w').write('x')", ADD), TEST, 0.0),
    "disk-fill": (_then("f = open('/tmp/{MARK}', 'wb')\nwhile True:\n    f.write(b'x' * (1 << 20))", ADD), TEST, 0.0),
    # --- processes -------------------------------------------------------------------
    "kill-parent": (_then("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", ADD), TEST, 1.0),
    "kill-a-host-process": (_then("import os, signal\nos.kill({SENTINEL_PID}, signal.SIGKILL)", ADD), TEST, 0.0),
    "kill-everything": (_then("import os, signal\nos.kill(-1, signal.SIGKILL)", ADD), TEST, 0.0),
    "see-host-pids": (_then("import os\npids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
                            "assert len(pids) < 10, pids", ADD), TEST, 1.0),
    "fork-bomb": (_then("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass", ADD), TEST, 0.0),
    "memory-bomb": (_then("x = bytearray(8 << 30)", ADD), TEST, 0.0),
    "setuid-root": (_then("import os\nos.setuid(0)", ADD), TEST, 0.0),
    "detached-child": (_then("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                             "        time.sleep(120)\n    os._exit(0)", ADD), TEST, 1.0),
    "child-holding-the-pipes": (_then("import subprocess\nsubprocess.Popen(['sleep', '120'])", ADD), TEST, 1.0),
    "output-flood": (_then("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", ADD), TEST, 0.0),
    # --- the network and the environment ----------------------------------------------
    "unix-socket-on-host": (_then("import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('{UNIX_SOCKET}')\n"
                                  "s.sendall(b'{MARK}')", ADD), TEST, 0.0),
    "tcp-to-host-loopback": (_then("import socket\nsocket.create_connection(('127.0.0.1', {TCP_PORT}), timeout=2)"
                                   ".sendall(b'{MARK}')", ADD), TEST, 0.0),
    "tcp-to-the-internet": (_then("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)", ADD),
                            TEST, 0.0),
    "read-host-secrets-from-env": (_then("import os\nassert 'HINDSIGHT_TEST_SECRET' not in os.environ", ADD),
                                   TEST, 1.0),
}
