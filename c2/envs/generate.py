"""Procedural repair and feature tasks, deterministic by seed (in the manner of SWE-smith).

A template (templates/<name>/) is a small Python package with its tests and a spec.json naming
the identifiers to vary, the constants' possible values, the functions a feature task may ask for
and the split ("train" or "eval": the splits share no template). A task instantiates a template
(names and constants drawn from the seed), then either injects AST mutations (mutations.py) and
keeps only those that make at least one test fail while the others still pass, or strips one
function for the agent to implement.

    python -m c2.envs.generate --out DIR --n N --seed S [--split train] [--levels 1,2,3,feature]

With --source, tasks are mined from a real package and its own test suite instead (mined.py):

    python -m c2.envs.generate --source pypi:NAME==VERSION --out DIR --n N --seed S
    python -m c2.envs.generate --source DIR --out OUT --n N --seed S [--requirements a,b]
    python -m c2.envs.generate --source default [--split train|eval] --out DIR --n N --seed S
      (N tasks per package of mined.DEFAULT_SET, under DIR/train and DIR/eval)
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures as cf
import dataclasses
import io
import json
import random
import re
import sys
import tempfile
import tokenize
from collections.abc import Sequence
from pathlib import Path

from c2.envs.grading import TestRun, pytest_outcomes
from c2.envs.instructions import feature_instruction, repair_instruction
from c2.envs.mutations import Mutation, apply_all, kind_balanced, mutation_sites
from c2.envs.sandbox import Sandbox, SandboxLimits
from c2.envs.tasks import Task, write_task

TEMPLATES_DIR = Path(__file__).with_name("templates")
LEVELS = ("1", "2", "3", "feature")
_BUGS_PER_LEVEL = {"1": 1, "2": 2, "3": 3}
MAX_TRIES = 40  # candidate mutations tested per task before giving up on a template draw


@dataclasses.dataclass(frozen=True)
class Template:
    name: str
    root: Path
    spec: dict

    @property
    def split(self) -> str:
        return self.spec["split"]

    @property
    def package(self) -> str:
        return next(p.name for p in self.root.iterdir() if (p / "__init__.py").is_file())


def load_templates(split: str | None = None) -> list[Template]:
    out = []
    for d in sorted(TEMPLATES_DIR.iterdir()):
        if (d / "spec.json").is_file():
            t = Template(d.name, d, json.loads((d / "spec.json").read_text()))
            if t.split not in ("train", "eval"):
                raise ValueError(f"{d / 'spec.json'}: split={t.split!r}: expected train or eval")
            if split is None or t.split == split:
                out.append(t)
    if not out:
        raise ValueError(f"split={split!r}: no templates in {TEMPLATES_DIR}")
    return out


@dataclasses.dataclass(frozen=True)
class Variant:
    """One instantiation of a template: file path -> text, plus the choices made."""

    template: Template
    package: str
    files: dict[str, str]
    names: dict[str, str]
    constants: dict[str, object]

    def rename(self, text: str) -> str:
        return _rename_words(text, self.names)


def _rename_words(text: str, names: dict[str, str]) -> str:
    if not names:
        return text
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(names, key=len)[::-1])) + r")\b")
    return pattern.sub(lambda m: names[m.group(1)], text)


def _rename_parts(identifier: str, names: dict[str, str]) -> str:
    """Rename words inside a snake_case identifier (underscores count as word breaks)."""
    words = "|".join(map(re.escape, sorted(names, key=len, reverse=True)))
    pattern = rf"(?<![A-Za-z0-9])({words})(?![A-Za-z0-9])"
    return re.sub(pattern, lambda m: names[m.group(1)], identifier)


def rename_source(source: str, names: dict[str, str]) -> str:
    """Rename identifiers (NAME tokens) and the same words in strings and comments; every
    other character of the file stays where it was."""
    tokens = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME and tok.string in names:
            tok = tok._replace(string=names[tok.string])
        elif tok.type == tokenize.NAME and tok.string.startswith("test_"):
            # Test names follow the code: test_line_total_x -> test_line_cost_x.
            tok = tok._replace(string=_rename_parts(tok.string, names))
        elif tok.type in (tokenize.STRING, tokenize.COMMENT):
            tok = tok._replace(string=_rename_words(tok.string, names))
        tokens.append(tok)
    return tokenize.untokenize(tokens)


def _set_constants(source: str, constants: dict[str, object]) -> str:
    for name, value in constants.items():
        source = re.sub(rf"(?m)^{re.escape(name)} = .*$", f"{name} = {value!r}", source)
    return source


def instantiate(template: Template, rng: random.Random) -> Variant:
    names = {k: rng.choice(v) for k, v in sorted(template.spec.get("rename", {}).items())}
    consts = {k: rng.choice(v) for k, v in sorted(template.spec.get("constants", {}).items())}
    names = {k: v for k, v in names.items() if k != v}
    files = {}
    for path in sorted(template.root.rglob("*.py")):
        rel = path.relative_to(template.root)
        if "__pycache__" in rel.parts:
            continue
        text = rename_source(_set_constants(path.read_text(), consts), names)
        parts = [names.get(p, p) for p in rel.parts[:-1]] + [rel.parts[-1]]
        files["/".join(parts)] = text
    package = names.get(template.package, template.package)
    renamed_consts = {names.get(k, k): v for k, v in consts.items()}
    return Variant(template, package, files, names, renamed_consts)


def _outcomes(files: dict[str, str], sandbox: Sandbox) -> TestRun:
    with tempfile.TemporaryDirectory(prefix="c2-gen-") as d:
        for rel, text in files.items():
            p = Path(d) / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        sandbox.give_workspace(d)
        limits = SandboxLimits(timeout_s=120, memory_mb=1024)
        return pytest_outcomes(Path(d) / "tests", d, sandbox, limits=limits)


def _split_outcomes(run: TestRun, clean: TestRun) -> tuple[list[str], list[str]] | None:
    """(fail_to_pass, pass_to_pass) when the change breaks some but not all clean tests."""
    if run.error and run.error.startswith(("collection", "hidden tests produced")):
        return None
    f2p = sorted(t for t in clean.outcomes if not run.passed(t))
    p2p = sorted(t for t in clean.outcomes if run.passed(t))
    return (f2p, p2p) if f2p and p2p else None


def _stub_function(source: str, qualname: str) -> str:
    """Replace the body (docstring included) of `qualname` with `pass`."""
    tree = ast.parse(source)
    scope, parts = tree.body, qualname.split(".")
    node = None
    for part in parts:
        node = next(
            n for n in scope if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == part
        )
        scope = node.body
    lines = source.splitlines(keepends=True)
    first = node.body[0]
    indent = lines[first.lineno - 1][: first.col_offset]
    return "".join(lines[: first.lineno - 1] + [f"{indent}pass\n"] + lines[node.end_lineno :])


def _repair(variant, clean, level, rng, sandbox):
    pkg_files = [f for f in variant.files if f.startswith(variant.package + "/")]
    by_kind: dict[str, list[Mutation]] = {}
    for f in pkg_files:
        if not f.endswith("__init__.py"):
            for m in mutation_sites(variant.files[f], f):
                by_kind.setdefault(m.kind, []).append(m)
    sites = kind_balanced(by_kind, rng)
    want = _BUGS_PER_LEVEL[level]
    chosen: list[Mutation] = []
    for tries, m in enumerate(sites):
        if len(chosen) == want or tries >= MAX_TRIES:
            break
        if any(c.file == m.file and c.function == m.function for c in chosen):
            continue  # one bug per function: each fix is its own
        if want > 1 and len(chosen) == want - 1 and all(c.file == m.file for c in chosen):
            continue  # several bugs must span files
        files = {**variant.files, m.file: m.apply(variant.files[m.file])}
        if _split_outcomes(_outcomes(files, sandbox), clean):
            chosen.append(m)
    if len(chosen) < want:
        return None
    files = dict(variant.files)
    for f in {m.file for m in chosen}:
        files[f] = apply_all(variant.files[f], [m for m in chosen if m.file == f])
    split = _split_outcomes(_outcomes(files, sandbox), clean)
    if split is None:
        return None
    solution = {f: variant.files[f] for f in sorted({m.file for m in chosen})}
    return files, split, solution, chosen


def generate_task(
    out_dir: str | Path, *, index: int, seed: int, split: str, level: str, sandbox: Sandbox
) -> Task:
    """Task number `index` of the stream for (`seed`, `split`), at difficulty `level`."""
    if level not in LEVELS:
        raise ValueError(f"level={level!r}: expected one of {LEVELS}")
    templates = load_templates(split)
    rng = random.Random(f"c2-envs:{seed}:{split}:{index}")
    draws = 0
    for _ in range(8):
        draws += 1
        template = templates[rng.randrange(len(templates))]
        variant = instantiate(template, rng)
        clean = _outcomes(variant.files, sandbox)
        bad = [t for t, o in clean.outcomes.items() if o != "passed"]
        if clean.error or bad or not clean.outcomes:
            raise RuntimeError(
                f"template {template.name} fails its own tests: {clean.error} {bad[:3]}"
            )
        if level == "feature":
            found = _feature(variant, clean, rng, sandbox)
        else:
            found = _repair(variant, clean, level, rng, sandbox)
        if found is not None:
            break
    else:
        raise RuntimeError(f"task {index} (seed {seed}, level {level}): no valid bug found")
    files, (f2p, p2p), solution, detail = found
    task_id = f"{split}-{template.name}-s{seed}-{index:05d}"
    workspace = {k: v for k, v in files.items()}
    workspace["README.md"] = f"# {variant.package}\n\nRun the tests with `python -m pytest -q`.\n"
    tests = {k[len("tests/") :]: v for k, v in variant.files.items() if k.startswith("tests/")}
    if level == "feature":
        instruction = feature_instruction(variant, detail, rng)
        mutations = []
    else:
        instruction = repair_instruction(variant, detail, f2p, rng)
        mutations = [m.to_dict() for m in detail]
    metadata = {
        "task_id": task_id,
        "source": "generated",
        "template": template.name,
        "split": split,
        "kind": "feature" if level == "feature" else "repair",
        "difficulty": 3 if level == "feature" else int(level),
        "seed": seed,
        "index": index,
        "template_draws": draws,
        "fail_to_pass": f2p,
        "pass_to_pass": p2p,
        "mutations": mutations,
        "names": variant.names,
        "constants": variant.constants,
        "grader": "pytest",
    }
    return write_task(
        Path(out_dir) / task_id,
        instruction=instruction,
        metadata=metadata,
        workspace=workspace,
        tests=tests,
        solution=solution,
    )


def _feature(variant, clean, rng, sandbox):
    features = sorted(variant.template.spec.get("features", {}).items())
    if not features:
        return None
    key, description = features[rng.randrange(len(features))]
    path, qualname = key.split("::")
    path = "/".join(variant.names.get(p, p) for p in path.split("/"))
    qualname = ".".join(variant.names.get(p, p) for p in qualname.split("."))
    files = {**variant.files, path: _stub_function(variant.files[path], qualname)}
    split = _split_outcomes(_outcomes(files, sandbox), clean)
    if split is None:
        return None
    detail = {"file": path, "function": qualname, "description": variant.rename(description)}
    return files, split, {path: variant.files[path]}, detail


def generate(
    out_dir: str | Path,
    *,
    n: int,
    seed: int,
    split: str = "train",
    levels: Sequence[str] = LEVELS,
    sandbox: Sandbox | None = None,
    workers: int = 1,
) -> list[Task]:
    """Tasks 0..n-1 of the stream; task i has level levels[i % len(levels)]."""
    sandbox = sandbox or Sandbox()
    Path(out_dir).mkdir(parents=True, exist_ok=True)

    def one(i: int) -> Task:
        level = levels[i % len(levels)]
        return generate_task(out_dir, index=i, seed=seed, split=split, level=level, sandbox=sandbox)

    with cf.ThreadPoolExecutor(max(1, workers)) as ex:
        return list(ex.map(one, range(n)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m c2.envs.generate", description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", choices=("train", "eval"), default=None)
    parser.add_argument("--levels", default=",".join(LEVELS), help="comma-separated: 1,2,3,feature")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--source",
        default=None,
        help="mine a real package: pypi:NAME==VERSION, a local checkout DIR, or `default` "
        "(the pinned default set; --split picks train or eval packages, --n is per package)",
    )
    parser.add_argument(
        "--requirements",
        default="",
        help="with --source: extra pip requirements its tests need (comma-separated)",
    )
    args = parser.parse_args(argv)
    levels = [x.strip() for x in args.levels.split(",") if x.strip()]
    bad = [x for x in levels if x not in LEVELS]
    if bad or args.n < 1:
        parser.error(f"--levels {bad} / --n {args.n}: expected levels from {LEVELS} and n >= 1")
    if args.source is not None:
        return _main_mined(args, levels)
    args.split = args.split or "train"
    tasks = generate(
        args.out, n=args.n, seed=args.seed, split=args.split, levels=levels, workers=args.workers
    )
    for t in tasks:
        m = t.metadata
        print(
            f"{t.task_id}\t{m['kind']}\tdifficulty {m['difficulty']}\tf2p {len(m['fail_to_pass'])}"
        )
    print(
        json.dumps({"n": len(tasks), "out": str(args.out), "split": args.split, "seed": args.seed})
    )
    return 0


def _main_mined(args, levels: list[str]) -> int:
    from c2.envs import mined

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    reqs = [r.strip() for r in args.requirements.split(",") if r.strip()]
    try:
        if args.source == "default":
            report = mined.generate_default(
                args.out,
                n=args.n,
                seed=args.seed,
                split=args.split,
                levels=levels,
                workers=args.workers,
                log=log,
            )
            n = sum(len(r["tasks"]) for r in report.values())
            print(json.dumps({"n": n, "out": str(args.out), "seed": args.seed, "sources": report}))
            return 0
        tasks = mined.generate_mined(
            args.source,
            args.out,
            n=args.n,
            seed=args.seed,
            levels=levels,
            workers=args.workers,
            requirements=reqs,
            split=args.split,
            log=log,
        )
    except mined.SourceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for t in tasks:
        m = t.metadata
        print(
            f"{t.task_id}\t{m['kind']}\tlevel {m['level']}\tf2p {len(m['fail_to_pass'])}\t"
            f"lines {m['solution_lines_changed']}\t{','.join(m['symbols'])}"
        )
    print(
        json.dumps(
            {"n": len(tasks), "out": str(args.out), "source": args.source, "seed": args.seed}
        )
    )
    return 0 if tasks else 1


if __name__ == "__main__":
    sys.exit(main())
