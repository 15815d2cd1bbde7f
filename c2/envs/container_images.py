"""Images of the container backend: local base images (BASES), task images built from Dockerfiles.

Where no registry is reachable the FROM lines of a task's Dockerfile are mapped onto local base
images (BASE_IMAGES), made by `build_base_image` from the Debian and Ubuntu archives; a task's
image is built once, tagged by a content hash of its build (`ensure_image`). Why each base holds
what it does: container.py's module docstring. How containers of these images run:
container_run.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
import zipfile
from pathlib import Path

from c2.envs.container_run import _ulimits, engine_command, image_exists, image_id
from c2.envs.sandbox import SandboxError, SandboxLimits


@dataclasses.dataclass(frozen=True)
class BaseRecipe:
    """A local base image: mmdebstrap of `suite` (or FROM `parent`), then the common layer."""

    suite: str | None = None
    mirror: str = "http://deb.debian.org/debian"
    security: str | None = "http://deb.debian.org/debian-security"
    components: str = "main"
    keyring: str | None = None
    parent: str | None = None
    # The python:* images' layout (python, pip in /usr/local/bin): "debian" (the release's
    # python3 with pip and venv) or "cpython" (the CPython 3.13 of the parent's test tools,
    # copied into /usr/local with ensurepip's pip: what the official images hold).
    python: str | None = None
    test_tools: bool = True  # uv and Python 3.13 for Harbor's test setup (module doc)

    def sources(self) -> list[str]:
        comp = self.components.replace(",", " ")
        out = [f"deb {self.mirror} {self.suite} {comp}"]
        out.append(f"deb {self.mirror} {self.suite}-updates {comp}")
        if self.security:
            out.append(f"deb {self.security} {self.suite}-security {comp}")
        return out


_UBUNTU = "http://archive.ubuntu.com/ubuntu"
_UBUNTU_KEYRING = "/usr/share/keyrings/ubuntu-archive-keyring.gpg"
# Where a missing keyring comes from. Debian 12's own archive has no ubuntu-keyring package; the
# Ubuntu archive's .deb installs on Debian (its keys: 790BC727..., 843938DF..., F6ECB376...).
KEYRING_HINTS = {
    _UBUNTU_KEYRING: "on Debian: the ubuntu-keyring package, for example `curl -fO "
    f"{_UBUNTU}/pool/main/u/ubuntu-keyring/ubuntu-keyring_2023.11.28.1_all.deb && "
    "dpkg -i ubuntu-keyring_2023.11.28.1_all.deb`",
}
BASES = {
    "localhost/c2-base:bookworm": BaseRecipe("bookworm"),
    "localhost/c2-base:trixie": BaseRecipe("trixie"),
    "localhost/c2-base:noble": BaseRecipe(
        "noble",
        mirror=_UBUNTU,
        security=_UBUNTU,
        components="main,universe",
        keyring=_UBUNTU_KEYRING,
    ),
    "localhost/c2-python:3.11-bookworm": BaseRecipe(
        parent="localhost/c2-base:bookworm", python="debian"
    ),
    "localhost/c2-python:3.13-bookworm": BaseRecipe(
        parent="localhost/c2-base:bookworm", python="cpython"
    ),
    "localhost/c2-python:3.13-trixie": BaseRecipe(
        parent="localhost/c2-base:trixie", python="debian"
    ),
    # Without uv and Python 3.13 (a minute or two to build: what CI builds for the tests).
    "localhost/c2-base:bookworm-min": BaseRecipe("bookworm", test_tools=False),
}
# The tasks' FROM lines, on local bases (python:3.10 on 3.11: Debian 12 has no 3.10).
BASE_IMAGES = {
    "python:3.13-slim-bookworm": "localhost/c2-python:3.13-bookworm",
    "python:3.13-bookworm": "localhost/c2-python:3.13-bookworm",
    "python:3.13-slim-trixie": "localhost/c2-python:3.13-trixie",
    "python:3.13-slim": "localhost/c2-python:3.13-trixie",
    "python:3.13": "localhost/c2-python:3.13-trixie",
    "python:3.11-slim": "localhost/c2-python:3.11-bookworm",
    "python:3.11-slim-bookworm": "localhost/c2-python:3.11-bookworm",
    "python:3.11": "localhost/c2-python:3.11-bookworm",
    "python:3.10-slim-bookworm": "localhost/c2-python:3.11-bookworm",
    "python:3.10-slim": "localhost/c2-python:3.11-bookworm",
    "debian:bookworm-slim": "localhost/c2-base:bookworm",
    "debian:bookworm": "localhost/c2-base:bookworm",
    "debian:bullseye-slim": "localhost/c2-base:bookworm",
    "debian:13.0-slim": "localhost/c2-base:trixie",
    "debian:trixie-slim": "localhost/c2-base:trixie",
    "ubuntu:24.04": "localhost/c2-base:noble",
    "ubuntu:noble": "localhost/c2-base:noble",
}
UV_VERSION = "0.9.5"
# Images that Dockerfiles copy tools from (`COPY --from=IMAGE /uv /uvx /bin/`), made here where no
# registry is reachable: uv's release images hold only /uv and /uvx, the static binaries that its
# PyPI wheel of the same version carries.
_UV_IMAGE = re.compile(r"(?:ghcr\.io/astral-sh/uv|(?:docker\.io/)?astral/uv):(\d+\.\d+\.\d+)")
UV_TOOL_REPO = "localhost/c2-uv"


def tool_image(image: str) -> str | None:
    """The local image that stands in for `image` in a `COPY --from`, or None where none does."""
    m = _UV_IMAGE.fullmatch(image)
    return f"{UV_TOOL_REPO}:{m.group(1)}" if m else None


_UV_ENV = (  # the uv installer's ~/.local/bin/env
    'case ":${PATH}:" in *:"$HOME/.local/bin":*) ;; '
    '*) export PATH="$HOME/.local/bin:$PATH" ;; esac\n'
)


# ---------------------------------------------------------------------- task images


def from_images(dockerfile: str) -> list[str]:
    """The images a Dockerfile's FROM lines name (stage names excluded)."""
    stages, out = set(), []
    for m in re.finditer(r"(?im)^\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", dockerfile):
        if m.group(1).lower() not in stages:
            out.append(m.group(1))
        if m.group(2):
            stages.add(m.group(2).lower())
    return out


