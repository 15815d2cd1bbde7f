"""Workspace code that tries to forge its own grade (issue 55): every route is graded a failure.

Each case is a wrong solution plus a payload that, by one route, tries to report every hidden
test as passed: the old results file, the grader's own message lines, every writable file, every
open file descriptor, the results pipe reopened through /proc; or, on the "functions" grader,
reads the hidden tests (files, /proc, memory) to return the values they assert, or plants a
module (in /grading, in the standard library) for the runner to import later. The payload
knows the test ids and c2's protocol (the strongest attacker short of reading the grader's
memory). Each runs on the "functions" grader (tests call the workspace through a worker process)
and on the pytest grader (tests and workspace share a process), where the route applies, and on
both backends (`backend`): the bubblewrap sandbox and podman containers. The container cases
need podman and a local base image (`python -m c2.envs.container base
localhost/c2-base:bookworm-min`), on which they build PYTHON_DOCKERFILE (Debian's python3 and
pytest) once; where either is missing they skip, saying which, and under CI=true they fail.
"""

import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import psutil
import pytest
from _support import skip_or_fail

from c2.envs import container_run
from c2.envs import functions as fn
from c2.envs.agents import ScriptedPolicy, tool_call
from c2.envs.container import (
    BASE_IMAGES,
    ContainerSandbox,
    engine_available,
    ensure_image,
    image_exists,
)
from c2.envs.episode import run_episode
from c2.envs.grading import grade, pytest_outcomes, runner_outcomes
from c2.envs.grading_channel import parse
from c2.envs.sandbox import SandboxLimits
from c2.envs.tasks import write_task

BASES = ("localhost/c2-base:bookworm-min", BASE_IMAGES["debian:bookworm-slim"])
PYTHON_DOCKERFILE = """FROM {base}
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 python3-pytest \
 >/dev/null && rm -rf /var/lib/apt/lists/* && ln -s /usr/bin/python3 /usr/local/bin/python
"""


def _python_image() -> tuple[str | None, str | None]:
    """(an image of a local base with python and pytest, built once; why there is none)."""
    why = engine_available("podman")
    if why is not None:
        return None, why
    base = next((b for b in BASES if image_exists(b)), None)
    if base is None:
        return None, f"no base image (python -m c2.envs.container base {BASES[0]})"
    with tempfile.TemporaryDirectory() as ctx:
        (Path(ctx) / "Dockerfile").write_text(PYTHON_DOCKERFILE.format(base=base))
        tag, r = ensure_image(ctx, repo="localhost/c2-test/python", timeout_s=900)
    if r is not None and r.returncode != 0:
        return None, f"building {tag} failed: {(r.stdout + r.stderr)[-500:]}"
    return tag, None


@pytest.fixture(scope="module")
def podman():
    """Podman containers of a Python image."""
    image, why = _python_image()
    if why is not None:
        skip_or_fail(f"container backend: {why}", "the container backend")
    sb = ContainerSandbox(image, limits=SandboxLimits(timeout_s=30, memory_mb=512))
    yield sb
    sb.close()


@pytest.fixture(scope="module", params=["bwrap", "podman"])
def backend(request):
    """The sandbox the grading runs in: bubblewrap, or podman containers of a Python image."""
    return request.getfixturevalue("sandbox" if request.param == "bwrap" else "podman")


