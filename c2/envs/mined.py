"""Repair and feature tasks mined from real packages, in the manner of SWE-smith.

A source is a package's source distribution from PyPI (`pypi:NAME==VERSION`: the sdist file,
hash-checked and unpacked without building anything, whatever its build backend, then cached
under $C2_SOURCE_CACHE, default ~/.cache/c2/sources: sdist.py) or a local checkout (a
directory). Its own test suite is the judge:

  1. Layout. The importable packages/modules (egg-info top_level.txt, else the directories with
     __init__.py and the top-level modules; a src/ layout is flattened so the package sits at the
     workspace root, where both the grader and `python -m pytest` in the workspace import it) and
     the test suite (tests/, test/, PKG/tests, PKG/test or top-level test_*.py; a top-level
     conftest.py joins it), normalised to tests/ (so ids read "tests/test_x.py::test_y").
  2. Environment. The package's dependencies and test dependencies (plus the pinned pytest) are
     installed once into a cached environment (envcache.ensure_env); tasks name it in metadata
     "environment", and the sandbox mounts it read-only for the agent's tools and the graders.
     The package itself is never installed there: it lives in the workspace, which the agent
     edits.
  3. Baseline. The whole suite runs once in the sandbox, exactly as the "pytest" grader runs
     hidden tests. Test files that cannot be collected there (a missing optional dependency) are
     dropped; tests that fail at baseline are never used, nor are parametrized tests whose ids
     differ between two baseline runs (numbered in hash order). A suite that mostly fails, or never
     passes, is an error.
  4. Candidates. AST mutation operators (mutations.py) on every function and method of the
     package, and "removed bodies": a documented function or method whose body (docstring kept)
     becomes `raise NotImplementedError`. Each candidate is run against the test files that
     mention its function or class (cheap; the whole suite when none does), and kept when some
     baseline-passing test fails and nothing fails to collect.
  5. Levels. "1": one operator mutation. "2": two, in different functions (in different files
     when the package has several). "3": removed bodies adding up to at least 18 lines plus two
     operator mutations, across functions and files (the largest reference fixes). "feature": one
     documented function or method removed, to be implemented from its docstring. Every part of a
     multi-part task breaks a test on its own, so every part of the fix is needed.
  6. The task. The combined change runs against the whole suite: fail_to_pass = baseline-passing
     tests that now fail (kept only if non-empty, with nothing failing to collect), pass_to_pass =
     every other baseline-passing test (the whole suite: no subsampling). The reference solution
     is the original files.

Hidden tests and the workspace: tests/ of the task (hidden) is the package's whole collectable
suite; the workspace holds the package and the suite minus the files that contain a
fail_to_pass test (SWE-bench hides the tests that check the fix; here the rest of the suite
stays visible so the agent can look for regressions). Pytest configuration files of the source
(setup.cfg, tox.ini, pytest.ini, pyproject.toml) are not copied: the grader runs without them.

    python -m c2.envs.generate --source pypi:toolz==1.0.0 --out DIR --n 8 --seed 0
    python -m c2.envs.generate --source path/to/checkout --out DIR --n 4 --seed 0
    python -m c2.envs.generate --source default --split train --out DIR --n 4 --seed 0
"""

from __future__ import annotations

import ast
import concurrent.futures as cf
import dataclasses
import difflib
import email.parser
import math
import os
import random
import re
import shutil
import tempfile
import textwrap
import threading
import time
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path

from c2.envs.envcache import ensure_env, pytest_requirement
from c2.envs.grading import TestRun, pytest_outcomes
from c2.envs.mutations import Mutation, apply_all, kind_balanced, mutation_sites
from c2.envs.sandbox import Sandbox, SandboxLimits
from c2.envs.sdist import (  # noqa: F401  (fetching lives in sdist.py; its names stay here too)
    SourceError,
    _norm,
    default_source_cache,
    fetch_sdist,
    parse_source,
)
from c2.envs.tasks import Task, write_task

