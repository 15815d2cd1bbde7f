"""Hostile code stays contained: each test checks the host afterwards, not just the return."""

import hashlib
import os
import re
import socket
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from c2.envs.agents import ScriptedPolicy, tool_call
from c2.envs.episode import EpisodeConfig, run_episode
from c2.envs.grading import grade
from c2.envs.sandbox import SandboxLimits
from c2.envs.tasks import write_task
from c2.envs.tools import ToolCall, Tools


def _with_marker(marker):
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            pass
    return found


def test_process_flood_is_capped_and_reaped(sandbox, workspace):
    marker = "c2-forkbomb-5150"  # forked shells keep the command line, marker included
    limits = SandboxLimits(timeout_s=5, max_processes=32)
    r = sandbox.run(
        f"bomb() {{ bomb | bomb & }}; bomb; sleep 3 # {marker}", workspace, limits=limits
    )
    if sandbox.isolation.cgroups is not None:
        assert "processes" in r.limits_hit, sandbox.isolation.describe()
    assert not _with_marker(marker)  # every process of the flood is gone
    assert sandbox.run("echo alive", workspace).stdout == "alive\n"  # the harness still works


def test_memory_hog_is_killed(sandbox, workspace):
    limits = SandboxLimits(timeout_s=20, memory_mb=96)
    r = sandbox.run(["python", "-c", "x = bytearray(1 << 31); print('allocated')"], workspace,
                    limits=limits)  # fmt: skip
    assert "allocated" not in r.stdout and r.exit_code != 0
    if sandbox.isolation.cgroups is not None:
        backend = sandbox.isolation.describe()
        assert r.limit == "memory" and r.memory_peak_mb <= 96 + 1, backend


def test_infinite_loop_stops_at_the_deadline(sandbox, workspace):
    code = "while True: pass  # c2-spin-6061"
    r = sandbox.run(["python", "-c", code], workspace, limits=SandboxLimits(timeout_s=2))
    assert r.timed_out and r.limit in ("wall_time", "cpu")
    assert not _with_marker("c2-spin-6061")


def test_output_flood_is_bounded(sandbox, workspace):
    limits = SandboxLimits(timeout_s=20, max_output_bytes=50_000)
    r = sandbox.run("yes flood; yes flood >&2", workspace, limits=limits)
    assert r.limit == "output" and r.stdout_truncated
    assert len(r.stdout) + len(r.stderr) <= 50_000
    assert not r.timed_out


def test_writes_outside_the_workspace_change_nothing(sandbox, workspace, tmp_path):
    host_file = tmp_path / "host.txt"
    host_file.write_text("original\n")
    before = sorted(os.listdir(tmp_path))
    r = sandbox.run(
        f"echo evil > {host_file}; echo evil > /workspace/../host.txt; echo evil > /usr/evil; "
        "echo evil >> /etc/passwd; mkdir -p /root/evil; echo evil > /tmp/evil; "
        f"ls {tmp_path} 2>&1; echo done",
        workspace,
    )
    assert r.stdout.endswith("done\n")
    assert host_file.read_text() == "original\n"
    assert sorted(os.listdir(tmp_path)) == before
    assert not os.path.exists("/usr/evil") and not os.path.exists("/root/evil")
    assert "evil" not in Path("/etc/passwd").read_text()


def test_reads_outside_the_workspace_fail_including_symlinks(sandbox, workspace, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET-42\n")
    os.symlink(secret, workspace / "link")
    os.symlink("/etc/shadow", workspace / "shadow")
    os.symlink("../secret.txt", workspace / "rel")
    r = sandbox.run(
        f"cat link shadow rel {secret} /etc/shadow /proc/1/root{secret} ../secret.txt 2>&1; "
        "ls /root /home 2>&1",
        workspace,
    )
    assert "TOPSECRET" not in r.stdout + r.stderr
    assert not re.search(r"(?m)^root:", r.stdout)  # no line of the host's shadow file
    tools = Tools(workspace, sandbox)
    for path in ("link", "rel", "shadow", str(secret), "../secret.txt"):
        res = tools(ToolCall("read_file", {"path": path}))
        assert res.error == "bad_path" and "TOPSECRET" not in res.content
    res = tools(ToolCall("edit", {"path": "shadow", "old": "root", "new": "x"}))
    assert res.error == "bad_path"
    res = tools(ToolCall("write_file", {"path": "link", "content": "overwrite"}))
    assert res.error == "bad_path" and secret.read_text() == "TOPSECRET-42\n"


def test_no_connection_to_a_server_on_host_loopback(sandbox, workspace):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                accepted.append(conn)
            except TimeoutError:
                pass

    t = threading.Thread(target=serve)
    t.start()
    try:
        code = (
            "import socket\n"
            f"for host in ('127.0.0.1', 'localhost', '10.0.2.2'):\n"
            "    try:\n"
            f"        socket.create_connection((host, {port}), timeout=2); print('CONNECTED')\n"
            "    except OSError as e:\n"
            "        print('refused', e.errno)\n"
        )
        r = sandbox.run(["python", "-c", code], workspace)
        # The control: the host itself can connect.
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        time.sleep(0.5)
    finally:
        stop.set()
        t.join()
        server.close()
    assert "CONNECTED" not in r.stdout and r.stdout.count("refused") == 3
    assert len(accepted) == 1  # only the host's control connection


def test_killing_its_parent_does_not_reach_the_host(sandbox, workspace):
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        r = sandbox.run(
            "kill -9 $PPID; kill -9 1; kill -9 -1; "
            f"kill -9 {os.getpid()} {bystander.pid} 2>&1; "
            "python -c 'import os, signal; os.kill(os.getppid(), signal.SIGKILL)'; echo still-here",
            workspace,
        )
        assert bystander.poll() is None and psutil.pid_exists(os.getpid())
        assert r.exit_code is not None
    finally:
        bystander.kill()
        bystander.wait()
    assert sandbox.run("echo ok", workspace).stdout == "ok\n"


def test_daemonised_orphan_does_not_outlive_the_call(sandbox, workspace):
    marker = "c2orphan4711"
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(1.5)\n"
        "        open('/workspace/late.txt', 'w').write('escaped')\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "print('parent done')\n"
    )
    r = sandbox.run(f'nohup sleep 61 >/dev/null 2>&1 & python -c "{code}" {marker}', workspace)
    assert "parent done" in r.stdout
    assert not _with_marker(marker) and not _with_marker("sleep 61")
    time.sleep(2.5)
    assert not (workspace / "late.txt").exists()
    assert not _with_marker(marker)