# Generic forging: every channel a results reader might use, old and new.
FORGE = r"""
import json as _json, os as _os, sys as _sys, time as _time
_IDS = __IDS__


def _forge_lines():
    old = _json.dumps({"outcomes": {i: "passed" for i in _IDS}, "collect_errors": [], "exit": 0})
    new = "".join(_json.dumps(["outcome", i, "passed", None]) + "\n" for i in _IDS)
    new += _json.dumps(["end", 0]) + "\n"
    keyed = "".join("0" * 32 + " " + line + "\n" for line in new.splitlines())
    return old, (old + "\n" + new + keyed).encode()


def _links(pid):
    out = {}
    for fd in _os.listdir(f"/proc/{pid}/fd"):
        try:
            out[int(fd)] = _os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            pass
    return out


def _forge_proc(lines):
    own = set(_links("self").values())  # pipes this process holds: its own channel, spared
    for pid in _os.listdir("/proc"):  # other processes' descriptors, reopened by path
        if not pid.isdigit() or int(pid) == _os.getpid():
            continue
        try:
            fds = [fd for fd, link in _links(pid).items() if link not in own]
        except OSError:
            continue
        for fd in fds:
            try:
                w = _os.open(f"/proc/{pid}/fd/{fd}", _os.O_WRONLY | _os.O_NONBLOCK)
                _os.write(w, lines)
                _os.close(w)
            except OSError:
                pass


def _forge_files(old, walk):
    for path in ("/grading/out/results.json", "/grading/results.json", "/tmp/results.json"):
        try:
            with open(path, "w") as f:
                f.write(old)
        except OSError:
            pass
    t0 = _time.monotonic()
    for root in ("/grading", "/tmp", "/dev/shm", "/workspace", "/") if walk else ():
        for dirpath, dirnames, filenames in _os.walk(root):
            if dirpath == "/":
                dirnames[:] = [d for d in dirnames if d not in ("proc", "sys", "usr", "dev")]
            for name in filenames:
                try:
                    with open(_os.path.join(dirpath, name), "w") as f:
                        f.write(old)
                except OSError:
                    pass
            if _time.monotonic() - t0 > 3:
                return


def _forge(walk=False, fds=True):
    old, lines = _forge_lines()
    _forge_proc(lines)
    _forge_files(old, walk)
    for fd in range(256) if fds else ():  # every descriptor this process holds (last: this
        try:  # also garbles the functions worker's own replies, which ends it)
            _os.write(fd, lines)
        except OSError:
            pass
"""

# How the payload gets to run, beside the tests.
TRIGGERS = {
    "atexit": "import atexit\natexit.register(_forge)\n",
    "signal_handler": (
        "import signal\n"
        "for _s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGALRM):\n"
        "    signal.signal(_s, lambda *a: _forge())\n"
        "signal.setitimer(signal.ITIMER_REAL, 0.02, 0.02)\n"
    ),
    "forked_survivor": (
        "if _os.fork() == 0:\n"
        "    _os.setsid()\n"
        "    for _ in range(100):\n"
        "        _time.sleep(0.02)\n"
        "        _forge()\n"
        "    _os._exit(0)\n"
    ),
    "patch_sys_exit": (
        "import builtins\n"
        "def _exit(*a):\n"
        "    _forge()\n"
        "    _os._exit(0)\n"
        "_sys.exit = builtins.exit = builtins.quit = _exit\n"
    ),
    "patch_runner": (  # the functions runner's own functions, and pytest's report machinery
        "import __main__\n"
        "for _n in dir(__main__):\n"
        "    if callable(getattr(__main__, _n)) and not _n.startswith('__'):\n"
        "        try:\n"
        "            setattr(__main__, _n, lambda *a, **k: 'passed')\n"
        "        except Exception:\n"
        "            pass\n"
        "try:\n"
        "    import _pytest.python, _pytest.reports, _pytest.runner\n"
        "    _pytest.python.Function.runtest = lambda self: None\n"
        "    _init = _pytest.reports.TestReport.__init__\n"
        "    def _passed(self, *a, **k):\n"
        "        _init(self, *a, **k)\n"
        "        self.outcome, self.longrepr = 'passed', None\n"
        "    _pytest.reports.TestReport.__init__ = _passed\n"
        "    _pytest.runner.check_interactive_exception = lambda *a: False\n"
        "except ImportError:\n"
        "    pass\n"
        "import atexit\natexit.register(_forge)\n"
    ),
    "print_fake_lines": (
        "_old, _lines = _forge_lines()\n"
        "print(_old)\nprint(_lines.decode())\n"
        "_sys.stderr.write(_lines.decode())\n"
    ),
    "write_every_file": "_forge(walk=True, fds=False)\n",
    "reopen_fd_via_proc": "_forge_proc(_forge_lines()[1])\n",
}