LEVELS = ("1", "2", "3", "feature")
SPLITS = ("train", "eval")
MAX_TRIES = 30  # candidate test runs per task before giving up on it
STUB_MIN_LINES = 3  # a removed body has at least this many lines
LEVEL3_STUB_LINES = 18  # level 3: removed bodies add up to at least this many lines
MAX_BASELINE_FAILING = 0.2  # a suite with more failing tests than this is broken, not usable
_STUB = "raise NotImplementedError"
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


# ---------------------------------------------------------------------- running the suite


class Miner:
    """Runs a source's tests in the sandbox over variants of its package files."""

    def __init__(self, source: Source, sandbox: Sandbox, *, env_cache=None):
        self.source = source
        self.sandbox = sandbox
        try:
            self.python_env = ensure_env(source.requirements, cache_dir=env_cache)
        except Exception as e:
            raise SourceError(f"source {source.origin}: its environment did not build: {e}") from e
        self._check_not_installed()
        self.limits = SandboxLimits(timeout_s=600, memory_mb=2048, max_output_bytes=1 << 20)
        t0 = time.monotonic()
        self.baseline = self._baseline()
        self.baseline_s = time.monotonic() - t0
        self.limits = dataclasses.replace(self.limits, timeout_s=self.test_timeout_s)

    @property
    def test_timeout_s(self) -> int:
        return max(60, math.ceil(self.baseline_s * 5))

    def _check_not_installed(self) -> None:
        """The environment must not hold the package under test: it would shadow the workspace
        (which goes last on sys.path)."""
        site = list(Path(self.python_env).glob("lib/python*/site-packages"))
        clash = [
            t
            for t in self.source.packages
            for s in site
            if (s / t).is_dir() or (s / f"{t}.py").is_file()
        ]
        if clash:
            raise SourceError(
                f"source {self.source.origin}: its environment installs {clash} itself (a "
                f"dependency of {self.source.requirements}?), which would shadow the workspace"
            )

    def run(self, overrides: dict[str, str] | None = None, tests: Sequence[str] | None = None):
        """Outcomes of the suite (or of the test modules `tests`, with every support file) over
        the package with `overrides` (path -> text) applied."""
        src = self.source
        with tempfile.TemporaryDirectory(prefix="c2-mine-") as d:
            ws, td = Path(d) / "ws", Path(d) / "tests"
            for rel, data in src.files.items():
                _write(ws / rel, data)
            for rel, text in (overrides or {}).items():
                _write(ws / rel, text.encode())
            keep = set(tests) if tests is not None else None
            for rel, data in src.tests.items():
                if keep is None or rel in keep or not _is_test_module(rel):
                    _write(td / rel, data)
            self.sandbox.give_workspace(d)
            os.chmod(d, 0o755)
            return pytest_outcomes(
                td, ws, self.sandbox, limits=self.limits, python_env=self.python_env
            )

    def _baseline(self) -> TestRun:
        src = self.source
        for _ in range(10):
            run = self.run()
            collection = (run.error or "").startswith("collection errors")
            if not run.outcomes and run.error and not collection:
                raise SourceError(f"source {src.origin}: its test suite did not run: {run.error}")
            dropped = _collect_error_files(run, src.tests)
            if not dropped:
                break
            src.dropped_tests = sorted({*src.dropped_tests, *dropped})
            src.tests = {k: v for k, v in src.tests.items() if k not in dropped}
            if not src.test_modules:
                raise SourceError(
                    f"source {src.origin}: no test module can be collected "
                    f"(collection errors in {dropped[:5]})"
                )
        if run.error:
            raise SourceError(f"source {src.origin}: its test suite did not run: {run.error}")
        # A second run: parametrized tests whose ids change between runs (ids numbered in set or
        # dict order, which hash randomisation reshuffles) cannot be graded by id; drop them all.
        again = self.run()
        unstable = {t.split("[")[0] for t in set(run.outcomes) ^ set(again.outcomes)}
        unstable |= {t.split("[")[0] for t, o in run.outcomes.items() if again.outcomes.get(t) != o}
        self.unstable = sorted(unstable)
        run = dataclasses.replace(
            run,
            outcomes={t: o for t, o in run.outcomes.items() if t.split("[")[0] not in unstable},
        )
        passed = [t for t, o in run.outcomes.items() if o == "passed"]
        failed = sorted(t for t, o in run.outcomes.items() if o == "failed")
        if not passed or len(failed) > MAX_BASELINE_FAILING * len(run.outcomes):
            raise SourceError(
                f"source {src.origin}: its own tests fail before any change ({len(failed)} of "
                f"{len(run.outcomes)} failed, e.g. {failed[:3]}); a source must pass its suite"
            )
        return run

    def split(self, run: TestRun, ran: Sequence[str] | None = None):
        """(fail_to_pass, pass_to_pass) of `run` against the baseline, or None when it failed to
        collect, produced nothing, or broke no baseline-passing test."""
        if run.error or not run.outcomes:
            return None
        base = self.baseline.outcomes  # stable ids only
        ids = [t for t, o in base.items() if o == "passed"]
        if ran is not None:
            mods = set(ran)
            ids = [t for t in ids if t.split("::")[0][len("tests/") :] in mods]
        f2p = sorted(t for t in ids if not run.passed(t))
        p2p = sorted(t for t in ids if run.passed(t))
        return (f2p, p2p) if f2p else None


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _collect_error_files(run: TestRun, tests: dict[str, bytes]) -> list[str]:
    """Test modules that could not be collected, as the grader names them (pytest runs nothing
    after a collection error, and the grader names the first three: the caller repeats)."""
    if not run.error or not run.error.startswith("collection errors"):
        return []
    named = {n.split("::")[0].removeprefix("tests/") for n in re.findall(r"'([^']+)'", run.error)}
    return sorted(rel for rel in tests if _is_test_module(rel) and rel in named)


