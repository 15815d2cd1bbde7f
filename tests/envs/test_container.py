"""The container backend: a tiny Harbor task with a Dockerfile, imported for podman, its image
built, then oracle / noop / wrong-solution episodes graded end to end in containers; and the
sandbox contract (timeout, memory, output, network) of ContainerSandbox.

The engine tests need podman (with runc) and the local base image BASE (`python -m
c2.envs.container base localhost/c2-base:bookworm`); where either is missing they are skipped,
saying which, and under CI=true they fail, saying which (CI installs both: .ci/run).
"""

import dataclasses
import http.server
import json
import os
import socket
import subprocess
import threading
import time
from types import SimpleNamespace

import pytest
from _support import skip_or_fail

from c2.envs.agents import noop_policy, oracle_policy
from c2.envs.container import (
    BASE_IMAGES,
    CAPABILITIES,
    USERNS_BASE,
    UV_VERSION,
    ContainerSandbox,
    build_image,
    context_hash,
    engine_available,
    from_images,
    image_exists,
    map_from_lines,
    tool_image,
    transient_network_error,
)
from c2.envs.evaluate import evaluate
from c2.envs.grading import _harbor_reward, _run_harbor
from c2.envs.harbor_bench import with_backend
from c2.envs.harbor_import import import_harbor_tasks
from c2.envs.sandbox import Sandbox, SandboxError, SandboxLimits
from c2.envs.tasks import load_task, validate_metadata

FULL_BASE = BASE_IMAGES["debian:bookworm-slim"]
MIN_BASE = "localhost/c2-base:bookworm-min"  # what .ci/run builds (no uv, no Python 3.13)


def test_from_lines_map_onto_local_bases():
    text = "FROM python:3.13-slim-bookworm\nRUN x\nFROM --platform=linux/amd64 ubuntu:24.04 AS b\n"
    out = map_from_lines(text, {"python:3.13-slim-bookworm": MIN_BASE, "ubuntu:24.04": "u"})
    assert out.splitlines() == [f"FROM {MIN_BASE}", "RUN x", "FROM --platform=linux/amd64 u AS b"]


def test_copy_from_uv_images_map_onto_local_stand_ins():
    """uv's release images (COPY --from=ghcr.io/astral-sh/uv:X /uv /uvx /bin/) become local
    images of the same version; stages and other images are left alone."""
    assert tool_image("ghcr.io/astral-sh/uv:0.8.14") == "localhost/c2-uv:0.8.14"
    assert tool_image("astral/uv:0.9.5") == "localhost/c2-uv:0.9.5"
    for other in ("ghcr.io/astral-sh/uv:latest", "ghcr.io/astral-sh/uv:0.8.14-bookworm", "build"):
        assert tool_image(other) is None
    text = (
        "FROM ubuntu:24.04 as build\n"
        "COPY --from=ghcr.io/astral-sh/uv:0.8.14 /uv /uvx /bin/\n"
        "COPY --chown=1 --from=ghcr.io/astral-sh/uv:0.8.15 /uv /bin/\n"
        "COPY --from=build /app /app\n"
        "COPY --from=ghcr.io/other/tool:1 /t /t\n"
    )
    assert map_from_lines(text, {}).splitlines() == [
        "FROM ubuntu:24.04 as build",
        "COPY --from=localhost/c2-uv:0.8.14 /uv /uvx /bin/",
        "COPY --chown=1 --from=localhost/c2-uv:0.8.15 /uv /bin/",
        "COPY --from=build /app /app",
        "COPY --from=ghcr.io/other/tool:1 /t /t",
    ]


def test_transient_network_errors_are_told_from_lasting_ones():
    assert transient_network_error(
        "RUN pip install mteb\n...\npip._vendor.urllib3.exceptions.ReadTimeoutError: "
        "HTTPSConnectionPool(host='files.pythonhosted.org', port=443): Read timed out.\n"
    )
    assert transient_network_error(
        "socket.gaierror: [Errno -3] Temporary failure in name resolution"
    )
    assert not transient_network_error(
        "RUN git clone https://github.com/x/y\nfatal: unable to access: Could not resolve host"
    )
    assert not transient_network_error("ERROR: No matching distribution found for nosuchpkg")
    assert not transient_network_error("Read timed out\n" + "x" * 4000)  # not the failing step