def _payload(ids, trigger):
    return FORGE.replace("__IDS__", repr(list(ids))) + TRIGGERS[trigger]


def _final(task, tmp_path, sandbox, files, name):
    ws = tmp_path / name
    shutil.copytree(task.workspace_dir, ws)
    for rel, text in files.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    sandbox.give_workspace(ws)
    return ws


SHOP_TESTS = """from shop import price


def test_price():
    assert price(2, 3) == 6


def test_free():
    assert price(0, 3) == 0
"""
SHOP_WRONG = "def price(n, each):\n    return n + each - 3\n"


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """A pytest-graded task and a functions-graded one, each with a wrong solution."""
    root = tmp_path_factory.mktemp("forging")
    shop = write_task(
        root / "shop",
        instruction="price is wrong",
        metadata={
            "task_id": "shop",
            "fail_to_pass": ["tests/test_shop.py::test_price"],
            "pass_to_pass": ["tests/test_shop.py::test_free"],
            "difficulty": 1,
            "seed": 0,
            "source": "test",
        },
        workspace={"shop.py": SHOP_WRONG},
        tests={"test_shop.py": SHOP_TESTS},
        solution={"shop.py": "def price(n, each):\n    return n * each\n"},
    )
    f = fn.generate_function_tasks(root / "fn", 1, 3, "train")[0]
    m = f.metadata
    wrong = f"def {m['function']}({m['arg']}):\n    return None\n"
    return {"pytest": (shop, "shop.py", SHOP_WRONG), "functions": (f, m["file"], wrong)}


def _grade_attack(tasks, grader, files_of, tmp_path, sandbox, name):
    task, file, wrong = tasks[grader]
    ids = task.fail_to_pass + task.pass_to_pass
    ws = _final(task, tmp_path, sandbox, files_of(task, file, wrong, ids), name)
    g = grade(task, ws, sandbox)
    return task, g


def _assert_failed(task, g):
    assert not g.passed, g.correctness
    assert g.correctness["f2p_passed"] == 0, g.correctness
    assert "fail_to_pass still failing" in g.failure_reason
    assert task.fail_to_pass[0] in g.failure_reason


@pytest.mark.parametrize("grader", ["functions", "pytest"])
@pytest.mark.parametrize("trigger", sorted(TRIGGERS))
def test_forging_from_the_solution_module_fails(tasks, grader, trigger, tmp_path, backend):
    def files(task, file, wrong, ids):
        return {file: wrong + _payload(ids, trigger)}

    task, g = _grade_attack(tasks, grader, files, tmp_path, backend, trigger)
    _assert_failed(task, g)
    if grader == "pytest" and trigger != "patch_runner":  # the honest pass is still a pass
        assert g.correctness["pass_to_pass"] == {"tests/test_shop.py::test_free": True}


# Files the interpreter or pytest might load on their own, each carrying the payload.
STARTUP_FILES = {
    "conftest": ["conftest.py", "tests/conftest.py"],
    "pth": ["evil.pth", "site-packages/evil.pth"],
    "sitecustomize": ["sitecustomize.py", "usercustomize.py"],
}


@pytest.mark.parametrize("grader", ["functions", "pytest"])
@pytest.mark.parametrize("kind", sorted(STARTUP_FILES))
def test_forging_from_files_the_interpreter_might_load_fails(tasks, grader, kind, tmp_path,
                                                            backend):  # fmt: skip
    def files(task, file, wrong, ids):
        code = _payload(ids, "atexit") + "_forge()\n"
        out = {file: wrong}
        for rel in STARTUP_FILES[kind]:
            # A .pth line starting with "import" is executed by site.py wherever it is read.
            out[rel] = "import os; exec(" + repr(code) + ")\n" if rel.endswith(".pth") else code
        return out

    task, g = _grade_attack(tasks, grader, files, tmp_path, backend, kind)
    _assert_failed(task, g)


