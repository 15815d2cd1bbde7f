"""Fetching a package's source distribution for mining: the file itself, straight from the index.

The sdist is downloaded as a file from the package index's simple API (PEP 691 JSON, else PEP
503 HTML), its hash checked against the index's, and unpacked. Nothing is built: pip would
prepare the package's metadata with its build backend (hatchling, flit, pdm, poetry ...), which
the environment need not have. The index is $PIP_INDEX_URL (pip's own setting, a file:// index
directory too), else PyPI; the unpacked trees are cached under $C2_SOURCE_CACHE (default
~/.cache/c2/sources).
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import html.parser
import json
import os
import re
import shutil
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

from packaging.utils import InvalidSdistFilename, canonicalize_name, parse_sdist_filename
from packaging.version import InvalidVersion, Version

PYPI_SIMPLE = "https://pypi.org/simple/"
_JSON = "application/vnd.pypi.simple.v1+json"
MAX_SDIST_BYTES = 256 << 20  # a source archive larger than this is not a package to mine
TIMEOUT_S = 60.0  # one network read
DEADLINE_S = 900.0  # one whole download
TRIES = 3  # network errors only: a missing file or a wrong hash is final


class SourceError(ValueError):
    """The source cannot be mined: missing, unfetchable, without tests, or failing its tests."""


def default_source_cache() -> Path:
    return Path(os.environ.get("C2_SOURCE_CACHE", "~/.cache/c2/sources")).expanduser()


def index_url() -> str:
    return os.environ.get("PIP_INDEX_URL") or PYPI_SIMPLE


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_source(spec: str) -> tuple[str, str, str | None]:
    """("pypi", name, version) or ("dir", absolute path, None)."""
    if spec.startswith("pypi:"):
        m = re.fullmatch(r"pypi:([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)", spec)
        if not m:
            raise SourceError(f"source {spec!r}: expected pypi:NAME==VERSION (an exact version)")
        return "pypi", m.group(1), m.group(2)
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise SourceError(
            f"source {spec!r}: no such directory (expected a local checkout or pypi:NAME==VERSION)"
        )
    return "dir", str(path.resolve()), None


def fetch_sdist(name: str, version: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """The unpacked source distribution of NAME==VERSION (downloaded once, hash-checked, cached)."""
    cache = Path(cache_dir) if cache_dir is not None else default_source_cache()
    cache.mkdir(parents=True, exist_ok=True)
    dest = cache / f"{_norm(name)}-{version}"
    if (dest / ".c2-complete").is_file():
        return _single_root(dest)
    with open(cache / f"{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dest / ".c2-complete").is_file():
            return _single_root(dest)
        what = f"source pypi:{name}=={version}"
        filename, url, algo, digest = find_sdist(name, version)
        with tempfile.TemporaryDirectory(prefix="c2-sdist-", dir=cache) as tmp:
            archive = Path(tmp) / filename
            _download(url, archive, what)
            with open(archive, "rb") as f:
                got = hashlib.file_digest(f, algo).hexdigest()
            if got != digest.lower():
                raise SourceError(
                    f"{what}: {archive.name} has {algo} {got}, the index says {digest}: "
                    "refusing a download that is not the index's file"
                )
            unpacked = Path(tmp) / "unpacked"
            _unpack(archive, unpacked)
            (unpacked / ".c2-complete").write_text(f"{archive.name} {algo}={got}\n")
            shutil.rmtree(dest, ignore_errors=True)
            os.rename(unpacked, dest)
    return _single_root(dest)


def find_sdist(name: str, version: str) -> tuple[str, str, str, str]:
    """(file name, url, hash algorithm, hex digest) of NAME==VERSION's sdist on the index."""
    what = f"source pypi:{name}=={version}"
    page = urllib.parse.urljoin(index_url().rstrip("/") + "/", canonicalize_name(name) + "/")
    files = _project_files(page, what)
    try:
        want = Version(version)
    except InvalidVersion as e:
        raise SourceError(f"{what}: {version!r} is not a PEP 440 version") from e
    found = []
    for filename, url, hashes in files:
        try:
            fname, fversion = parse_sdist_filename(filename)
        except (InvalidSdistFilename, InvalidVersion):
            continue  # a wheel, an egg, or an unparseable legacy name
        if "/" in filename or "\\" in filename:
            continue  # not a plain file name
        if fname == canonicalize_name(name) and fversion == want:
            found.append((not filename.endswith(".tar.gz"), filename, url, hashes))
    if not found:
        n = sum(f.endswith((".tar.gz", ".zip")) for f, *_ in files)
        raise SourceError(
            f"{what}: no source distribution of this version on the index ({page} lists "
            f"{len(files)} files, {n} of them source archives)"
        )
    _, filename, url, hashes = min(found)  # .tar.gz before .zip
    algo = next((a for a in ("sha256", "sha384", "sha512") if a in hashes), None)
    if algo is None:
        raise SourceError(
            f"{what}: the index gives no sha256, sha384 or sha512 for {filename} (hashes: "
            f"{sorted(hashes)}): refusing an unverified download"
        )
    return filename, url, algo, hashes[algo]


