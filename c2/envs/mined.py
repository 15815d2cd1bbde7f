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

Rooms: mined_source.py (steps 1-2: the default set, a source's layout), mined_changes.py (steps
3-5: the Miner, the candidates, the levels), here (step 6: the issue text, the written task, and
the generation over one source or the default set).

    python -m c2.envs.generate --source pypi:toolz==1.0.0 --out DIR --n 8 --seed 0
    python -m c2.envs.generate --source path/to/checkout --out DIR --n 4 --seed 0
    python -m c2.envs.generate --source default --split train --out DIR --n 4 --seed 0
"""

from __future__ import annotations

import ast
import concurrent.futures as cf
import difflib
import os
import random
import re
import shutil
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path

# The source, the judge and the levels live in mined_source.py and mined_changes.py; their
# public names stay importable from here.
from c2.envs.mined_changes import (  # noqa: F401
    LEVEL3_STUB_LINES,
    LEVELS,
    MAX_BASELINE_FAILING,
    MAX_TRIES,
    STUB_MIN_LINES,
    Miner,
    _Builder,
    _Found,
    _parse,
    candidates,
    covering_tests,
    stub_sites,
    symbol,
)
from c2.envs.mined_source import (  # noqa: F401
    DEFAULT_SET,
    SPLITS,
    PackageSpec,
    Source,
    _is_test_module,
    default_specs,
    load_source,
)
from c2.envs.sandbox import Sandbox
from c2.envs.sdist import (  # noqa: F401  (fetching lives in sdist.py; its names stay here too)
    SourceError,
    _norm,
    default_source_cache,
    fetch_sdist,
    parse_source,
)
from c2.envs.tasks import Task, write_task


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