def map_from_lines(dockerfile: str, bases: dict[str, str] | None = None) -> str:
    """The Dockerfile with each FROM image that has a local base replaced by it, and each image
    a `COPY --from` names that has a local stand-in (`tool_image`) replaced by that."""
    bases = BASE_IMAGES if bases is None else bases

    def sub(m):
        image = m.group(2)
        return m.group(1) + bases.get(image, image)

    def sub_copy(m):
        return m.group(1) + (tool_image(m.group(2)) or m.group(2))

    text = re.sub(r"(?im)^(\s*FROM\s+(?:--\S+\s+)*)(\S+)", sub, dockerfile)
    return re.sub(r"(?im)^(\s*COPY\s+(?:--\S+\s+)*?--from=)(\S+)", sub_copy, text)


def ensure_tool_images(dockerfile: str, engine: str = "podman") -> None:
    """Build the local tool images (`tool_image`) that the mapped `dockerfile` copies from."""
    for version in sorted(set(re.findall(rf"--from={re.escape(UV_TOOL_REPO)}:(\S+)", dockerfile))):
        tag = f"{UV_TOOL_REPO}:{version}"
        if image_exists(tag, engine):
            continue
        with tempfile.TemporaryDirectory(prefix="c2-uv-") as tmp:
            try:
                _uv_binaries(Path(tmp), version)
            except subprocess.CalledProcessError as e:
                raise SandboxError(
                    f"{tag}: uv {version} could not be downloaded from the package index: "
                    f"{(e.stderr or b'').decode(errors='replace').strip()[-300:]}"
                ) from None
            (Path(tmp) / "Dockerfile").write_text("FROM scratch\nCOPY uv uvx /\n")
            r = build_image(tmp, tag, engine=engine, bases={}, timeout_s=600)
        if r.returncode != 0:
            raise SandboxError(f"building {tag} failed: {_build_error(r)}")


def context_hash(
    context: str | os.PathLike, *, dockerfile: str = "Dockerfile", engine: str = "podman"
) -> str:
    """A content hash of the build: the mapped Dockerfile, every file of the context (path,
    mode, bytes) and the ids of the local base images it starts from."""
    context = Path(context)
    text = map_from_lines((context / dockerfile).read_text())
    h = hashlib.sha256(b"c2-image 1\n" + text.encode() + b"\0")
    for f in sorted(context.rglob("*")):
        if f.is_file() or f.is_symlink():
            rel = f.relative_to(context).as_posix()
            h.update(f"{rel}\0{f.lstat().st_mode:o}\0".encode())
            h.update(os.readlink(f).encode() if f.is_symlink() else _file_digest(f))
    for base in from_images(text):
        if base.startswith("localhost/"):
            h.update((image_id(base, engine) or base).encode())
    return h.hexdigest()[:16]


