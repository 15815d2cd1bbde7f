"""The task generator: templates, renaming, determinism, validity, splits, and the evaluate CLI
with the oracle (100%) and no-op (0%) agents."""

import concurrent.futures as cf
import hashlib
import io
import json
import random
import subprocess
import sys
import tokenize

import pytest

from c2.envs.generate import (
    _outcomes,
    generate,
    generate_task,
    instantiate,
    load_templates,
    rename_source,
)
from c2.envs.tasks import load_tasks


def test_splits_share_no_template():
    train = {t.name for t in load_templates("train")}
    evals = {t.name for t in load_templates("eval")}
    assert train and evals and not train & evals
    assert train | evals == {t.name for t in load_templates()}


def test_rename_options_never_collide_with_existing_names():
    for t in load_templates():
        names = set()
        for p in t.root.rglob("*.py"):
            toks = tokenize.generate_tokens(io.StringIO(p.read_text()).readline)
            names |= {tok.string for tok in toks if tok.type == tokenize.NAME}
        options = []
        for key, opts in t.spec["rename"].items():
            assert key in names, (t.name, key)
            assert not [o for o in opts if o != key and o in names], (t.name, key)
            options += opts
        assert len(options) == len(set(options)), t.name
        assert set(t.spec.get("constants", {})) <= names, t.name


def test_rename_source_keeps_layout_and_renames_words():
    src = 'def area(w, h):  # area of a box\n    """Return the area."""\n    return w*h\n\n\ndef test_area_small():\n    assert area(1, 2) == 2\n'  # noqa: E501
    out = rename_source(src, {"area": "surface"})
    assert out == src.replace("area", "surface")


class _Nth:
    """An rng stand-in whose choice() always takes option k: covers every rename option."""

    def __init__(self, k):
        self.k = k

    def choice(self, options):
        return options[self.k % len(options)]


@pytest.mark.slow
def test_every_rename_and_constant_option_keeps_the_tests_green(sandbox):
    variants = [instantiate(t, _Nth(k)) for t in load_templates() for k in range(4)]
    assert len({v.package for v in variants}) > len(load_templates())
    with cf.ThreadPoolExecutor(4) as ex:
        runs = list(ex.map(lambda v: _outcomes(v.files, sandbox), variants))
    for v, run in zip(variants, runs):
        assert any(path.startswith(v.package + "/") for path in v.files)
        assert run.error is None and run.outcomes, (v.template.name, v.names, run.error)
        assert set(run.outcomes.values()) == {"passed"}, (v.template.name, v.names, run.outcomes)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    from c2.envs.sandbox import Sandbox

    out = tmp_path_factory.mktemp("gen")
    tasks = generate(out, n=4, seed=11, split="train", levels=["1", "2", "3", "feature"],
                     sandbox=Sandbox(), workers=2)  # fmt: skip
    return out, tasks


def _tree_hash(path):
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        h.update(str(p.relative_to(path)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.mark.slow
def test_generated_tasks_are_valid(generated):
    out, tasks = generated
    assert [t.metadata["kind"] for t in tasks] == ["repair", "repair", "repair", "feature"]
    train = {t.name for t in load_templates("train")}
    for t, bugs in zip(tasks, (1, 2, 3, 0)):
        m = t.metadata
        assert m["template"] in train and m["split"] == "train" and m["seed"] == 11
        assert len(m["mutations"]) == bugs
        if bugs > 1:
            assert len({x["file"] for x in m["mutations"]}) >= 2  # several bugs across files
            assert len({(x["file"], x["function"]) for x in m["mutations"]}) == bugs
        assert m["fail_to_pass"] and m["pass_to_pass"]
        assert not set(m["fail_to_pass"]) & set(m["pass_to_pass"])
        assert 100 < len(t.instruction) < 700
        assert sorted(p.name for p in t.tests_dir.iterdir()) == sorted(
            p.name for p in (t.workspace_dir / "tests").iterdir()
        )
        for rel in (p.relative_to(t.solution_dir) for p in t.solution_dir.rglob("*.py")):
            assert (t.solution_dir / rel).read_text() != (t.workspace_dir / rel).read_text()
    assert tasks[3].metadata["difficulty"] == 3 and "only a stub" in tasks[3].instruction


@pytest.mark.slow
def test_generation_is_deterministic_by_seed(generated, tmp_path):
    from c2.envs.sandbox import Sandbox

    _, tasks = generated
    sb = Sandbox()
    for index, level in ((0, "1"), (3, "feature")):
        again = generate_task(
            tmp_path, index=index, seed=11, split="train", level=level, sandbox=sb
        )
        assert again.task_id == tasks[index].task_id
        assert _tree_hash(again.root) == _tree_hash(tasks[index].root)
    # Another seed draws other names and constants (no sandbox needed to see that).
    t = load_templates("train")[0]
    draws = {json.dumps(instantiate(t, random.Random(f"seed{s}")).names) for s in range(6)}
    assert len(draws) > 1


@pytest.mark.slow
def test_eval_split_uses_eval_templates(tmp_path, sandbox):
    t = generate_task(tmp_path, index=0, seed=5, split="eval", level="1", sandbox=sandbox)
    assert t.metadata["template"] in {x.name for x in load_templates("eval")}


def _evaluate_cli(tasks_dir, agent, out):
    p = subprocess.run(
        [sys.executable, "-m", "c2.envs.evaluate", "--tasks", str(tasks_dir), "--agent", agent,
         "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().split("\n")
    return lines[:-1], json.loads(lines[-1])


@pytest.mark.slow
def test_evaluate_cli_oracle_passes_all_noop_none(generated, tmp_path):
    out, tasks = generated
    lines, summary = _evaluate_cli(out, "oracle", tmp_path / "oracle.jsonl")
    assert summary["pass_rate"] == 1.0 and summary["n"] == len(tasks)
    got = sorted(line.split("\t")[:2] for line in lines)
    assert got == sorted([t.task_id, "PASS"] for t in tasks)
    records = [json.loads(x) for x in (tmp_path / "oracle.jsonl").read_text().splitlines()]
    for r in records:
        assert set(r) >= {"correctness", "quality", "efficiency", "interaction"}
        assert r["interaction"]["submitted"] and r["interaction"]["invalid_tool_calls"] == 0
        assert r["efficiency"]["tool_calls"] >= 3 and r["quality"]["new_findings"] == 0
    lines, summary = _evaluate_cli(out, "noop", tmp_path / "noop.jsonl")
    assert summary["pass_rate"] == 0.0
    assert all("fail_to_pass still failing" in line for line in lines)
    assert sorted(t.task_id for t in load_tasks(out)) == sorted(t.task_id for t in tasks)