# ---------------------------------------------------------------------- candidates

# CPython 3.11's ast.parse is not thread-safe ("AST constructor recursion depth mismatch" when
# two threads parse at once): tasks are built in threads, so every parse here takes this lock.
_AST_LOCK = threading.Lock()


def _parse(source: str) -> ast.Module:
    with _AST_LOCK:
        return ast.parse(source)


def _doc_functions(source: str):
    """(qualname, node) of top-level functions and methods (one class level)."""
    tree = _parse(source)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield f"{node.name}.{item.name}", item


def stub_sites(source: str, file: str) -> list[Mutation]:
    """Every documented public function or method whose body (after the docstring) can become
    `raise NotImplementedError`, as one Mutation each (kind "removed_body")."""
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    out = []
    for qual, fn in _doc_functions(source):
        body = fn.body
        has_doc = (
            body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        )
        if not has_doc or len(body) < 2 or any(p.startswith("_") for p in qual.split(".")):
            continue
        first, last = body[1], body[-1]
        if first.lineno <= body[0].end_lineno or first.lineno <= fn.lineno:
            continue  # statements share a line: no clean cut
        n = last.end_lineno - first.lineno + 1
        if n < STUB_MIN_LINES:
            continue
        indent = lines[first.lineno - 1][: first.col_offset]
        if indent.strip():
            continue
        start, end = starts[first.lineno - 1], starts[last.end_lineno]
        new = f"{indent}{_STUB}\n"
        desc = f"removed the body of {qual} ({n} lines)"
        out.append(Mutation("removed_body", file, qual, first.lineno, start, end, new, desc))
    return out


def _module_name(file: str) -> str:
    mod = file[: -len(".py")].replace("/", ".")
    return mod[: -len(".__init__")] if mod.endswith(".__init__") else mod


def symbol(m: Mutation) -> str:
    """The mutated function as an importable path: toolz.itertoolz.partition_all."""
    return f"{_module_name(m.file)}.{m.function}"