@pytest.mark.parametrize("grader", ["functions", "pytest"])
def test_replacing_deleting_or_renaming_the_tests_fails(tasks, grader, tmp_path, backend):
    def files(task, file, wrong, ids):
        # Passing copies of the hidden tests in the workspace, and a try at the mounted ones.
        fake = "".join(f"def {i.split('::')[1]}():\n    pass\n\n\n" for i in ids)
        tamper = (
            "import os\n"
            "for _d, _, _fs in os.walk('/grading'):\n"
            "    for _f in _fs:\n"
            "        for _op in (os.remove, lambda p: os.rename(p, p + '.gone')):\n"
            "            try:\n"
            "                _op(os.path.join(_d, _f))\n"
            "            except OSError:\n"
            "                pass\n"
        )
        test_file = ids[0].split("::")[0]
        return {file: wrong + tamper, test_file: fake, "tests/__init__.py": ""}

    task, g = _grade_attack(tasks, grader, files, tmp_path, backend, "tests")
    _assert_failed(task, g)


@pytest.mark.parametrize("grader", ["functions", "pytest"])
def test_os_exit_from_code_a_test_calls_fails_with_the_reason(tasks, grader, tmp_path, backend):
    def files(task, file, wrong, ids):
        return {file: "import os\n" + wrong.replace("return", "os._exit(0)\n    return")}

    task, g = _grade_attack(tasks, grader, files, tmp_path, backend, "exit")
    _assert_failed(task, g)
    if grader == "functions":
        function = task.metadata["function"]
        assert f"worker exited (code 0) during {function}(" in g.failure_reason
    else:
        assert "pytest exited (code 0) before the session ended" in g.failure_reason
        assert "never reported" in g.failure_reason


def test_a_result_equal_to_everything_cannot_pass_the_functions_grader(tasks, tmp_path, backend):
    def files(task, file, wrong, ids):
        liar = "class Liar:\n    def __eq__(self, other):\n        return True\n\n\n"
        return {file: liar + wrong.replace("return None", "return Liar()")}

    task, g = _grade_attack(tasks, "functions", files, tmp_path, backend, "eq")
    _assert_failed(task, g)
    assert "returned a Liar, which is not plain data" in g.failure_reason


# Planted by workspace code where the trusted runner might import from later: a textwrap that,
# loaded by the runner, replaces the runner's own _outcome, so every later test "passes".
PLANT = r'''
import importlib.util as _util, marshal as _marshal, os as _os

_FORGED = (
    "import sys\n"
    "FORGED = True\n"
    "if 'grading_runner' in sys.modules:\n"
    "    sys.modules['grading_runner']._outcome = lambda fn: 'passed'\n"
)


def _planted(where, stdlib):
    """(path, bytes) of the plant: a module in /grading, or in the standard library's own
    directory as source or as an unchecked hash-based pyc (PEP 552: loaded whatever the source
    beside it holds)."""
    if where == "grading_dir":
        return "/grading/textwrap.py", _FORGED.encode()
    source = stdlib + "/textwrap.py"
    if where == "stdlib_source":
        return source, _FORGED.encode()
    header = _util.MAGIC_NUMBER + (1).to_bytes(4, "little") + bytes(8)  # flags 1: unchecked
    code = _marshal.dumps(compile(_FORGED, source, "exec"))
    return _util.cache_from_source(source), header + code


def _plant(where, stdlib=_os.path.dirname(_os.__file__)):
    path, data = _planted(where, stdlib)
    try:
        _os.makedirs(_os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    except OSError:
        pass
'''
LATER_IMPORT_TESTS = """from calc import triple


def test_wraps():
    import textwrap  # the runner's first import of it: after workspace code ran

    assert textwrap is not None


def test_triple():
    assert triple(2) == 6
"""


@pytest.fixture(scope="module")
def later_import_task(tmp_path_factory):
    """A functions-graded task whose first test imports a standard module the runner has not
    loaded yet, and whose second test fails on the wrong solution."""
    return write_task(
        tmp_path_factory.mktemp("later") / "calc",
        instruction="triple is wrong",
        metadata={
            "task_id": "calc",
            "fail_to_pass": ["tests/test_calc.py::test_triple"],
            "pass_to_pass": ["tests/test_calc.py::test_wraps"],
            "difficulty": 1,
            "seed": 0,
            "source": "test",
            "grader": "functions",
        },
        workspace={"calc.py": "def triple(x):\n    return None\n"},
        tests={"test_calc.py": LATER_IMPORT_TESTS},
        solution={"calc.py": "def triple(x):\n    return 3 * x\n"},
    )


