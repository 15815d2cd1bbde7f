"""The container backend on a tiny Dockerfile task: build, run with limits, SandboxResult.

Needs podman (with runc) and a local base image (`python -m c2.envs.container base`); skipped
where either is missing (CI installs no container engine).
"""

import shutil
import subprocess

import pytest

from c2.envs.container import ContainerSandbox, build_image, map_from_lines
from c2.envs.sandbox import SandboxLimits

BASE = "localhost/c2-base:bookworm"


def test_from_lines_map_onto_local_bases():
    text = "FROM python:3.13-slim-bookworm\nRUN x\nFROM --platform=linux/amd64 ubuntu:24.04 AS b\n"
    out = map_from_lines(text, {"python:3.13-slim-bookworm": BASE, "ubuntu:24.04": "u"})
    assert out.splitlines() == [f"FROM {BASE}", "RUN x", "FROM --platform=linux/amd64 u AS b"]


def _have_engine():
    if shutil.which("podman") is None:
        return False
    r = subprocess.run(["podman", "image", "exists", BASE], capture_output=True)
    return r.returncode == 0


@pytest.mark.skipif(not _have_engine(), reason=f"podman or the base image {BASE} is missing")
def test_tiny_dockerfile_task_builds_and_runs(tmp_path):
    ctx = tmp_path / "env"
    ctx.mkdir()
    (ctx / "hello.txt").write_text("hello\n")
    (ctx / "Dockerfile").write_text(
        "FROM python:3.13-slim-bookworm\nWORKDIR /app\nCOPY hello.txt /opt/hello.txt\n"
        "RUN python3 -c \"print('built')\" > /opt/built.txt\n"
    )
    r = build_image(ctx, "localhost/c2-test-tiny", timeout_s=600)
    assert r.returncode == 0, r.stderr[-2000:]
    ws = tmp_path / "ws"
    ws.mkdir()
    sb = ContainerSandbox("localhost/c2-test-tiny", limits=SandboxLimits(timeout_s=60))
    res = sb.run("cat /opt/hello.txt /opt/built.txt > out.txt; echo done", ws, mount_at="/app")
    assert (res.exit_code, res.stdout.strip(), res.limit) == (0, "done", None), res.stderr
    assert (ws / "out.txt").read_text() == "hello\nbuilt\n"
    res = sb.run("sleep 30", ws, mount_at="/app", limits=SandboxLimits(timeout_s=2))
    assert res.timed_out and res.limit == "wall_time"
    res = sb.run(["python3", "-c", "import urllib.request as u; u.urlopen('http://1.1.1.1')"], ws)
    assert res.exit_code != 0  # no network
    hog = "x = bytearray(400 << 20); print(len(x))"
    res = sb.run(["python3", "-c", hog], ws, limits=SandboxLimits(timeout_s=60, memory_mb=128))
    assert res.exit_code != 0 and res.limit == "memory", res