def _lines(m: Mutation, source: str) -> int:
    return len(source[m.start : m.end].splitlines()) if m.kind == "removed_body" else 1


@dataclasses.dataclass
class _Candidates:
    bugs: list[Mutation]
    stubs: list[Mutation]


def candidates(source: Source) -> _Candidates:
    bugs, stubs = [], []
    for rel in sorted(source.files):
        if not rel.endswith(".py") or rel.rsplit("/", 1)[-1] in ("_version.py", "version.py"):
            continue
        try:
            text = source.text(rel)
            bugs += mutation_sites(text, rel)
            stubs += stub_sites(text, rel)
        except (UnicodeDecodeError, SyntaxError, ValueError):
            continue
    return _Candidates(bugs, stubs)


def covering_tests(source: Source, m: Mutation) -> list[str]:
    """Test modules that mention the mutated function (or its class, for a method)."""
    parts = m.function.split(".")
    name = parts[0] if len(parts) > 1 and parts[-1].startswith("__") else parts[-1]
    pattern = re.compile(rf"\b{re.escape(name)}\b")
    out = []
    for rel in source.test_modules:
        if pattern.search(source.tests[rel].decode(errors="replace")):
            out.append(rel)
    return out


def _kind_balanced(items: list[Mutation], rng: random.Random) -> list[Mutation]:
    """A random order in which every operator kind is equally likely at each draw."""
    by_kind: dict[str, list[Mutation]] = {}
    for m in items:
        by_kind.setdefault(m.kind, []).append(m)
    return kind_balanced(by_kind, rng)


# ---------------------------------------------------------------------- tasks


@dataclasses.dataclass
class _Found:
    changes: list[Mutation]
    f2p: list[str]
    p2p: list[str]
    files: dict[str, str]  # mutated package files (path -> text)


class _Builder:
    def __init__(self, miner: Miner):
        self.miner = miner
        self.source = miner.source
        self.cands = candidates(self.source)
        self._cache: dict[tuple, bool] = {}

    def breaks(self, m: Mutation) -> bool:
        """Does `m` alone break a baseline-passing test of the modules that mention it?"""
        key = (m.file, m.start, m.end, m.new)
        if key not in self._cache:
            # No test names it (a data-driven suite): the whole suite decides.
            mods = covering_tests(self.source, m) or self.source.test_modules
            ok = False
            if mods:
                text = m.apply(self.source.text(m.file))
                try:
                    _parse(text)
                except SyntaxError:
                    text = None
                if text is not None:
                    run = self.miner.run({m.file: text}, mods)
                    ok = self.miner.split(run, mods) is not None
            self._cache[key] = ok
        return self._cache[key]

    def pick(self, pool, want, chosen, tries, spread_files, stop=None) -> bool:
        """Add up to `want` candidates from `pool` to `chosen`, each in a function not yet
        chosen; `tries` is a one-element budget list."""
        n_files = len({m.file for m in pool})
        for m in pool:
            if want <= 0 or (stop is not None and stop()):
                return True
            if tries[0] <= 0:
                return False
            if any(c.file == m.file and c.function == m.function for c in chosen):
                continue
            if any(c.file == m.file and not (m.end <= c.start or c.end <= m.start) for c in chosen):
                continue
            if spread_files and n_files > 1 and chosen and all(c.file == m.file for c in chosen):
                continue
            tries[0] -= 1
            if self.breaks(m):
                chosen.append(m)
                want -= 1
        return want <= 0 or (stop is not None and stop())

    def build(self, level: str, rng: random.Random, share: Callable[[list], list]):
        c = self.cands
        bugs = share(_kind_balanced(c.bugs, rng))
        stubs = list(c.stubs)
        rng.shuffle(stubs)
        tries = [MAX_TRIES]
        chosen: list[Mutation] = []
        if level == "1":
            ok = self.pick(bugs, 1, chosen, tries, False)
        elif level == "2":
            ok = self.pick(bugs, 2, chosen, tries, True)
        elif level == "feature":
            ok = self.pick(share(stubs), 1, chosen, tries, False)
        elif level == "3":
            # Longer bodies first among a random half: big fixes, still varied.
            stubs = share(stubs)
            stubs.sort(key=lambda m: -_lines(m, self.source.text(m.file)) * rng.random())

            def enough():
                return sum(_lines(m, self.source.text(m.file)) for m in chosen) >= LEVEL3_STUB_LINES

            ok = self.pick(stubs, 3, chosen, tries, True, stop=enough) and enough()
            ok = ok and self.pick(bugs, 2, chosen, tries, True)
        else:
            raise ValueError(f"level={level!r}: expected one of {LEVELS}")
        if not ok:
            return None
        files = {}
        for f in sorted({m.file for m in chosen}):
            files[f] = apply_all(self.source.text(f), [m for m in chosen if m.file == f])
        split = self.miner.split(self.miner.run(files))
        if split is None or not split[1]:
            return None
        return _Found(chosen, split[0], split[1], files)


