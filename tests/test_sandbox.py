"""Model-written code in the sandbox (generation/sandbox.py, generation/tools.py): each hostile call the
issue names is refused or cut off, and ordinary code still runs."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from smolforge.generation.sandbox import network_isolation, run_python
from smolforge.generation.tools import calculator, python_tool


def test_ordinary_code_runs_and_writes_only_its_own_folder():
    result = run_python("import json, math\nopen('notes.txt', 'w').write('kept')\n"
                        "print(json.dumps({'root': math.isqrt(144), 'notes': open('notes.txt').read()}))")
    assert (result.outcome, result.stdout) == ("ok", '{"root": 12, "notes": "kept"}\n')


@pytest.mark.parametrize("code, outcome, says", [
    ("print(open('/etc/passwd').read())", "refused", "open '/etc/passwd': outside the sandbox folder"),
    ("open('/tmp/smolforge-escape.txt', 'w').write('x')", "refused", "outside the sandbox folder"),
    ("import os; print(os.listdir('/'))", "refused", "listing '/': outside the sandbox folder"),
    ("import os\nwhile True:\n    os.fork()", "refused", "os.fork: not allowed"),
    ("import subprocess; subprocess.run(['sh', '-c', 'echo hi'])", "refused", "import _posixsubprocess: not allowed"),
    ("import _posixsubprocess", "refused", "import _posixsubprocess: not allowed"),   # its fork_exec has no audit event
    ("import os; os.system('id')", "refused", "os.system: not allowed"),
    ("import ctypes; ctypes.CDLL(None).fork()", "refused", "import ctypes: not allowed"),
    ("import os; os.remove('/tmp/smolforge-someone-elses-file')", "refused", "os.remove '/tmp/smolforge-someone-elses-file'"),
    ("import shutil; shutil.rmtree('/tmp')", "refused", "shutil.rmtree '/tmp': outside the sandbox folder"),
    ("import os; os.rename('tool.py', '/tmp/moved.py')", "refused", "os.rename '/tmp/moved.py'"),
    ("x = bytearray(4 * 1024**3)", "memory_limit", "MemoryError"),
])
def test_a_hostile_call_is_refused(code, outcome, says):
    result = run_python(code)
    assert result.outcome == outcome and says in result.stderr, result


def test_native_code_written_into_the_folder_does_not_load_but_python_source_does():
    """A copy of one of Python's own extension modules, written into the folder under a new name, would run
    native code without the audit hook: refused. A module of Python source written there imports."""
    code = ("import _json, importlib.machinery, sys\n"
            "suffix = importlib.machinery.EXTENSION_SUFFIXES[0]\n"
            "open('evil' + suffix, 'wb').write(open(_json.__file__, 'rb').read())\n"
            "open('helper.py', 'w').write('ANSWER = 42')\n"
            "sys.path.insert(0, '.')\n"
            "import helper\n"
            "print(helper.ANSWER, flush=True)\n"
            "import evil\n")
    result = run_python(code, output_bytes=4 * 2**20)      # RLIMIT_FSIZE caps every file the code writes
    assert result.outcome == "refused" and result.stdout == "42\n"
    assert "import evil from" in result.stderr and "only Python source loads" in result.stderr


def test_a_socket_reaches_nothing_even_a_server_listening_on_this_machine():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    port = server.getsockname()[1]
    try:
        result = run_python(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                            "s.sendall(b'secret')")
        assert result.outcome == "refused" and "socket" in result.stderr
        time.sleep(0.2)
        assert accepted == []
    finally:
        server.close()
    assert network_isolation() == [] or result.isolated_network     # a namespace of its own where allowed


def test_an_endless_loop_and_a_sleeper_are_cut_off_and_leave_nothing_running():
    import subprocess

    started = time.perf_counter()
    spin = run_python("while True:\n    pass", cpu_seconds=1)
    assert spin.outcome == "cpu_limit" and time.perf_counter() - started < 10
    sleeper = run_python("import time\ntime.sleep(60)", wall_seconds=1.5)
    assert sleeper.outcome == "timeout"
    left = subprocess.run(["pgrep", "-f", "smolforge-tool-"], capture_output=True, text=True).stdout.split()
    assert left == []


def test_a_huge_print_is_cut_at_the_output_limit():
    result = run_python("print('x' * 10**8)", output_bytes=4096)
    assert result.outcome == "output_limit" and len(result.stdout) <= 4096


def test_the_tools_answer_the_model_with_text_even_when_it_errs():
    assert calculator("(17 + 25) * 3") == "126" and calculator("1/0") == "error: division by zero"
    assert calculator("open('x')").startswith("error: only numbers")
    assert python_tool("print(2**100)") == "1267650600228229401496703205376\n"
    assert python_tool("import os; os.system('id')").startswith("error (refused): SandboxRefused: os.system")
    assert python_tool("import os\nos.mkdir('scratch')\nos.rename('scratch', 'kept')\nprint(sorted(os.listdir('.')))") == \
        "['kept', 'tool.py']\n"                           # inside its own folder, anything goes