def _file_digest(path: Path) -> bytes:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.digest()


def build_image(
    context: str | os.PathLike,
    tag: str,
    *,
    engine: str = "podman",
    timeout_s: float = 1800,
    bases: dict[str, str] | None = None,
    dockerfile: str = "Dockerfile",
    log: str | os.PathLike | None = None,
) -> subprocess.CompletedProcess:
    """Build context/dockerfile as `tag` (FROM lines mapped onto local bases). A build that runs
    past `timeout_s` returns code 124 with what it printed so far."""
    context = Path(context)
    text = map_from_lines((context / dockerfile).read_text(), bases)
    ensure_tool_images(text, engine)
    with tempfile.NamedTemporaryFile("w", suffix=".Dockerfile", delete=False) as f:
        f.write(text)
    ul = _ulimits(SandboxLimits(max_open_files=4096, max_processes=1024))
    argv = [*engine_command(engine), "build", *ul, "-t", tag, "-f", f.name, str(context)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout or ""
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
        proc = subprocess.CompletedProcess(
            argv, 124, out, err + f"\nbuild timed out ({timeout_s:g} s)"
        )
    finally:
        os.unlink(f.name)
    if log is not None:
        Path(log).write_text(proc.stdout + "\n--- stderr\n" + proc.stderr)
    return proc


def _build_error(r: subprocess.CompletedProcess) -> str:
    """The failing step and the last lines of a build's output."""
    text = (r.stdout or "") + "\n" + (r.stderr or "")
    steps = re.findall(r"^STEP \d+/\d+: .*$", text, re.M)
    lines = [x for x in text.strip().splitlines() if x.strip()]
    where = steps[-1][:200] if steps else "before the first step"
    return f"{where}: ... {' | '.join(lines[-4:])[-500:]}"


def ensure_image(
    context: str | os.PathLike,
    *,
    repo: str,
    engine: str = "podman",
    dockerfile: str = "Dockerfile",
    timeout_s: float = 1800,
    log: str | os.PathLike | None = None,
) -> tuple[str, subprocess.CompletedProcess | None]:
    """(tag, build result or None when cached): `repo:<content hash>`, built if missing. A build
    that fails on a transient network error (a read that timed out, a name that did not
    resolve, a reset connection) is run once more: the steps it finished are cached, so the
    second run starts at the failed one."""
    tag = f"{repo}:{context_hash(context, dockerfile=dockerfile, engine=engine)}"
    if image_exists(tag, engine):
        return tag, None
    for _ in range(2):
        r = build_image(
            context, tag, engine=engine, timeout_s=timeout_s, dockerfile=dockerfile, log=log
        )
        if r.returncode in (0, 124) or not transient_network_error(r.stdout + r.stderr):
            break
    return tag, r


_TRANSIENT = re.compile(
    r"Read timed out|Temporary failure in name resolution|Connection reset by peer|"
    r"IncompleteRead|operation timed out|error sending request"
)


def transient_network_error(output: str) -> bool:
    """Whether a failed build's output shows a network error that may pass (the last 3,000
    characters, where the failing step's error is)."""
    return _TRANSIENT.search(output[-3000:]) is not None


def copy_out_of_image(image: str, path: str, dest: str | os.PathLike, engine: str = "podman"):
    """Copy the contents of `path` (a directory) of `image` into `dest` (new, or empty)."""
    dest = Path(dest)
    if dest.is_dir():
        dest.rmdir()  # must be empty: `cp DIR NEW` copies DIR's contents into NEW
    cmd = engine_command(engine)
    name = f"c2-cp-{uuid.uuid4().hex[:12]}"
    r = subprocess.run(
        [*cmd, "create", "--name", name, image, "true"], capture_output=True, text=True
    )
    if r.returncode != 0:
        raise SandboxError(f"could not create a container of {image}: {r.stderr[-300:]}")
    try:
        r = subprocess.run(
            [*cmd, "cp", f"{name}:{path.rstrip('/') or '/'}", str(dest)],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0 and "could not be found" in r.stderr:
            dest.mkdir()  # buildah's WORKDIR alone makes no directory: an empty workspace
        elif r.returncode != 0:
            raise SandboxError(f"copying {path} out of {image} failed: {r.stderr[-300:]}")
    finally:
        subprocess.run([*cmd, "rm", "-f", name], capture_output=True)


# ---------------------------------------------------------------------- base images


def _host_ca_certs() -> list[Path]:
    d = Path("/usr/local/share/ca-certificates")
    return sorted(d.rglob("*.crt")) if d.is_dir() else []


def _uv_binaries(dest: Path, version: str = UV_VERSION) -> None:
    """uv and uvx of `version` from PyPI (the wheel holds the static binaries)."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", f"uv=={version}", "--no-deps"]
            + ["--only-binary=:all:", "--platform", "manylinux_2_17_x86_64", "-d", tmp],
            check=True,
            capture_output=True,
        )
        (wheel,) = Path(tmp).glob("uv-*.whl")
        with zipfile.ZipFile(wheel) as z:
            for name in ("uv", "uvx"):
                target = dest / name
                target.write_bytes(z.read(f"uv-{version}.data/scripts/{name}"))
                target.chmod(0o755)


_CPYTHON_BUILD = r"""set -e
prefix=/root/.local/share/uv/python/cpython-{version}-linux-x86_64-gnu
deps="gcc make libc6-dev libssl-dev zlib1g-dev libffi-dev libsqlite3-dev libbz2-dev liblzma-dev
 libreadline-dev libncurses-dev uuid-dev xz-utils"
apt-get update -qq
if apt-cache show python3.13 >/dev/null 2>&1; then  # the release has it (Debian 13): no build
  apt-get install -y -qq --no-install-recommends python3.13 >/dev/null
  rm -rf /var/lib/apt/lists/*
  exit 0
fi
apt-get install -y -qq --no-install-recommends $deps >/dev/null
mkdir /tmp/cpython/src
tar xf /tmp/cpython/python3.13_{version}.orig.tar.xz -C /tmp/cpython/src --strip-components=1
cd /tmp/cpython/src
./configure -q --prefix=$prefix --without-ensurepip --disable-test-modules \
  OPT="-DNDEBUG -fwrapv -O1"
make -s -j"$(nproc)" >/dev/null 2>&1 || make -j1
make -s install >/dev/null
# keep the shared libraries the interpreter links to, then drop the build dependencies
libs=$(find $prefix -name '*.so*' -type f -exec ldd {{}} \; 2>/dev/null | awk '/=> \//{{print $3}}')
keep=$(for l in $(echo "$libs" | sort -u); do dpkg -S "$(basename "$l")" 2>/dev/null; done |
 grep -v '^diversion' | cut -d: -f1 | tr ',' '\n' | sed 's/ //g' | sort -u |
 grep -v -- '-dev$' || true)
[ -z "$keep" ] || apt-mark manual $keep >/dev/null
apt-get purge -y -qq --auto-remove $deps >/dev/null
rm -rf /var/lib/apt/lists/* $prefix/lib/python3.13/test
$prefix/bin/python3 -c "import ssl, sqlite3, lzma, bz2, zlib, ctypes, readline; print('cpython ok')"
"""


def _cpython_source(dest: Path) -> None:
    """Debian's python3.13 source (apt checks it against the archive's signed index)."""
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        (t / "lists" / "partial").mkdir(parents=True)
        (t / "sources.list").write_text(
            "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
            "http://deb.debian.org/debian trixie main\n"
        )
        opts = ["-o", f"Dir::Etc::SourceList={t}/sources.list", "-o", "Dir::Etc::SourceParts=-"]
        opts += ["-o", f"Dir::State::Lists={t}/lists"]
        subprocess.run(["apt-get", *opts, "update"], check=True, capture_output=True)
        subprocess.run(
            ["apt-get", *opts, "source", "--download-only", "python3.13"],
            check=True,
            capture_output=True,
            cwd=dest,
        )
    for f in dest.iterdir():
        if not f.name.endswith(".orig.tar.xz"):
            f.unlink()
    (orig,) = dest.glob("python3.13_*.orig.tar.xz")
    version = orig.name.split("_")[1].removesuffix(".orig.tar.xz")
    (dest / "build.sh").write_text(_CPYTHON_BUILD.format(version=version))


def _base_layer(recipe: BaseRecipe, parent: str) -> str:
    """The Dockerfile of the layer over an mmdebstrap rootfs (or over a parent base)."""
    env = "/etc/ssl/certs/ca-certificates.crt"
    lines = [f"FROM {parent}"]
    if recipe.parent is None:
        lines += [
            "COPY certs/ /usr/local/share/ca-certificates/c2-host/",
            "RUN update-ca-certificates >/dev/null && rm -rf /var/lib/apt/lists/*",
            f"ENV SSL_CERT_FILE={env} REQUESTS_CA_BUNDLE={env} PIP_CERT={env} "
            f"CURL_CA_BUNDLE={env} NODE_EXTRA_CA_CERTS={env} "
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "
            "LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive",
        ]
    if recipe.parent is None and recipe.test_tools:
        lines += [
            "COPY uv/ /root/.local/bin/",
            # What `uvx -p 3.13` would fetch at test time (github.com is not reachable here):
            # CPython 3.13 from Debian's source package, built where uv keeps its Pythons (or
            # the release's own python3.13 where it has one).
            "COPY cpython/ /tmp/cpython/",
            "RUN sh /tmp/cpython/build.sh && rm -rf /tmp/cpython",
        ]
    if recipe.python == "cpython":
        uv_python = "/root/.local/share/uv/python/cpython-3.13*-linux-x86_64-gnu"
        lines += [
            f"RUN cp -a {uv_python}/. /usr/local/ && rm -rf /usr/local/lib/python3.13/test && "
            "/usr/local/bin/python3.13 -m ensurepip --default-pip >/dev/null && "
            "ln -sf python3.13 /usr/local/bin/python3 && ln -sf python3 /usr/local/bin/python && "
            "ln -sf pip3.13 /usr/local/bin/pip3 && ln -sf pip3 /usr/local/bin/pip && "
            "python --version && pip --version",
        ]
    elif recipe.python == "debian":
        lines += [
            "RUN apt-get update && apt-get install -y --no-install-recommends python3 "
            "python3-pip python3-venv python3-dev && rm -rf /var/lib/apt/lists/* && "
            "rm -f /usr/lib/python3*/EXTERNALLY-MANAGED && "
            "ln -sf /usr/bin/python3 /usr/local/bin/python && "
            "ln -sf /usr/bin/python3 /usr/local/bin/python3 && "
            "ln -sf /usr/bin/pip3 /usr/local/bin/pip && ln -sf /usr/bin/pip3 /usr/local/bin/pip3",
        ]
    lines.append('CMD ["bash"]')
    return "\n".join(lines) + "\n"


def build_base_image(tag: str, *, engine: str = "podman", log=print) -> None:
    """Build the base image `tag` of BASES (its parent first, when that is missing)."""
    if tag not in BASES:
        raise SandboxError(f"no recipe for base image {tag!r}; known: {sorted(BASES)}")
    recipe = BASES[tag]
    cmd = engine_command(engine)
    with tempfile.TemporaryDirectory(prefix="c2-base-") as tmp:
        ctx = Path(tmp) / "ctx"
        ctx.mkdir()
        if recipe.parent is not None:
            if not image_exists(recipe.parent, engine):
                build_base_image(recipe.parent, engine=engine, log=log)
            parent = recipe.parent
        else:
            if shutil.which("mmdebstrap") is None:
                raise SandboxError(
                    "mmdebstrap is not installed (Debian: apt-get install mmdebstrap)"
                )
            if recipe.keyring and not os.path.isfile(recipe.keyring):
                hint = KEYRING_HINTS.get(recipe.keyring)
                where = f" ({hint})" if hint else ""
                raise SandboxError(f"{tag}: the archive keyring {recipe.keyring} is missing{where}")
            tar = Path(tmp) / "rootfs.tar"
            argv = ["mmdebstrap", "--variant=apt", "--include=ca-certificates"]
            argv += [f"--components={recipe.components}"]
            if recipe.keyring:
                argv += [f"--keyring={recipe.keyring}"]
            argv += [recipe.suite, str(tar), *recipe.sources()]
            log(f"{tag}: mmdebstrap {recipe.suite}")
            r = subprocess.run(argv, capture_output=True, text=True)
            if r.returncode != 0:
                raise SandboxError(f"mmdebstrap {recipe.suite} failed: {r.stderr[-1500:]}")
            parent = f"{tag}-rootfs"
            subprocess.run([*cmd, "import", str(tar), parent], check=True, capture_output=True)
            (ctx / "certs").mkdir()
            for crt in _host_ca_certs():
                shutil.copy(crt, ctx / "certs" / crt.name)
            if recipe.test_tools:
                (ctx / "uv").mkdir()
                _uv_binaries(ctx / "uv")
                (ctx / "uv" / "env").write_text(_UV_ENV)
                (ctx / "cpython").mkdir()
                _cpython_source(ctx / "cpython")
        (ctx / "Dockerfile").write_text(_base_layer(recipe, parent))
        log(f"{tag}: building its layer over {parent}")
        r = build_image(ctx, tag, engine=engine, bases={}, timeout_s=3600)
        if r.returncode != 0:
            raise SandboxError(f"building {tag} failed: {_build_error(r)}")
        if recipe.parent is None:
            subprocess.run([*cmd, "rmi", parent], capture_output=True)