def lines_changed(before: str, after: str) -> int:
    """Lines added plus lines removed (what `git diff --stat` counts)."""
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
    return sum(1 for d in diff if d[:1] in "+-" and not d.startswith(("+++", "---")))


def _test_snippet(source: Source, test_id: str, max_lines: int = 8) -> str | None:
    path, *names = test_id.split("::")
    rel = path[len("tests/") :]
    if rel not in source.tests or not names:
        return None
    text = source.tests[rel].decode(errors="replace")
    try:
        tree = _parse(text)
    except SyntaxError:
        return None
    scope = tree.body
    node = None
    for name in names:
        name = name.split("[")[0]
        node = next(
            (
                n
                for n in scope
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                and n.name == name
            ),  # noqa: E501
            None,
        )
        if node is None:
            return None
        scope = node.body
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:] or body
    first = min([body[0].lineno] + [d.lineno for d in getattr(body[0], "decorator_list", [])])
    lines = text.splitlines()[first - 1 : node.end_lineno]
    snippet = textwrap.dedent("\n".join(lines)).strip("\n")
    kept = [ln for ln in snippet.splitlines() if ln.strip()][:max_lines]
    return "\n".join(ln[:100] for ln in kept)


def _few(ids: list[str], k: int = 2) -> str:
    shown = ", ".join(f"`{t}`" for t in ids[:k])
    return shown + (f" and {len(ids) - k} more" if len(ids) > k else "")


