"""The package a mined task comes from: the pinned default set, and a source's layout.

A source (`pypi:NAME==VERSION`, fetched by sdist.py, or a local checkout) becomes a Source: its
importable packages/modules (egg-info top_level.txt, else the directories with __init__.py and
the top-level modules; a src/ layout is flattened to the workspace root), its own test suite
normalised to tests/, and the requirements of its environment (pytest pinned). How tasks are
mined from it: mined.py.
"""

from __future__ import annotations

import dataclasses
import email.parser
import os
import re
import tomllib
from collections.abc import Sequence
from pathlib import Path

from c2.envs.envcache import pytest_requirement
from c2.envs.sdist import SourceError, fetch_sdist, parse_source

SPLITS = ("train", "eval")
_NOT_PACKAGES = {
    "tests",
    "test",
    "testing",
    "docs",
    "doc",
    "examples",
    "example",
    "benchmarks",
    "bench",
    "build",
    "dist",
    "scripts",
    "tools",
    "ci",
    "src",
}
_NOT_MODULES = {
    "setup",
    "conftest",
    "noxfile",
    "fabfile",
    "tasks",
    "versioneer",
    "runtests",
    "bootstrap",
    "ez_setup",
    "release",
    "manage",
}


@dataclasses.dataclass(frozen=True)
class PackageSpec:
    """One pinned package of the default set."""

    name: str
    version: str
    split: str  # "train" or "eval" (held out: never trained on)
    requirements: tuple[str, ...] = ()  # test-only dependencies (its own come from PKG-INFO)
    ignore: tuple[str, ...] = ()  # test paths (relative to tests/) left out

    @property
    def source(self) -> str:
        return f"pypi:{self.name}=={self.version}"


# Pure-Python packages whose sdists carry their test suites; split by package.
DEFAULT_SET: tuple[PackageSpec, ...] = (
    PackageSpec("toolz", "1.0.0", "train"),
    PackageSpec("more-itertools", "10.5.0", "train"),
    # boltons' conftest uses the py.path hook argument that pytest 9 removed.
    PackageSpec("boltons", "24.1.0", "train", ("pytest==8.3.4",)),
    PackageSpec("cachetools", "5.5.0", "train"),
    PackageSpec("sqlparse", "0.5.1", "train"),
    PackageSpec("parse", "1.20.2", "train"),
    PackageSpec("jmespath", "1.0.1", "train"),
    PackageSpec("isodate", "0.7.2", "train"),
    # Without freezegun (it depends on python-dateutil, which would shadow the workspace): the
    # test modules that need it fail to collect and are dropped; property/ needs hypothesis.
    PackageSpec("python-dateutil", "2.9.0.post0", "eval", (), ("property",)),
    PackageSpec("inflection", "0.5.1", "eval"),
    PackageSpec("tabulate", "0.9.0", "eval"),
    PackageSpec("click", "8.1.7", "eval"),
)


def default_specs(split: str | None = None) -> list[PackageSpec]:
    if split not in (None, *SPLITS):
        raise ValueError(f"split={split!r}: expected one of {SPLITS}")
    return [s for s in DEFAULT_SET if split is None or s.split == split]


# ---------------------------------------------------------------------- the source's layout


@dataclasses.dataclass
class Source:
    """A package to mine: its files as they go in the workspace, its tests, its environment."""

    origin: str  # "pypi:toolz==1.0.0" or "dir:/abs/path"
    name: str
    version: str
    summary: str
    packages: list[str]  # top-level import names
    files: dict[str, bytes]  # package files, relative to the workspace root (flattened)
    tests: dict[str, bytes]  # the test suite, relative to tests/
    requirements: list[str]  # the environment (pytest pinned)
    split: str | None = None
    dropped_tests: list[str] = dataclasses.field(default_factory=list)

    @property
    def test_modules(self) -> list[str]:
        return sorted(p for p in self.tests if _is_test_module(p))

    def text(self, rel: str) -> str:
        return self.files[rel].decode()


