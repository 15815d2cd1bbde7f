"""Import arrows run one way: model <- train <- eval <- pipeline (parsed with ast, not imported).

c2/model knows nothing of training; c2/train (steps, losses, held-out evaluation of a stage) knows
nothing of c2/eval (the pipeline's evaluation and report), of RL or of the pipeline; c2/pipeline.py
runs training, then evaluation, then the report, above both.
"""

import ast
import pathlib

import pytest

C2 = pathlib.Path(__file__).parent.parent / "c2"

FORBIDDEN = {
    "model": ("c2.train", "c2.eval", "c2.rl", "c2.pipeline"),
    "train": ("c2.eval", "c2.rl", "c2.pipeline"),
    "eval": ("c2.pipeline",),
}


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


def test_the_parser_sees_every_kind_of_import(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import c2.eval.x\nfrom c2 import pipeline\ndef f():\n    from c2.rl import y\n")
    mods = imported_modules(f)
    assert {"c2.eval.x", "c2.pipeline", "c2.rl"} <= mods


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_run_one_way(package):
    bad = [
        f"{path.relative_to(C2.parent)} imports {mod}"
        for path in sorted((C2 / package).rglob("*.py"))
        for mod in sorted(imported_modules(path))
        if any(mod == f or mod.startswith(f + ".") for f in FORBIDDEN[package])
    ]
    assert not bad, bad
