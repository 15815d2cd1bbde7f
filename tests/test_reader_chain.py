"""The shipped start policy is what its script makes: a short run of
experiments/reader_chain_tiny.sh (QUICK=1: every stage of the chain, 2 steps each) ends in a policy
directory with the shipped policy's files, the same config.json (architecture, sizes, tokenizer)
and the same tensors by name, shape and dtype. Only the training is shorter."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _support import xla_flags
from safetensors import safe_open

ROOT = Path(__file__).parent.parent
SHIPPED = ROOT / "experiments" / "policies" / "reader_tiny"


def _tensors(path: Path) -> dict[str, tuple]:
    with safe_open(path, "np") as f:
        return {k: (f.get_slice(k).get_shape(), f.get_slice(k).get_dtype()) for k in f.keys()}  # noqa: SIM118 - safe_open is no dict


@pytest.mark.slow
def test_a_short_run_of_the_chain_makes_the_shipped_policy_s_files(tmp_path):
    env = dict(os.environ, QUICK="1", PYTHON=sys.executable, PYTHONPATH=str(ROOT))
    env["XLA_FLAGS"] = xla_flags(None)  # one device, as the chain runs
    cmd = ["bash", str(ROOT / "experiments" / "reader_chain_tiny.sh"), str(tmp_path / "chain")]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    stages = [line.split()[-1] for line in out.stdout.splitlines() if " stage " in line]
    assert stages == [
        "1_copy_ordered", "1_copy_ordered", "2_copy", "3_recall", "3b_system_turns", "4_agent",
        "5_wide",
    ]  # fmt: skip
    made = tmp_path / "chain" / "policy"
    shipped_files = {p.name for p in SHIPPED.iterdir()} - {"README.md"}
    assert {p.name for p in made.iterdir()} == shipped_files == {"config.json", "model.safetensors"}
    config = json.loads((made / "config.json").read_text())
    assert config == json.loads((SHIPPED / "config.json").read_text())
    assert config["c2_tokenizer"] == "byte"
    assert _tensors(made / "model.safetensors") == _tensors(SHIPPED / "model.safetensors")