_TINY_TESTS = """from dbl import double


def test_double():
    assert double(4) == 8


def test_zero():
    assert double(0) == 0
"""


_DOUBLE_OK = "def double(x):\n    return 2 * x\n"


def _tiny_task(root):
    src_ok = _DOUBLE_OK
    meta = {
        "task_id": "tiny",
        "fail_to_pass": ["tests/test_dbl.py::test_double"],
        "pass_to_pass": ["tests/test_dbl.py::test_zero"],
        "difficulty": 1,
        "seed": 0,
        "source": "test",
    }
    return write_task(
        root,
        instruction="double() is wrong; fix it.",
        metadata=meta,
        workspace={"dbl.py": src_ok.replace("2 * x", "x * x"), "tests/test_dbl.py": _TINY_TESTS},
        tests={"test_dbl.py": _TINY_TESTS},
        solution={"dbl.py": src_ok},
    )


def _tree_hash(path):
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        h.update(str(p.relative_to(path)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def test_deleting_the_hidden_tests_is_futile(sandbox, tmp_path):
    task = _tiny_task(tmp_path / "task")
    hidden = _tree_hash(task.tests_dir)
    policy = ScriptedPolicy([
        tool_call("run", command="rm -rf tests /grading /tests ../tests; "
                  f"rm -rf {task.tests_dir}; find / -name 'test_*.py' -delete 2>/dev/null; ls"),
        tool_call("write_file", path="tests/test_dbl.py", content="def test_double():\n    pass\n"),
        tool_call("submit", message="deleted the tests"),
    ])  # fmt: skip
    ep = run_episode(task, policy, sandbox, tmp_path / "eps")
    g = grade(task, ep.workspace, sandbox, ep)
    assert _tree_hash(task.tests_dir) == hidden
    assert not g.passed
    assert g.correctness["fail_to_pass"] == {"tests/test_dbl.py::test_double": False}
    assert "fail_to_pass still failing" in g.failure_reason


@pytest.mark.slow
def test_hostile_episode_is_graded_as_failure_with_reason(sandbox, tmp_path):
    task = _tiny_task(tmp_path / "task")
    host_file = tmp_path / "host.txt"
    host_file.write_text("original\n")
    hostile = [
        "bomb() { bomb | bomb & }; bomb; sleep 2",
        "python -c 'x = bytearray(1 << 32)'",
        "yes",
        "while true; do :; done",
        "(setsid sleep 600 &); echo spawned",
        f"echo evil > {host_file}; echo evil >> /etc/passwd; cat {host_file}",
        "python -c \"import socket; socket.create_connection(('127.0.0.1', 22), timeout=1)\"",
        "kill -9 $PPID; kill -9 -1; rm -rf /grading /tests ../tests",
    ]
    config = EpisodeConfig(
        run_limits=SandboxLimits(
            timeout_s=3, memory_mb=128, max_processes=32, max_output_bytes=20_000
        ),  # fmt: skip
        max_run_timeout_s=3,
    )
    # The episode also writes the correct fix: only the limits it hit can make it fail.
    policy = ScriptedPolicy([tool_call("run", command=c) for c in hostile]
                            + [tool_call("write_file", path="dbl.py", content=_DOUBLE_OK),
                               tool_call("submit", message="done")])  # fmt: skip
    ep = run_episode(task, policy, sandbox, tmp_path / "eps", config)
    g = grade(task, ep.workspace, sandbox, ep)
    assert ep.stop_reason == "submit" and ep.tool_calls == len(hostile) + 2
    assert g.correctness["f2p_passed"] == 1 and g.correctness["p2p_passed"] == 1
    assert not g.passed
    hit = set(g.interaction["sandbox_limits_hit"])
    assert "output" in hit
    # The busy loop: its 3 s of CPU time and of wall time run out together, and which limit is
    # noticed first depends on the load (a starved monitor sees SIGXCPU first).
    assert hit & {"wall_time", "cpu"}
    if sandbox.isolation.cgroups is not None:
        assert {"memory", "processes"} <= hit, sandbox.isolation.describe()
    assert g.failure_reason.startswith("sandbox limits hit during the episode: ")
    assert all(x in g.failure_reason for x in hit)
    assert not _with_marker("sleep 600")
    assert host_file.read_text() == "original\n" and "evil" not in Path("/etc/passwd").read_text()
    assert g.correctness["tests_limits_hit"] == []  # the hidden tests ran cleanly