def instruction(
    source: Source, level: str, found: _Found, rng: random.Random, visible_tests: bool = True
) -> str:
    """A short issue: the package, the symptom (failing tests, a reproduction), never the fix."""
    about = f"`{source.name}` {source.version}"
    if source.summary:
        about += f" ({source.summary.rstrip('.')})"
    f2p = found.f2p
    example = f2p[rng.randrange(len(f2p))]
    snippet = _test_snippet(source, example)
    repro = (
        f"\n\nA failing check from `{example}`:\n\n```python\n{snippet}\n```\n" if snippet else ""
    )
    stubs = [m for m in found.changes if m.kind == "removed_body"]
    bugs = [m for m in found.changes if m.kind != "removed_body"]
    modules = sorted({m.file for m in found.changes})
    rule = "Do not edit the tests; `python -m pytest -q tests` runs the visible ones."
    if not visible_tests:
        rule = "The tests that check this are not in the workspace; write your own checks."
    if level == "feature":
        m = stubs[0]
        text = rng.choice(
            [
                f"{about}: `{symbol(m)}` in `{m.file}` is missing its implementation (it raises "
                f"NotImplementedError). Implement it as its docstring describes; {len(f2p)} tests "
                f"depend on it, e.g. {_few(f2p, 1)}.",
                f"Feature request for {about}: implement `{m.function}` in `{m.file}`. The "
                f"signature and docstring are there; the body is not. Tests such as "
                f"{_few(f2p, 1)} expect it.",
            ]
        )
        return f"{text} {rule}{repro}"
    if level == "1":
        m = bugs[0]
        text = rng.choice(
            [
                f"{about}: `{symbol(m)}` gives wrong results since the last change; "
                f"{_few(f2p)} fail.",
                f"Bug report for {about}: {_few(f2p)} fail. The regression is somewhere in "
                f"`{m.file}`.",
                f"{about}: the test suite is red ({len(f2p)} failing, e.g. `{example}`). Find "
                f"the bug in the package and fix it.",
            ]
        )
        return f"{text} {rule}{repro}"
    where = ", ".join(f"`{f}`" for f in modules)
    if level == "2":
        text = (
            f"{about}: after a bad merge {len(f2p)} tests fail ({_few(f2p)}). Two separate bugs "
            f"are involved, in {where}. Fix both."
        )
        return f"{text} {rule}{repro}"
    names = ", ".join(f"`{symbol(m)}`" for m in stubs)
    if len(stubs) == 1:
        missing = f"{names} without an implementation (it raises NotImplementedError; its "
        missing += "docstring says what it does)"
    else:
        missing = f"{names} without implementations (they raise NotImplementedError; their "
        missing += "docstrings say what they do)"
    regressions = "1 regression" if len(bugs) == 1 else f"{len(bugs)} regressions"
    text = (
        f"{about}: a refactoring left {missing} and introduced {regressions} elsewhere in "
        f"{where}. {len(f2p)} tests fail ({_few(f2p)}). Implement what is missing and fix "
        f"the regressions."
    )
    return f"{text} {rule}{repro}"


def _task_id(source: Source, level: str, seed: int, index: int) -> str:
    base = re.sub(r"[^A-Za-z0-9.]+", "-", f"{_norm(source.name)}-{source.version}")
    return f"{base}-L{level}-s{seed}-{index:04d}"