def test_the_planted_bytecode_is_what_python_loads(tmp_path):
    """Control: beside the real source, the planted pyc is what an import of -B Python loads."""
    ns: dict = {}
    exec(PLANT, ns)
    shutil.copy(textwrap.__file__, tmp_path / "textwrap.py")
    ns["_plant"]("stdlib_bytecode", str(tmp_path))
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import textwrap; "
    code += "print(getattr(textwrap, 'FORGED', False))"
    run = subprocess.run(
        [sys.executable, "-I", "-S", "-B", "-c", code], capture_output=True, text=True
    )
    assert run.stdout == "True\n", run.stderr


@pytest.mark.parametrize("where", ["grading_dir", "stdlib_source", "stdlib_bytecode"])
def test_a_module_planted_for_the_runner_to_import_later_fails(later_import_task, where,
                                                               tmp_path, backend):  # fmt: skip
    """Workspace code (in the worker, at the tests' collection) plants textwrap where the
    trusted runner would find it, in /grading or in the standard library; a hidden test imports
    textwrap afterwards: nothing the sandbox can write is ever imported by the runner."""
    task = later_import_task
    wrong = "def triple(x):\n    return None\n" + PLANT + f"_plant({where!r})\n"
    g = grade(task, _final(task, tmp_path, backend, {"calc.py": wrong}, where), backend)
    _assert_failed(task, g)
    # The import after the workspace code ran is the real module: nothing was planted.
    assert g.correctness["pass_to_pass"] == {"tests/test_calc.py::test_wraps": True}


@pytest.mark.parametrize("where", ["grading_dir", "stdlib_source", "stdlib_bytecode"])
def test_the_runner_imports_nothing_from_a_writable_root(later_import_task, where, tmp_path,
                                                         podman, monkeypatch):  # fmt: skip
    """Defence in depth: a grading container left with a writable root (as an episode's is),
    where the plant does land; the runner refuses every module on a writable filesystem, so
    the later import fails rather than run what the workspace wrote, and the note says why."""
    monkeypatch.setattr(container_run, "_scratch_only", lambda limits: [])
    task = later_import_task
    wrong = "def triple(x):\n    return None\n" + PLANT + f"_plant({where!r})\n"
    g = grade(task, _final(task, tmp_path, podman, {"calc.py": wrong}, where), podman)
    _assert_failed(task, g)
    assert g.correctness["pass_to_pass"] == {"tests/test_calc.py::test_wraps": False}
    assert "not imported, on a writable filesystem: textwrap: /" in g.failure_reason