def _project_files(page: str, what: str) -> list[tuple[str, str, dict[str, str]]]:
    """(filename, absolute url, hashes) of every file the project page lists."""
    try:
        body, ctype, final = _read(page, what, accept=f"{_JSON}, text/html;q=0.1")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise SourceError(f"{what}: no source distribution: {page} is not on the index") from e
        raise SourceError(f"{what}: the index answered {e.code} for {page}") from e
    if ctype.startswith(_JSON):
        try:
            files = json.loads(body)["files"]
            return [
                (f["filename"], urllib.parse.urljoin(final, f["url"]), dict(f.get("hashes", {})))
                for f in files
            ]
        except (ValueError, KeyError, TypeError) as e:
            raise SourceError(f"{what}: {page} is not a PEP 691 project page ({e})") from e
    links = _Links()
    links.feed(body.decode("utf-8", errors="replace"))
    out = []
    for href in links.hrefs:
        url, _, fragment = urllib.parse.urljoin(final, href).partition("#")
        algo, _, digest = fragment.partition("=")
        filename = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
        out.append((filename, url, {algo: digest} if digest else {}))
    return out


class _Links(html.parser.HTMLParser):
    """The anchors' hrefs of a PEP 503 project page."""

    def __init__(self):
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.hrefs.append(href)


def _read(url: str, what: str, accept: str = "*/*") -> tuple[bytes, str, str]:
    """(body, content type, final url) of a small page; a file:// directory reads its index."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "file":
        path = Path(urllib.request.url2pathname(parts.path))
        if path.is_dir():
            path = path / "index.html"
        if not path.is_file():
            raise urllib.error.HTTPError(url, 404, "not found", None, None)  # type: ignore[arg-type]
        return path.read_bytes(), "text/html", path.as_uri()
    req = _request(url, accept)
    for attempt in range(TRIES):
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
                return r.read(MAX_SDIST_BYTES), r.headers.get("Content-Type", ""), r.geturl()
        except urllib.error.HTTPError:
            raise
        except (urllib.error.URLError, OSError) as e:
            if attempt == TRIES - 1:
                raise SourceError(f"{what}: cannot reach {url}: {e}") from e
            time.sleep(2**attempt)
    raise AssertionError("unreachable")


def _request(url: str, accept: str = "*/*") -> urllib.request.Request:
    """A GET; the index URL's user:password (as pip takes them) go to the index's host only."""
    headers = {"Accept": accept, "User-Agent": "c2-mined"}
    index, parts = urllib.parse.urlsplit(index_url()), urllib.parse.urlsplit(url)
    if index.username is not None and index.hostname == parts.hostname:
        user = urllib.parse.unquote(index.username)
        password = urllib.parse.unquote(index.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    bare = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()  # no userinfo
    return urllib.request.Request(bare, headers=headers)


def _download(url: str, out: Path, what: str) -> None:
    """URL into OUT, under MAX_SDIST_BYTES and DEADLINE_S, retried on network errors."""
    for attempt in range(TRIES):
        try:
            return _download_once(url, out, what)
        except urllib.error.HTTPError as e:
            raise SourceError(f"{what}: the index answered {e.code} for {url}") from e
        except (urllib.error.URLError, OSError) as e:
            if attempt == TRIES - 1:
                raise SourceError(f"{what}: cannot download {url}: {e}") from e
            time.sleep(2**attempt)


def _download_once(url: str, out: Path, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    req = _request(url)
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r, open(out, "wb") as f:
        size = 0
        while chunk := r.read(1 << 20):
            size += len(chunk)
            if size > MAX_SDIST_BYTES:
                raise SourceError(f"{what}: {url} is over {MAX_SDIST_BYTES >> 20} MiB")
            if time.monotonic() > deadline:
                raise SourceError(f"{what}: {url} took over {DEADLINE_S:.0f} s")
            f.write(chunk)


def _unpack(archive: Path, dest: Path) -> None:
    dest.mkdir(parents=True)
    try:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                for info in z.infolist():
                    if info.filename.startswith("/") or ".." in Path(info.filename).parts:
                        raise SourceError(f"{archive.name}: unsafe path {info.filename!r}")
                z.extractall(dest)
        else:
            with tarfile.open(archive) as t:
                t.extractall(dest, filter="data")
    except (tarfile.TarError, zipfile.BadZipFile, OSError) as e:
        raise SourceError(f"{archive.name}: not a readable source archive ({e})") from e


def _single_root(dest: Path) -> Path:
    dirs = [d for d in dest.iterdir() if d.is_dir()]
    return dirs[0] if len(dirs) == 1 else dest
