"""Every notebook in notebooks/ runs top to bottom (they import c2, never re-implement it), and the
conclusions it prints hold: the numbers are parsed back and the claimed relations checked."""

import pathlib
import re

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
NUM = r"([-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?)"


def find(pattern: str, text: str) -> list[float] | list[tuple]:
    hits = re.findall(pattern, text)
    assert hits, f"the notebook no longer prints {pattern!r}"
    return hits


def check_kl_estimators(text: str) -> None:
    """k1 and k3 unbiased, k2 biased; as gradients, k1 in the reward is unbiased and among the
    lowest-variance ones, k1 in the loss and k3 in the reward are biased; k3's std >> k1's; the
    Monte Carlo std of k1 matches its closed form."""
    value_line = rf"(k\d): mean {NUM} \([^,]*, [^)]*\), std {NUM}"
    values = {k: (v, std) for k, v, std in find(value_line, text)}
    assert "k2: mean" in text and re.search(r"k2: mean \S+ \(biased", text)
    for kind in ("k1", "k3"):
        assert re.search(rf"{kind}: mean \S+ \(no detectable bias", text), kind
    assert float(values["k3"][1]) > 5 * float(values["k1"][1])
    grads = dict(find(r"(k\d as (?:loss|reward))\s*: mean .*-> (biased|unbiased)", text))
    assert grads["k1 as reward"] == "unbiased" and grads["k2 as loss"] == "unbiased"
    assert grads["k1 as loss"] == grads["k3 as reward"] == grads["k2 as reward"] == "biased"
    lowest = find(r"lowest-variance unbiased gradient\(s\), std [\d.]+: (.*)", text)[0]
    assert "k1 as reward" in lowest
    stds, exact = find(rf"k1's MC std over 4 seeds at sigma=[\d.]+: (.*) \(exact {NUM}\)", text)[0]
    for s in stds.split(", "):
        assert float(s) == pytest.approx(float(exact), rel=0.02)


def check_length_penalty(text: str) -> None:
    """The linear penalty charges the hard prompt most; at k = 1e-3 a larger q shrinks the
    hard/easy gap ratio (more room to think), the named best has the smallest ratio; a correct
    answer always outranks a wrong one; std normalisation inflates length-only advantages."""
    linear = float(find(rf"hard prompt's length gap is {NUM}x the easy", text)[0])
    assert linear > 1
    ratio_line = rf"k = {NUM}, q = {NUM}: hard/easy gap ratio {NUM}"
    ratios = {(float(k), float(q)): float(r) for k, q, r in find(ratio_line, text)}
    by_q = [ratios[k, q] for k, q in sorted(ratios) if k == 1e-3]
    assert len(by_q) >= 3 and by_q == sorted(by_q, reverse=True) and by_q[0] < linear
    best = tuple(
        float(v) for v in find(rf"smallest hard/easy ratio\): k = {NUM}, q = {NUM}", text)[0]
    )
    assert ratios[best] == min(ratios.values())
    table_row = r"(?m)^[\d. ]+\|\s+[\d.]+\s+\|\s+[\d.]+\s+\|\s+[\d.]+\s+\| ([-+][\d.]+)$"
    margins = [float(m) for m in find(table_row, text)]
    assert len(margins) == len(ratios) + 1 and min(margins) > 0
    assert float(find(rf"Std normalisation multiplies .* by {NUM}x", text)[0]) > 1


CHECKS = {"kl_estimators.ipynb": check_kl_estimators, "length_penalty.ipynb": check_length_penalty}


def test_every_notebook_has_its_conclusions_checked():
    assert {p.name for p in NOTEBOOKS} == set(CHECKS)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes_and_its_conclusions_hold(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    # "python3" is ipykernel's native spec: this interpreter, so the installed c2 is importable.
    client = nbclient.NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError naming the failing cell
    outputs = [
        out for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
    ]
    errors = [out for out in outputs if out.get("output_type") == "error"]
    assert not errors, errors
    text = "".join(out.get("text", "") for out in outputs if out.get("output_type") == "stream")
    CHECKS[path.name](text)