# Reads the hidden tests wherever a process running workspace code might find them, and answers
# what they assert: "assert FN(arg) == value" in any test file, /proc/*/cmdline, environ, open
# descriptor, or the memory of any process it can read (its own included); and, having had its
# first worker end (so a fresh one is forked), the test functions' constants (arg, then the
# value asserted) among the objects and stack frames that worker inherited.
READER = r"""
import ast as _ast, os as _os, re as _re, time as _time

_ROOTS, _PROC, _DIE, _FOUND, _LOOKED = ("/grading", "/tmp", "/workspace", "/"), True, True, {}, []
_PATTERN = _re.compile(rb"__FN__\((.+?)\) == (.+)")


def _scan(data):
    for arg, want in _PATTERN.findall(data):
        try:
            _FOUND[repr(_ast.literal_eval(arg.decode()))] = _ast.literal_eval(want.decode())
        except Exception:
            pass


def _read(path):
    try:
        fd = _os.open(path, _os.O_RDONLY | _os.O_NONBLOCK)
        try:
            return _os.read(fd, 1 << 20)
        finally:
            _os.close(fd)
    except OSError:
        return b""


def _memory(pid):
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", buffering=0)
    except OSError:
        return
    with mem:
        for line in maps:
            (lo, hi), perms = line.split()[0].split("-"), line.split()[1]
            lo, hi = int(lo, 16), int(hi, 16)
            if perms.startswith("r") and hi - lo < 1 << 28:
                try:
                    mem.seek(lo)
                    _scan(mem.read(hi - lo))
                except (OSError, ValueError, OverflowError):
                    pass


def _look():
    t0 = _time.monotonic()
    for root in _ROOTS:
        for dirpath, dirnames, filenames in _os.walk(root):
            if dirpath == "/":
                dirnames[:] = [d for d in dirnames if d not in ("proc", "sys", "dev", "usr")]
            for name in filenames:
                if name.endswith((".py", ".pyc")):
                    _scan(_read(_os.path.join(dirpath, name)))
            if _time.monotonic() - t0 > 3:
                break
    for pid in _os.listdir("/proc") if _PROC else ():
        if pid.isdigit():
            _scan(_read(f"/proc/{pid}/cmdline") + _read(f"/proc/{pid}/environ"))
            try:
                fds = _os.listdir(f"/proc/{pid}/fd")
            except OSError:
                fds = []
            for fd in fds:
                _scan(_read(f"/proc/{pid}/fd/{fd}"))
            _memory(pid)


def _inherited():
    import gc, sys
    frame, objects = sys._getframe(), gc.get_objects()
    while frame is not None:
        objects += [frame.f_code, *frame.f_locals.values()]
        frame = frame.f_back
    for o in objects:
        try:  # a library object's __getattr__ may raise anything
            code = getattr(o, "__code__", o)
        except Exception:
            continue
        if type(code).__name__ == "code" and code.co_name.startswith("test"):
            c = code.co_consts
            for i in range(len(c) - 1):
                _FOUND.setdefault(repr(c[i]), c[i + 1])


def __FN__(__ARG__):
    if _DIE and not _os.path.exists("/tmp/.c2-reader-died"):
        open("/tmp/.c2-reader-died", "w").close()
        _os._exit(1)  # the next call goes to a freshly forked worker
    if not _LOOKED:
        _LOOKED.append(_look())
        _inherited()
    return _FOUND.get(repr(__ARG__))
"""


def _reader(task):
    m = task.metadata
    return READER.replace("__FN__", m["function"]).replace("__ARG__", m["arg"])


def test_the_test_reader_answers_from_tests_it_can_read(tasks):
    """Control: given the hidden tests as files it can read, the reader returns every asserted
    value (so it would pass, had the grader left them readable)."""
    task, _, _ = tasks["functions"]
    ns: dict = {}
    exec(_reader(task), ns)
    ns["_ROOTS"], ns["_PROC"], ns["_DIE"] = (str(task.tests_dir),), False, False
    f = ns[task.metadata["function"]]
    text = "".join(p.read_text() for p in task.tests_dir.glob("test_*.py"))
    asserted = [line.split("assert ", 1)[1] for line in text.splitlines() if "assert " in line]
    assert len(asserted) >= 2
    for line in asserted:
        call, want = line.split(" == ")
        assert eval(call, {task.metadata["function"]: f}) == eval(want), line


def test_reading_the_hidden_tests_cannot_pass_the_functions_grader(tasks, tmp_path, backend):
    """The functions grader's tests are mounted nowhere and reach only the trusted runner: the
    reader finds nothing to answer with (the pytest grader cannot close this: module doc)."""

    def files(task, file, wrong, ids):
        return {file: _reader(task)}

    task, g = _grade_attack(tasks, "functions", files, tmp_path, backend, "reader")
    _assert_failed(task, g)
    assert "worker exited (code 1)" in g.failure_reason  # it did end its first worker


def _processes_with(marker):
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            pass
    return found