def test_from_images_skips_stage_names():
    text = "FROM ubuntu:24.04 AS build\nRUN x\nFROM build\nFROM debian:13.0-slim\n"
    assert from_images(text) == ["ubuntu:24.04", "debian:13.0-slim"]


def test_context_hash_follows_the_build_context(tmp_path):
    """With or without a container engine here (without one, a local base counts by its name)."""
    (tmp_path / "Dockerfile").write_text("FROM debian:bookworm-slim\nCOPY a /a\n")
    (tmp_path / "a").write_text("1")
    h1 = context_hash(tmp_path)
    assert context_hash(tmp_path) == h1
    (tmp_path / "a").write_text("2")
    assert context_hash(tmp_path) != h1


def test_missing_archive_keyring_is_named_with_where_to_get_it(tmp_path, monkeypatch):
    """Debian has no Ubuntu keyring package: a base of Ubuntu's archive says which file is
    missing and how to install it, before mmdebstrap runs."""
    from c2.envs import container_images as container

    keyring = str(tmp_path / "ubuntu-archive-keyring.gpg")
    monkeypatch.setattr(container, "engine_command", lambda engine="podman": [engine])
    monkeypatch.setattr(container.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setitem(
        container.BASES, "localhost/t:noble", container.BaseRecipe("noble", keyring=keyring)
    )
    monkeypatch.setitem(container.KEYRING_HINTS, keyring, "install ubuntu-keyring")
    with pytest.raises(container.SandboxError) as e:
        container.build_base_image("localhost/t:noble")
    assert str(e.value) == (
        f"localhost/t:noble: the archive keyring {keyring} is missing (install ubuntu-keyring)"
    )
    assert container.BASES["localhost/c2-base:noble"].keyring in container.KEYRING_HINTS


def test_container_metadata_is_checked():
    meta = {
        "task_id": "t",
        "fail_to_pass": ["tests/test.sh"],
        "pass_to_pass": [],
        "difficulty": "x",
        "seed": 0,
        "source": "harbor",
        "grader": "harbor",
    }
    validate_metadata({**meta, "container": {"image": "localhost/x:1"}}, "m")
    for bad in ({"engine": "podman"}, {"image": "x", "engine": "lxc"}, "x"):
        with pytest.raises(ValueError, match="container"):
            validate_metadata({**meta, "container": bad}, "m")


def _base() -> tuple[str | None, str | None]:
    """(the local base the tests build on, why the engine tests are skipped)."""
    why = engine_available("podman")
    if why is not None:
        return None, why
    for base in (FULL_BASE, MIN_BASE):
        if image_exists(base):
            return base, None
    return None, f"no base image (python -m c2.envs.container base {MIN_BASE})"


BASE, WHY = _base()


@pytest.fixture
def engine():
    """Skip without podman or a base image; fail instead under CI=true."""
    if WHY is not None:
        skip_or_fail(f"container backend: {WHY}", "the container backend")


needs_engine = pytest.mark.usefixtures("engine")


@pytest.fixture
def local_base(monkeypatch):
    """debian:bookworm-slim mapped onto whichever local base exists."""
    monkeypatch.setitem(BASE_IMAGES, "debian:bookworm-slim", BASE)


DOCKERFILE = """FROM debian:bookworm-slim
WORKDIR /app
COPY data.txt /app/data.txt
RUN echo built > /app/built.txt && mkdir -p /opt/tool && echo tool > /opt/tool/version
"""
# The reward needs the answer in the workspace AND a file the solution wrote outside it
# (/opt/marker): the tests run in the container the agent's commands ran in.
TEST_SH = """#!/bin/bash
if [ "$(cat /app/answer.txt)" = "42" ] && [ -f /opt/marker ] && [ -f /opt/tool/version ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
SOLVE_SH = """#!/bin/bash
set -e
echo $(( $(cat data.txt) + 1 )) > answer.txt
touch /opt/marker
"""
TASK_TOML = """version = "1.0"
[metadata]
difficulty = "easy"
category = "test"
[verifier]
timeout_sec = 60.0
[agent]
timeout_sec = 60.0
[environment]
build_timeout_sec = 300.0
cpus = 1
memory = "512M"
storage = "1G"
"""


def _harbor_task(root, solve=SOLVE_SH):
    (root / "environment").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "solution").mkdir()
    (root / "instruction.md").write_text("Write data.txt's number plus one to answer.txt.\n")
    (root / "task.toml").write_text(TASK_TOML)
    (root / "environment" / "Dockerfile").write_text(DOCKERFILE)
    (root / "environment" / "data.txt").write_text("41\n")
    (root / "tests" / "test.sh").write_text(TEST_SH)
    (root / "solution" / "solve.sh").write_text(solve)
    return root


@needs_engine
def test_a_build_copies_uv_from_its_local_stand_in(tmp_path):
    """The image a `COPY --from=ghcr.io/astral-sh/uv:X` names is made from uv X's PyPI wheel:
    the build works with no registry and runs that very version."""
    (tmp_path / "Dockerfile").write_text(
        f"FROM {BASE}\nCOPY --from=ghcr.io/astral-sh/uv:{UV_VERSION} /uv /uvx /bin/\n"
        "RUN /bin/uv --version && /bin/uvx --version\n"
    )
    tag = "localhost/c2-test/uv-copy:1"
    r = build_image(tmp_path, tag, bases={})
    subprocess.run(["podman", "rmi", "-f", tag], capture_output=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"\nuv {UV_VERSION}" in r.stdout and f"\nuvx {UV_VERSION}" in r.stdout, r.stdout


@needs_engine
def test_a_uv_version_the_index_lacks_refuses_the_import_naming_it(tmp_path, local_base):
    src = _harbor_task(tmp_path / "src" / "tiny")
    dockerfile = src / "environment" / "Dockerfile"
    dockerfile.write_text(DOCKERFILE + "COPY --from=ghcr.io/astral-sh/uv:0.0.999 /uv /uvx /bin/\n")
    (o,) = import_harbor_tasks([src], tmp_path / "tasks", backend="podman", log=lambda _: None)
    assert (o.status, o.reason) == ("refused", "image-build-failed")
    assert "localhost/c2-uv:0.0.999: uv 0.0.999 could not be downloaded" in o.detail
    assert sorted(p.name for p in (tmp_path / "tasks").iterdir()) == ["build-logs"]


@needs_engine
def test_dockerfile_task_imports_and_grades_in_its_container(tmp_path, local_base):
    src = _harbor_task(tmp_path / "src" / "tiny")
    out = tmp_path / "tasks"
    (o,) = import_harbor_tasks([src], out, backend="podman", log=lambda _: None)
    assert (o.status, o.reason) == ("imported", None), o.detail
    task = load_task(out / o.task_id)
    c = task.container
    assert c["engine"] == "podman" and image_exists(c["image"]) and c["network"] is True
    assert c["from"] == ["debian:bookworm-slim"]
    assert task.mount_at == "/app" and task.grader == "harbor"
    assert task.metadata["limits"]["memory_mb"] == 512 and task.test_timeout_s == 60
    # The workspace is the image's working directory, after its RUN steps.
    assert (task.workspace_dir / "data.txt").read_text() == "41\n"
    assert (task.workspace_dir / "built.txt").read_text() == "built\n"
    assert (task.root / "environment" / "Dockerfile").read_text() == DOCKERFILE
    # Importing again finds the same source and the same image: nothing is rebuilt.
    (again,) = import_harbor_tasks([src], out, backend="podman", log=lambda _: None)
    assert again.status == "unchanged" and load_task(out / o.task_id).container == c

    sandbox = Sandbox()
    assert task.sandbox(sandbox) is not sandbox
    t0 = time.monotonic()
    (oracle,) = evaluate([task], oracle_policy, sandbox=sandbox, workers=1)
    assert oracle.passed, oracle.failure_reason
    assert oracle.correctness["fail_to_pass"] == {"tests/test.sh": True}
    assert time.monotonic() - t0 < 120
    (noop,) = evaluate([task], noop_policy, sandbox=sandbox, workers=1)
    assert not noop.passed and "fail_to_pass still failing" in noop.failure_reason

    # A wrong solution fails; one that skips the file outside the workspace fails too.
    for i, solve in enumerate(
        [SOLVE_SH.replace("+ 1", "+ 2"), SOLVE_SH.replace("touch /opt/marker", "true")]
    ):
        bad = import_harbor_tasks(
            [_harbor_task(tmp_path / f"src{i}" / "tiny", solve)],
            tmp_path / f"bad{i}",
            backend="podman",
            log=lambda _: None,
        )[0]
        (rec,) = evaluate([load_task(tmp_path / f"bad{i}" / bad.task_id)], oracle_policy, workers=1)
        assert not rec.passed and "tests/test.sh" in rec.failure_reason

    # Every episode's container is gone once its workspace is.
    task.sandbox(sandbox).collect_garbage()
    ps = subprocess.run(
        ["podman", "ps", "-a", "--filter", "label=c2.session", "--format", "{{.Image}}"],
        capture_output=True,
        text=True,
    ).stdout.split()
    assert c["image"] not in ps


@needs_engine
def test_container_sandbox_limits_and_result_fields(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    sb = ContainerSandbox(BASE, limits=SandboxLimits(timeout_s=60, memory_mb=256))
    sb.give_workspace(ws)
    try:
        r = sb.run("echo hi > f.txt; echo out; echo err >&2; exit 3", ws, mount_at="/app")
        assert (r.exit_code, r.stdout, r.stderr, r.limit) == (3, "out\n", "err\n", None)
        assert (ws / "f.txt").read_text() == "hi\n" and r.isolation == "podman containers"
        assert json.loads(r.to_json())["limits_hit"] == []
        # The same container: state outside the workspace survives between commands.
        assert sb.run("echo x > /root/state", ws, mount_at="/app").exit_code == 0
        assert sb.run("cat /root/state", ws, mount_at="/app").stdout == "x\n"
        # The wall-time limit stops the command and whatever it started in the background.
        t0 = time.monotonic()
        r = sb.run("sleep 300 & sleep 300", ws, mount_at="/app", limits=SandboxLimits(timeout_s=2))
        assert r.timed_out and r.limit == "wall_time" and r.exit_code is None
        assert time.monotonic() - t0 < 20
        ps = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done"
        assert sb.run(f"{ps} | grep -c 'sleep [3]00'", ws, mount_at="/app").stdout == "0\n"
        # Without a timeout, what a command leaves in the background keeps running (a server
        # the solution starts for the tests, as in Harbor).
        assert sb.run("sleep 200 > /dev/null 2>&1 &", ws, mount_at="/app").exit_code == 0
        assert sb.run(f"{ps} | grep -c 'sleep [2]00'", ws, mount_at="/app").stdout == "1\n"
        # Memory: the container's cgroup; a process past it is killed and the limit named.
        hog = "head -c 600M /dev/zero | tail > /dev/null"
        r = sb.run(hog, ws, mount_at="/app")
        assert r.exit_code != 0 and r.limit == "memory", r
        # ... read from the kernel: a command's own SIGKILL (exit 137 too) is no memory limit.
        r = sb.run("kill -9 $$", ws, mount_at="/app")
        assert (r.exit_code, r.limit, r.limits_hit) == (137, None, []), r
        assert sb.run(hog, ws, mount_at="/app", readonly=True).limit == "memory"
        r = sb.run("kill -9 $$", ws, mount_at="/app", readonly=True)
        assert (r.exit_code, r.limit) == (137, None), r
        # Output beyond max_output_bytes is cut and named.
        lim = SandboxLimits(timeout_s=30, max_output_bytes=1000)
        r = sb.run("head -c 5000 /dev/zero | tr '\\0' a", ws, mount_at="/app", limits=lim)
        assert r.limit == "output" and r.stdout_truncated and len(r.stdout) <= 1000
        # No network unless the task asks for it.
        r = sb.run("exec 3<>/dev/tcp/1.1.1.1/80", ws, mount_at="/app")
        assert r.exit_code != 0
        # A read-only run gets a fresh container with the workspace read-only.
        r = sb.run("cat /root/state; touch g.txt", ws, mount_at="/app", readonly=True)
        assert r.exit_code != 0 and not (ws / "g.txt").exists()
    finally:
        sb.close()


def test_bench_backend_choice_names_the_mismatch(tmp_path):
    from c2.envs.tasks import Task

    meta = {"task_id": "harbor-x", "container": {"image": "i", "engine": "podman"}}
    t = Task(tmp_path, "", meta)
    assert with_backend(t, "auto") is t
    assert with_backend(t, "docker").container["engine"] == "docker"
    with pytest.raises(ValueError, match="imported for containers"):
        with_backend(t, "bwrap")
    plain = dataclasses.replace(t, metadata={"task_id": "harbor-y"})
    with pytest.raises(ValueError, match="--backend podman"):
        with_backend(plain, "podman")
    assert plain.sandbox("default-sandbox") == "default-sandbox"


# Linux capability numbers (linux/capability.h) of the names CAPABILITIES may hold.
CAP_BITS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6}
CAP_BITS |= {"SETUID": 7, "SETPCAP": 8, "NET_BIND_SERVICE": 10, "SYS_CHROOT": 18}


@pytest.fixture
def box(tmp_path):
    """A ContainerSandbox of BASE (no network) and a workspace handed to it."""
    ws = tmp_path / "ws"
    ws.mkdir()
    sb = ContainerSandbox(BASE, limits=SandboxLimits(timeout_s=60, memory_mb=256))
    sb.give_workspace(ws)
    yield sb, ws
    sb.close()


@needs_engine
def test_container_root_is_not_host_root(box, tmp_path):
    """A user namespace: what container root writes is owned on the host by USERNS_BASE, and a
    root-only host file shown to the container cannot be read; capabilities are CAPABILITIES
    and no more, and no-new-privileges is set."""
    sb, ws = box
    r = sb.run("touch made; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status", ws, mount_at="/app")
    assert r.exit_code == 0, r
    assert (ws / "made").stat().st_uid == USERNS_BASE != 0
    status = dict(line.split(":\t") for line in r.stdout.splitlines())
    assert int(status["CapEff"], 16) == sum(1 << CAP_BITS[c] for c in CAPABILITIES)
    assert status["NoNewPrivs"] == "1"
    secret = tmp_path / "secret"
    secret.write_text("host secret\n")
    secret.chmod(0o600)
    r = sb.run(
        "cat /secret", ws, mount_at="/app", readonly=True, binds=[(secret, "/secret", False)]
    )
    assert r.exit_code != 0 and "Permission denied" in r.stderr and "host secret" not in r.stdout


@needs_engine
def test_writes_past_the_quota_stop_the_command_and_name_the_limit(box):
    """The container's own filesystem (outside the workspace) is bounded by max_workspace_mb:
    the command writing past it is stopped, the limit is "disk"."""
    sb, ws = box
    lim = SandboxLimits(timeout_s=120, memory_mb=256, max_workspace_mb=50)
    r = sb.run("head -c 20M /dev/zero > /root/small", ws, mount_at="/app", limits=lim)
    assert (r.exit_code, r.limit) == (0, None), r
    r = sb.run(
        "head -c 120M /dev/zero > /root/big; echo wrote; sleep 100", ws, mount_at="/app", limits=lim
    )
    # Stopped (left alone it would exit 0 after its sleep), by the quota, not the wall time.
    assert r.limit == "disk" and not r.timed_out and r.exit_code != 0, r
    # The layer stays over the quota until the agent removes what it wrote.
    assert sb.run("true", ws, mount_at="/app", limits=lim).limit == "disk"
    r = sb.run("rm /root/big", ws, mount_at="/app", limits=lim)
    assert (r.exit_code, r.limit) == (0, None), r


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"hello from the host\n")

    def log_message(self, *args):
        pass


def _gateway(sb, ws) -> str:
    """The container's default gateway (the host, on podman's bridge), from /proc/net/route."""
    r = sb.run("cat /proc/net/route", ws, mount_at="/app")
    for row in r.stdout.splitlines()[1:]:
        f = row.split()
        if f[1] == "00000000":
            return socket.inet_ntoa(int(f[2], 16).to_bytes(4, "little"))
    raise AssertionError(f"no default route: {r.stdout}")


@needs_engine
def test_network_off_reaches_nothing_and_on_reaches_a_host_server(tmp_path):
    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), _Hello)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    ws = tmp_path / "ws"
    ws.mkdir()
    lim = SandboxLimits(timeout_s=30, memory_mb=256)
    on, off = (ContainerSandbox(BASE, limits=lim, network=n) for n in (True, False))
    fetch = "exec 3<>/dev/tcp/{}/{}; printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3"
    try:
        on.give_workspace(ws)
        gateway = _gateway(on, ws)
        r = on.run(fetch.format(gateway, port), ws, mount_at="/app")
        assert r.exit_code == 0 and "hello from the host" in r.stdout, r
        # Off: the same server at the same address, the host's loopback, a public address.
        for host in (gateway, "127.0.0.1", "1.1.1.1"):
            for readonly in (False, True):
                r = off.run(fetch.format(host, port), ws, mount_at="/app", readonly=readonly)
                assert r.exit_code != 0 and "hello" not in r.stdout, (host, r)
        r = off.run("cat /proc/net/route; ls /sys/class/net", ws, mount_at="/app")
        assert r.stdout.split() == [
            "Iface",
            "Destination",
            "Gateway",
            "Flags",
            "RefCnt",
            "Use",
            "Metric",
            "Mask",
            "MTU",
            "Window",
            "IRTT",
            "lo",
        ], r.stdout
    finally:
        on.close()
        off.close()
        server.shutdown()


@needs_engine
def test_harbor_reward_cannot_be_rewritten_by_the_agents_processes(box, tmp_path):
    """The agent leaves a process rewriting /logs/verifier/reward.txt to 1 and plants a reward
    of its own; the tests write 0. Grading restarts the container (the writer dies, the planted
    file goes) and reads the reward only once the container is stopped: 0, a failure."""
    sb, ws = box
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test.sh").write_text(
        "ps() { for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done; }\n"
        "ps | grep -c '[f]orge' > /logs/verifier/writers\n"
        "ls /logs/verifier > /logs/verifier/listing\n"
        "echo 0 > /logs/verifier/reward.txt\n"
    )
    v = "/logs/verifier"  # the writer turns the tests' 0 into a 1 (the old flow read 1)
    zero = f'[ "$(cat {v}/reward.txt 2>/dev/null)" = 0 ]'
    forge = f"while true; do {zero} && echo 1 > {v}/reward.txt; done"
    agent = f"mkdir -p {v}; echo 1 > {v}/reward.txt; (bash -c '{forge} # forge' > /dev/null 2>&1 &)"
    assert sb.run(agent, ws, mount_at="/app").exit_code == 0
    assert sb.run(f"cat {v}/reward.txt", ws, mount_at="/app").stdout == "1\n"
    task = SimpleNamespace(tests_dir=tests, mount_at="/app", fail_to_pass=["tests/test.sh"])
    lim = SandboxLimits(timeout_s=60, memory_mb=256)
    run = _run_harbor(task, ws, sb, lim)
    assert run.outcomes == {"tests/test.sh": "failed"} and run.error is None, run
    # The container is usable again afterwards, and what the agent left is gone.
    r = sb.run("cat /logs/verifier/writers /logs/verifier/listing", ws, mount_at="/app")
    assert r.stdout == "0\nlisting\nwriters\n", r


def test_harbor_reward_reads_only_finite_numbers_from_regular_files(tmp_path):
    v = tmp_path / "verifier"
    v.mkdir()
    assert _harbor_reward(v) is None
    for text, want in (("1\n", 1.0), ("0.5", 0.5), ("inf", None), ("nan", None), ("x", None)):
        (v / "reward.txt").write_text(text)
        assert _harbor_reward(v) == want, text
    (v / "reward.txt").unlink()
    (tmp_path / "elsewhere").write_text("1")
    (v / "reward.txt").symlink_to(tmp_path / "elsewhere")
    (v / "reward.json").write_text('{"reward": 1}')
    assert _harbor_reward(v) is None  # a link is no reward, not even with a reward.json beside
    (v / "reward.txt").unlink()
    assert _harbor_reward(v) == 1.0
    for text in ('{"reward": Infinity}', '{"reward": true}', '{"reward": "1"}'):
        (v / "reward.json").write_text(text)
        assert _harbor_reward(v) is None, text


@needs_engine
def test_network_follows_task_toml_allow_internet(tmp_path, local_base):
    """task.toml's [environment] allow_internet (absent: true, as in Harbor) is the task's
    network; a change of it alone re-imports the task; a value that is not a boolean is named."""
    src = _harbor_task(tmp_path / "src" / "tiny")
    toml = src / "task.toml"
    out = tmp_path / "tasks"
    nets = []
    for value in ("false", "true"):
        toml.write_text(TASK_TOML.replace("cpus = 1", f"cpus = 1\nallow_internet = {value}"))
        (o,) = import_harbor_tasks([src], out, backend="podman", log=lambda _: None)
        assert (o.status, o.reason) == ("imported", None), o.detail
        task = load_task(out / o.task_id)
        nets.append((task.container["network"], task.sandbox(Sandbox()).network))
    assert nets == [(False, False), (True, True)]
    toml.write_text(TASK_TOML.replace("cpus = 1", 'cpus = 1\nallow_internet = "yes"'))
    (o,) = import_harbor_tasks([src], out, backend="podman", log=lambda _: None)
    assert (o.status, o.reason) == ("refused", "unreadable")
    assert "allow_internet='yes': expected true/false" in o.detail


@needs_engine
def test_descriptors_reach_a_readonly_run_as_3_4_and_nothing_else_there_holds_them(box):
    """pass_fds (grading's pipes): open in the command as 3, 4, ...; the command is exec'd
    with no `timeout` above it (its parent is outside the container), so no other process in
    the container holds them; refused outside a read-only run."""
    sb, ws = box
    assert sb.passes_fds and sb.inner_fds((57, 9)) == (3, 4)
    out_r, out_w = os.pipe()
    in_r, in_w = os.pipe()
    os.write(in_w, b"ping")
    os.close(in_w)
    cmd = "read -n 4 x <&4; echo got-$x >&3; grep PPid /proc/$$/status"
    try:
        r = sb.run(cmd, ws, mount_at="/app", readonly=True, pass_fds=(out_w, in_r))
        os.close(out_w)
        assert os.read(out_r, 100) == b"got-ping\n"
        # PPid 0: exec'd from outside the container, with no wrapper above it holding them.
        assert (r.exit_code, r.stdout) == (0, "PPid:\t0\n"), r
        with pytest.raises(SandboxError, match="needs readonly=True"):
            sb.run("true", ws, mount_at="/app", pass_fds=(in_r,))
    finally:
        for fd in (out_r, in_r):
            os.close(fd)


@needs_engine
def test_a_readonly_run_writes_only_its_scratch_and_an_episode_its_whole_filesystem(box, tmp_path):
    """Grading's fresh container has a read-only root (nothing the tests call can plant a module
    in /grading or the image's standard library for the trusted runner to import): /tmp and
    /dev/shm, each of tmp_mb, are all it can write. The episode's container stays writable
    (solutions install packages into the image)."""
    sb, ws = box
    mounted = tmp_path / "runner.py"
    mounted.write_text("pass\n")
    places = "/grading/new.py /grading/runner.py /usr/lib/new.py /etc/new /root/new /new"
    places += " /var/tmp/new /run/new /app/new /tmp/new /dev/shm/new"
    probe = f"for p in {places}; do echo x 2>/dev/null > $p && echo $p; done; "
    probe += "head -c 20M /dev/zero > /tmp/big || echo tmp-full"
    lim = SandboxLimits(timeout_s=60, memory_mb=256, tmp_mb=8)
    binds = [(mounted, "/grading/runner.py", False)]
    r = sb.run(probe, ws, mount_at="/app", readonly=True, binds=binds, limits=lim)
    assert r.stdout.split() == ["/tmp/new", "/dev/shm/new", "tmp-full"], r
    assert "No space left on device" in r.stderr
    r = sb.run(probe, ws, mount_at="/app", limits=lim)
    assert {"/usr/lib/new.py", "/etc/new", "/root/new", "/new", "/app/new"} <= set(r.stdout.split())