def _write_atomic(root: Path, **kwargs) -> Task:
    """write_task into a hidden sibling, then rename: no half-written task is ever visible."""
    tmp = root.parent / f".tmp-{root.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write_task(tmp, **kwargs)
        if root.exists():
            raise FileExistsError(f"task {str(root)!r} already exists")
        os.rename(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    from c2.envs.tasks import load_task

    return load_task(root)


def generate_mined(
    source_spec: str | Source,
    out_dir: str | os.PathLike,
    *,
    n: int,
    seed: int,
    levels: Sequence[str] = LEVELS,
    sandbox: Sandbox | None = None,
    workers: int = 2,
    requirements: Sequence[str] = (),
    ignore: Sequence[str] = (),
    split: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    log: Callable[[str], None] | None = None,
) -> list[Task]:
    """Up to `n` tasks from one source (task i at level levels[i % len(levels)]); a task whose
    candidates all fail validation within MAX_TRIES is skipped (reported through `log`).
    Deterministic: the same source, seed, n and levels give the same tasks."""
    bad = [x for x in levels if x not in LEVELS]
    if bad or n < 1:
        raise ValueError(f"levels {bad} / n {n}: expected levels from {LEVELS} and n >= 1")
    if isinstance(source_spec, Source):
        source = source_spec
    else:
        source = load_source(
            source_spec, requirements=requirements, ignore=ignore, cache_dir=cache_dir, split=split
        )
    sandbox = sandbox or Sandbox()
    miner = Miner(source, sandbox)
    builder = _Builder(miner)
    if not builder.cands.bugs:
        raise SourceError(f"source {source.origin}: no function to mutate in {source.packages}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plan = [(i, levels[i % len(levels)]) for i in range(n)]
    per_level = {lv: [i for i, x in plan if x == lv] for lv in set(levels)}

    def one(i_level):
        i, level = i_level
        slot, stride = per_level[level].index(i), len(per_level[level])
        order_rng = random.Random(f"c2-mined:{source.origin}:{seed}:{level}:order")
        task_rng = random.Random(f"c2-mined:{source.origin}:{seed}:{i}")

        # The tasks of one level try disjoint slices of one shuffled order: never the same bug.
        def share(items):
            return items[slot::stride]

        found = builder.build(level, order_rng, share)
        if found is None:
            if log:
                log(f"{source.origin}: task {i} (level {level}): no valid change within budget")
            return None
        return _emit(source, miner, out, level, seed, i, found, task_rng)

    with cf.ThreadPoolExecutor(max(1, workers)) as ex:
        return [t for t in ex.map(one, plan) if t is not None]


def _emit(source, miner, out, level, seed, index, found: _Found, rng) -> Task:
    hidden = sorted({t.split("::")[0][len("tests/") :] for t in found.f2p})
    workspace: dict[str, str | bytes] = dict(source.files)
    workspace.update(found.files)
    for rel, data in source.tests.items():
        if rel not in hidden:
            workspace[f"tests/{rel}"] = data
    workspace["README.md"] = (
        f"# {source.name} {source.version}\n\n{source.summary}\n\n"
        "Run the tests with `python -m pytest -q tests`.\n"
    )
    solution = {f: source.files[f] for f in sorted(found.files)}
    changed = sum(lines_changed(found.files[f], source.text(f)) for f in found.files)
    kind = {"feature": "feature", "3": "mixed"}.get(level, "repair")
    metadata = {
        "task_id": _task_id(source, level, seed, index),
        "source": source.origin,
        "package": source.name,
        "version": source.version,
        "split": source.split,
        "kind": kind,
        "level": level,
        "difficulty": {"1": 1, "2": 2, "feature": 2, "3": 3}[level],
        "seed": seed,
        "index": index,
        "symbols": [symbol(m) for m in found.changes],
        "mutations": [{**m.to_dict(), "symbol": symbol(m)} for m in found.changes],
        "fail_to_pass": found.f2p,
        "pass_to_pass": found.p2p,
        "hidden_test_files": [f"tests/{h}" for h in hidden],
        "dropped_test_files": [f"tests/{d}" for d in source.dropped_tests],
        "unstable_tests": miner.unstable,
        "solution_lines_changed": changed,
        "grader": "pytest",
        "environment": {"requirements": source.requirements},
        "test_timeout_s": miner.test_timeout_s,
    }
    visible = any(k.startswith("tests/") and _is_test_module(k) for k in workspace)
    text = instruction(source, level, found, rng, visible)
    return _write_atomic(
        out / metadata["task_id"],
        instruction=text,
        metadata=metadata,
        workspace=workspace,
        tests=dict(source.tests),
        solution=solution,
    )


def generate_default(
    out_dir: str | os.PathLike,
    *,
    n: int,
    seed: int,
    split: str | None = None,
    levels: Sequence[str] = LEVELS,
    sandbox: Sandbox | None = None,
    workers: int = 2,
    log: Callable[[str], None] | None = None,
) -> dict[str, dict]:
    """`n` tasks per package of the default set (of one split): {source: {tasks, seconds}}, or
    {source: {tasks: [], error}} for a package that could not be mined."""
    sandbox = sandbox or Sandbox()
    report: dict[str, dict] = {}
    for spec in default_specs(split):
        t0 = time.monotonic()
        try:
            tasks = generate_mined(
                spec.source,
                Path(out_dir) / spec.split,
                n=n,
                seed=seed,
                levels=levels,
                sandbox=sandbox,
                workers=workers,
                requirements=spec.requirements,
                ignore=spec.ignore,
                split=spec.split,
                log=log,
            )
        except SourceError as e:  # one broken package does not stop the others
            report[spec.source] = {"tasks": [], "error": str(e)}
            if log:
                log(f"error: {e}")
            continue
        seconds = round(time.monotonic() - t0, 1)
        report[spec.source] = {"tasks": [t.task_id for t in tasks], "seconds": seconds}
        if log:
            log(f"{spec.source}: {len(tasks)} tasks in {seconds:.0f}s")
    return report
