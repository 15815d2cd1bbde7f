"""Fetching sources to mine (sdist.py): the sdist file from the index, whatever its backend.

Offline: a local PEP 503 index (a file:// directory, as pip takes in $PIP_INDEX_URL) serving an
sdist whose pyproject names a build backend that is installed nowhere. Online, as the toolz tests
in test_mined.py: humanize (hatchling) and pyparsing (flit) from PyPI.
"""

import base64
import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from c2.envs import sdist
from c2.envs.mined import SourceError, load_source

_PYPROJECT = """[build-system]
requires = ["c2-absent-backend>=1"]
build-backend = "c2_absent_backend"

[project]
name = "c2demo"
version = "0.1"
description = "A package no installed backend can build"
"""
_FILES = {
    "pyproject.toml": _PYPROJECT,
    "PKG-INFO": "Metadata-Version: 2.1\nName: c2demo\nVersion: 0.1\nSummary: A demo\n",
    "src/c2demo/__init__.py": "def double(x):\n    return 2 * x\n",
    "tests/test_double.py": "from c2demo import double\n\n\ndef test_double():\n"
    "    assert double(2) == 4\n",
}


def _sdist(files: dict[str, str], top: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _index(root: Path, archives: dict[str, bytes], *, sha256: str | None = None) -> str:
    """A PEP 503 index at ROOT serving ARCHIVES of c2demo; its URL, as $PIP_INDEX_URL."""
    (root / "files").mkdir(parents=True)
    links = []
    for name, data in archives.items():
        (root / "files" / name).write_bytes(data)
        digest = sha256 or hashlib.sha256(data).hexdigest()
        links.append(f'<a href="../../files/{name}#sha256={digest}">{name}</a>')
    (root / "simple" / "c2demo").mkdir(parents=True)
    (root / "simple" / "c2demo" / "index.html").write_text(
        "<!DOCTYPE html><html><body>" + "<br>".join(links) + "</body></html>"
    )
    return (root / "simple").as_uri()


@pytest.fixture
def archive() -> bytes:
    return _sdist(_FILES, "c2demo-0.1")


def test_an_sdist_whose_backend_is_installed_nowhere_is_fetched(tmp_path, monkeypatch, archive):
    wheel_like = {"c2demo-0.1-py3-none-any.whl": b"not a source", "c2demo-0.2.tar.gz": b"x"}
    monkeypatch.setenv(
        "PIP_INDEX_URL", _index(tmp_path / "idx", {"c2demo-0.1.tar.gz": archive, **wheel_like})
    )
    src = load_source("pypi:c2demo==0.1", cache_dir=tmp_path / "cache")
    assert (src.origin, src.name, src.version) == ("pypi:c2demo==0.1", "c2demo", "0.1")
    assert src.packages == ["c2demo"] and src.files == {
        "c2demo/__init__.py": _FILES["src/c2demo/__init__.py"].encode()
    }
    assert src.tests == {"test_double.py": _FILES["tests/test_double.py"].encode()}
    digest = hashlib.sha256(archive).hexdigest()
    done = tmp_path / "cache" / "c2demo-0.1" / ".c2-complete"
    assert done.read_text() == f"c2demo-0.1.tar.gz sha256={digest}\n"
    # Cached: a second load reads the unpacked tree, not the index.
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "nowhere").as_uri())
    assert load_source("pypi:c2demo==0.1", cache_dir=tmp_path / "cache").files == src.files


def test_a_file_that_is_not_the_indexs_is_refused(tmp_path, monkeypatch, archive):
    wrong = hashlib.sha256(b"another file").hexdigest()
    monkeypatch.setenv(
        "PIP_INDEX_URL", _index(tmp_path / "idx", {"c2demo-0.1.tar.gz": archive}, sha256=wrong)
    )
    with pytest.raises(SourceError, match=f"the index says {wrong}: refusing"):
        sdist.fetch_sdist("c2demo", "0.1", tmp_path / "cache")
    assert not [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]  # nothing unpacked


def test_a_version_the_index_lacks_is_a_clear_error(tmp_path, monkeypatch, archive):
    monkeypatch.setenv("PIP_INDEX_URL", _index(tmp_path / "idx", {"c2demo-0.1.tar.gz": archive}))
    with pytest.raises(SourceError, match=r"pypi:c2demo==0\.2: no source distribution .* 1 files"):
        load_source("pypi:c2demo==0.2", cache_dir=tmp_path / "cache")
    with pytest.raises(SourceError, match=r"pypi:other==1\.0: no source distribution: .* not on"):
        load_source("pypi:other==1.0", cache_dir=tmp_path / "cache")


def test_index_credentials_go_to_the_index_host_only(monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "https://ann:p%40ss@idx.example/simple/")
    req = sdist._request("https://ann:p%40ss@idx.example/files/a-1.tar.gz")
    assert req.full_url == "https://idx.example/files/a-1.tar.gz"
    assert req.get_header("Authorization") == "Basic " + base64.b64encode(b"ann:p@ss").decode()
    assert sdist._request("https://files.example/a-1.tar.gz").get_header("Authorization") is None


@pytest.mark.parametrize(
    "spec,backend,modules",
    [
        ("pypi:humanize==4.12.3", "hatchling", {"test_filesize.py", "test_number.py"}),
        ("pypi:pyparsing==3.1.4", "flit_core", {"test_simple_unit.py", "test_unit.py"}),
    ],
)
def test_pypi_packages_built_by_hatchling_and_flit_reach_mining(tmp_path, spec, backend, modules):
    src = load_source(spec, cache_dir=tmp_path)
    name = spec.split(":")[1].split("==")[0]
    assert src.packages == [name] and f"{name}/__init__.py" in src.files
    assert modules <= set(src.test_modules)
    root = sdist.fetch_sdist(name, spec.split("==")[1], tmp_path)  # cached
    assert backend in (root / "pyproject.toml").read_text()
