"""Mining a source: its own suite judges candidate changes; levels combine the ones it keeps.

A Miner runs the suite in the sandbox over variants of the package (a baseline first: test files
that cannot be collected, tests that fail and tests whose ids are unstable are never used).
Candidates are AST mutation operators (mutations.py) and removed bodies (a documented function's
body becomes `raise NotImplementedError`); each is kept when it alone breaks a baseline-passing
test. A level ("1", "2", "3", "feature") picks and combines kept candidates into one change.
How the change becomes a task: mined.py.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import os
import random
import re
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from c2.envs.envcache import ensure_env
from c2.envs.grading import TestRun, pytest_outcomes
from c2.envs.mined_source import Source, _is_test_module
from c2.envs.mutations import Mutation, apply_all, kind_balanced, mutation_sites
from c2.envs.sandbox import Sandbox, SandboxLimits
from c2.envs.sdist import SourceError

LEVELS = ("1", "2", "3", "feature")
MAX_TRIES = 30  # candidate test runs per task before giving up on it
STUB_MIN_LINES = 3  # a removed body has at least this many lines
LEVEL3_STUB_LINES = 18  # level 3: removed bodies add up to at least this many lines
MAX_BASELINE_FAILING = 0.2  # a suite with more failing tests than this is broken, not usable
_STUB = "raise NotImplementedError"


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


# ---------------------------------------------------------------------- levels


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