def test_a_daemon_left_by_the_episode_cannot_touch_the_grading(tasks, tmp_path, backend):
    """An episode's command daemonises a forger (setsid, double fork, nohup) that loops writing
    forged results everywhere and signalling every process; it is dead before grading starts
    (bubblewrap: when its command ended; a container: its episode container is stopped)."""
    task, file, wrong = tasks["functions"]
    marker = "c2daemon5309"
    loop = _payload(task.fail_to_pass, "reopen_fd_via_proc") + (
        "import signal\n"
        "_time.sleep(1)  # let the episode's command finish: the grader is the target\n"
        "while True:\n"
        "    _forge()\n"
        "    for _p in _os.listdir('/proc'):\n"
        "        if _p.isdigit() and int(_p) != _os.getpid():\n"
        "            try:\n"
        "                _os.kill(int(_p), signal.SIGSTOP)\n"
        "            except OSError:\n"
        "                pass\n"
        "    _time.sleep(0.01)\n"
    )
    fork = (
        "import os\nif os.fork() == 0:\n    os.setsid()\n"
        f"    os.execvp('python', ['python', '/tmp/d.py', '{marker}'])\n"
    )
    quiet = ">/dev/null 2>&1 </dev/null"
    command = (
        f"cat > /tmp/d.py <<'EOF'\n{loop}\nEOF\n"
        f'(setsid nohup python /tmp/d.py {marker} {quiet} &); python -c "{fork}" {quiet}; echo up'
    )
    policy = ScriptedPolicy([
        tool_call("run", command=command),
        tool_call("write_file", path=file, content=wrong),
        tool_call("submit", message="done"),
    ])  # fmt: skip
    ep = run_episode(task, policy, backend, tmp_path / "eps")
    assert "up" in ep.records[0]["tool_calls"][0]["result"]
    survivors = _processes_with(marker)
    if isinstance(backend, ContainerSandbox):  # background processes live on, as in Harbor
        assert len(survivors) == 2, survivors
    else:
        assert not survivors  # reaped when its command ended, before grading
    g = grade(task, ep.workspace, backend, ep)
    assert not _processes_with(marker)
    _assert_failed(task, g)
    assert g.correctness["tests_error"] is None  # the grading ran undisturbed


def test_the_payload_speaks_the_graders_protocol(tasks):
    """Control: what the payload writes would read as all-passed if it reached c2's reader."""
    task, _, _ = tasks["functions"]
    ns: dict = {}
    exec(FORGE.replace("__IDS__", repr(task.fail_to_pass)), ns)
    old, lines = ns["_forge_lines"]()
    assert set(json.loads(old)["outcomes"]) == set(task.fail_to_pass)
    got = parse(lines.split(b"\n", 1)[1])
    assert got.ended and got.outcomes == dict.fromkeys(task.fail_to_pass, "passed")


PROBE = """import os
import time


def reachable(spared=()):
    '''[whether a same-uid process's pipe can be reopened (the control), the other processes'
    pipes this one could reopen for writing through /proc, but those of programs in `spared`].'''
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        time.sleep(30)
        os._exit(0)
    os.close(w)
    control, found = False, []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{p}/fd")
            program = open(f"/proc/{p}/cmdline", "rb").read().split(b"\\0")[0].decode()
        except OSError:
            continue
        if program in spared:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{p}/fd/{fd}")
                os.close(os.open(f"/proc/{p}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                continue
            if int(p) == pid:
                control = control or target.startswith("pipe:")
            elif target.startswith("pipe:"):
                found.append(f"{p}:{fd}:{target}")
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return [control, found]
"""


@pytest.mark.parametrize("outcomes", [runner_outcomes, pytest_outcomes])
def test_no_sandboxed_process_can_reopen_the_trusted_pipes(outcomes, tmp_path, backend):
    # A container's init and its sleep hold pipes to the engine's log (never to c2).
    spared = ("/run/podman-init", "sleep") if isinstance(backend, ContainerSandbox) else ()
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_probe.py").write_text(
        "from probe import reachable\n\n\n"
        f"def test_probe():\n    assert reachable({spared!r}) == [True, []]\n"
    )
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "probe.py").write_text(PROBE)
    backend.give_workspace(ws)
    run = outcomes(tests, ws, backend, limits=SandboxLimits(timeout_s=20))
    assert run.outcomes == {"tests/test_probe.py::test_probe": "passed"}, run.sandbox.stdout[-2000:]
    assert run.error is None
