"""c2.bench.grading_throughput: every task graded by each revision under both graders."""

import json
from pathlib import Path

import pytest
from _support import skip_or_fail

from c2.bench import grading_throughput
from c2.envs.sandbox import Sandbox


@pytest.fixture(scope="module")
def sandbox_ok():
    sb = Sandbox()
    if not sb.isolated:
        skip_or_fail(
            f"grading needs bubblewrap namespaces; this machine has {sb.isolation.describe()}",
            "sandbox isolation",
        )


def test_each_revision_grades_every_oracle_under_both_graders(sandbox_ok, tmp_path):
    here = Path(grading_throughput.__file__).resolve().parents[2]
    out = tmp_path / "r.json"
    grading_throughput.main(["--n", "2", "--baseline", str(here), "--out", str(out)])
    got = json.loads(out.read_text())
    assert set(got["graders"]) == {"functions", "pytest"}
    for row in got["graders"].values():
        for rev in ("this", "baseline"):
            assert row[rev]["n"] == 2 and all(t > 0 for t in row[rev]["times_s"])
        assert row["time_ratio"] == pytest.approx(
            sum(row["this"]["times_s"]) / sum(row["baseline"]["times_s"])
        )


def test_a_baseline_without_c2_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="holds no c2 checkout"):
        grading_throughput.main(["--n", "1", "--baseline", str(tmp_path)])
