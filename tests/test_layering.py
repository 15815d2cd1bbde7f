"""Import arrows run one way (parsed with ast, not imported): every unit of c2 (a package or a
top-level module) and pallas_kernels has a rule listing the units it may import; anything else,
or a unit without a rule, fails.

    passk, quant, sharding, distributed            leaves
    envs, data                                     leaves, independent of each other
    pallas_kernels, xla_cpu  <- quant              the kernels know no model
    model  <- quant, sharding, pallas_kernels
    infer  <- model, distributed
    train  <- model, data, envs                    knows no RL, eval or pipeline
    rl     <- train, infer, envs, data, passk      environments know no trainer
    eval   <- rl and below                         the RL stage knows no eval
    pipeline, main, bench  on top
"""

import ast
import functools
import pathlib

import pytest

ROOT = pathlib.Path(__file__).parent.parent

_LEAF = frozenset()
_MODEL = {"c2.model", "c2.quant", "c2.sharding", "pallas_kernels"}
_TRAIN = _MODEL | {"c2.train", "c2.data", "c2.envs", "c2.distributed", "c2.xla_cpu"}
_RL = _TRAIN | {"c2.rl", "c2.infer", "c2.passk"}
_EVAL = _RL | {"c2.eval"}
# Each unit: the units it may import (its own always).
ALLOWED = {
    "c2.passk": _LEAF,
    "c2.quant": _LEAF,
    "c2.sharding": _LEAF,
    "c2.distributed": _LEAF,
    "c2.envs": _LEAF,
    "pallas_kernels": {"c2.quant"},
    "c2.xla_cpu": {"c2.quant"},
    "c2.model": _MODEL,
    "c2.infer": _MODEL | {"c2.distributed"},
    "c2.data": _LEAF,
    "c2.train": _TRAIN,
    "c2.rl": _RL,
    "c2.eval": _EVAL,
    "c2.pipeline": _EVAL,
    "c2.main": _EVAL | {"c2.pipeline"},
    "c2.bench": _EVAL,
}
# Backward arrows still to remove (module -> modules it imports), so that none is added.
KNOWN: dict[str, set[str]] = {}


def imported_modules(path: pathlib.Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)  # from c2 import pipeline
    return out


def units(root: pathlib.Path) -> dict[str, list[pathlib.Path]]:
    """Each unit's files: c2's packages and top-level modules, and pallas_kernels."""
    out = {"pallas_kernels": sorted((root / "pallas_kernels").rglob("*.py"))}
    for p in sorted((root / "c2").iterdir()):
        if p.is_dir() and (p / "__init__.py").exists():
            out[f"c2.{p.name}"] = sorted(p.rglob("*.py"))
        elif p.suffix == ".py" and p.name != "__init__.py":
            out[f"c2.{p.stem}"] = [p]
    return out


def unit_of(module: str, names) -> str | None:
    """The unit a module belongs to (None outside c2 and pallas_kernels, or c2 itself)."""
    parts = module.split(".")
    if parts[0] == "pallas_kernels":
        return "pallas_kernels"
    if parts[0] == "c2" and len(parts) > 1 and f"c2.{parts[1]}" in names:
        return f"c2.{parts[1]}"
    return None


def backward_imports(root: pathlib.Path, allowed=ALLOWED, known=KNOWN) -> list[str]:
    by_unit = units(root)
    bad = [f"{u}: no rule in tests/test_layering.py ALLOWED" for u in by_unit if u not in allowed]
    for unit, files in by_unit.items():
        for path in files:
            rel = path.relative_to(root).as_posix()
            for mod in sorted(imported_modules(path)):
                to = unit_of(mod, by_unit)
                old = any(mod == k or mod.startswith(k + ".") for k in known.get(rel, ()))
                ok = to in (None, unit) or to in allowed.get(unit, ()) or old
                if not ok:
                    bad.append(f"{rel} imports {mod}")
    return bad


def test_the_parser_sees_every_kind_of_import(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import c2.eval.x\nfrom c2 import pipeline\ndef f():\n    from c2.rl import y\n")
    mods = imported_modules(f)
    assert {"c2.eval.x", "c2.pipeline", "c2.rl"} <= mods


def test_every_rule_names_real_units():
    names = set(units(ROOT))
    assert set(ALLOWED) <= names, set(ALLOWED) - names
    for unit, may in ALLOWED.items():
        assert set(may) <= names, (unit, set(may) - names)


def test_a_backward_import_and_a_unit_without_a_rule_fail(tmp_path):
    for pkg in ("c2/model", "c2/rl", "c2/envs", "pallas_kernels"):
        (tmp_path / pkg).mkdir(parents=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "c2/rl/a.py").write_text("from c2.envs import tasks\nimport numpy\n")
    (tmp_path / "c2/envs/b.py").write_text("def f():\n    from c2.rl.episodes import X\n")
    (tmp_path / "pallas_kernels/k.py").write_text("from c2 import model\n")
    (tmp_path / "c2/new.py").write_text("")
    allowed = {k: ALLOWED[k] for k in ("c2.model", "c2.rl", "c2.envs", "pallas_kernels")}
    assert sorted(backward_imports(tmp_path, allowed, {})) == [
        "c2.new: no rule in tests/test_layering.py ALLOWED",
        "c2/envs/b.py imports c2.rl.episodes",
        "c2/envs/b.py imports c2.rl.episodes.X",
        "pallas_kernels/k.py imports c2.model",
    ]


@functools.cache
def repo_backward_imports() -> tuple[str, ...]:
    return tuple(backward_imports(ROOT))


@pytest.mark.parametrize("unit", sorted(ALLOWED))
def test_imports_run_one_way(unit):
    files = tuple(unit.replace(".", "/") + end for end in ("/", ".py"))
    bad = [b for b in repo_backward_imports() if b.startswith(files)]
    assert not bad, bad


def test_every_unit_has_a_rule():
    bad = [b for b in repo_backward_imports() if "no rule" in b]
    assert not bad, bad