def _is_test_module(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def _read_tree(base: Path, skip: Path | None = None) -> dict[str, bytes]:
    out = {}
    for p in sorted(base.rglob("*")):
        rel = p.relative_to(base)
        if skip is not None and (p == skip or skip in p.parents):
            continue
        if "__pycache__" in rel.parts or any(x.startswith(".") for x in rel.parts):
            continue
        if p.is_symlink() or not p.is_file() or p.suffix in (".pyc", ".pyo", ".so", ".pyd"):
            continue
        out[rel.as_posix()] = p.read_bytes()
    return out


def _metadata(root: Path) -> tuple[str | None, str | None, str, list[str], list[str]]:
    """(name, version, summary, requirements, top-level names) from PKG-INFO / pyproject.toml."""
    name = version = None
    summary, reqs, top = "", [], []
    pkg_info = root / "PKG-INFO"
    if pkg_info.is_file():
        msg = email.parser.Parser().parsestr(pkg_info.read_text(errors="replace"))
        name, version, summary = msg.get("Name"), msg.get("Version"), msg.get("Summary") or ""
        reqs = [r for r in msg.get_all("Requires-Dist") or [] if "extra ==" not in r]
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        try:
            project = tomllib.loads(pyproject.read_text()).get("project", {})
        except (tomllib.TOMLDecodeError, UnicodeDecodeError):
            project = {}
        name = name or project.get("name")
        version = version or (project.get("version") if isinstance(project, dict) else None)
        summary = summary or project.get("description", "")
        if not pkg_info.is_file():
            reqs = [r for r in project.get("dependencies", []) if isinstance(r, str)]
    for tl in sorted(root.glob("*.egg-info/top_level.txt")) + sorted(
        root.glob("src/*.egg-info/top_level.txt")
    ):
        top = [x.strip() for x in tl.read_text().split() if x.strip()]
        break
    return name, version, summary.strip(), reqs, top


def load_source(
    spec: str,
    *,
    requirements: Sequence[str] = (),
    ignore: Sequence[str] = (),
    cache_dir: str | os.PathLike | None = None,
    split: str | None = None,
) -> Source:
    """Fetch (pypi:) or read (a directory) a source and find its packages and its tests."""
    kind, what, version = parse_source(spec)
    if kind == "pypi":
        root = fetch_sdist(what, version, cache_dir)
        origin = f"pypi:{what}=={version}"
    else:
        root = Path(what)
        origin = f"dir:{what}"
    name, meta_version, summary, reqs, top = _metadata(root)
    name = name or (what if kind == "pypi" else root.name)
    version = version or meta_version or "local"
    base = root / "src" if (root / "src").is_dir() else root
    top = [t for t in top if (base / t / "__init__.py").is_file() or (base / f"{t}.py").is_file()]
    if not top:
        top = sorted(
            d.name
            for d in base.iterdir()
            if d.is_dir() and (d / "__init__.py").is_file() and d.name not in _NOT_PACKAGES
        )
        top += sorted(
            p.stem
            for p in base.glob("*.py")
            if p.stem not in _NOT_MODULES and not _is_test_module(p.name) and p.stem != "test"
        )
    if not top:
        raise SourceError(f"source {origin}: no Python package or module found in {root}")

    tests: dict[str, bytes] = {}
    in_package_tests = None
    for cand in [root / "tests", root / "test"] + [
        base / t / s for t in top for s in ("tests", "test")
    ]:  # noqa: E501
        if cand.is_dir() and any(_is_test_module(p.name) for p in cand.rglob("*.py")):
            tests = _read_tree(cand)
            if cand.parent != root:
                in_package_tests = cand
            break
    if not tests:
        for p in sorted(root.glob("*.py")):
            if _is_test_module(p.name) or p.name == "test.py":
                tests["test_" + p.name if p.name == "test.py" else p.name] = p.read_bytes()
    if (root / "conftest.py").is_file() and "conftest.py" not in tests:
        tests["conftest.py"] = (root / "conftest.py").read_bytes()
    for pattern in ignore:
        tests = {
            k: v for k, v in tests.items() if not (k == pattern or k.startswith(pattern + "/"))
        }
    if not any(_is_test_module(k) for k in tests):
        raise SourceError(
            f"source {origin}: no tests found (looked for tests/, test/, <package>/tests and "
            f"test_*.py in {root}); a source must carry its own test suite"
        )
    files: dict[str, bytes] = {}
    for t in top:
        if (base / t).is_dir():
            for rel, data in _read_tree(base / t, skip=in_package_tests).items():
                files[f"{t}/{rel}"] = data
        else:
            files[f"{t}.py"] = (base / f"{t}.py").read_bytes()
    reqs = [*reqs, *requirements]
    if not any(re.match(r"pytest\b", r) for r in reqs):
        reqs.append(pytest_requirement())
    return Source(origin, name, version, summary, top, files, tests, sorted(set(reqs)), split)
