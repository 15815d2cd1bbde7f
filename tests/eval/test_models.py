"""Loading policies to evaluate (c2/eval/models.py): a workdir exported as a Hugging Face directory
loads back exactly, tokenizer included, and starts a stage."""

import json

import chex
import pytest

from c2.data.tokenizer import ByteTokenizer
from c2.eval import models
from c2.train import lm
from c2.train.loop import load_init_params


def test_a_workdir_exports_to_an_hf_directory_that_loads_back_exactly(tmp_path, untrained_workdir):
    work = untrained_workdir(tmp_path / "stage", mtp_depth=1)
    hf_dir = tmp_path / "hf"
    models.main(["export", str(work), str(hf_dir)])
    src = models.load_model(str(work))
    out = models.load_model(f"hf:{hf_dir}")
    assert out.cfg == src.cfg
    chex.assert_trees_all_equal(out.params, src.params)  # MTP module and router bias included
    assert isinstance(out.tokenizer, ByteTokenizer)
    # ... and a stage started from it holds the same weights.
    _, config = models.stage_config(work)
    chex.assert_trees_all_equal(load_init_params(f"hf:{hf_dir}", lm.build_task(config)), src.params)


def test_an_hf_directory_without_a_tokenizer_is_refused_naming_what_is_missing(
    tmp_path, untrained_workdir
):
    hf_dir = tmp_path / "hf"
    models.export_stage(untrained_workdir(tmp_path / "stage"), hf_dir)
    cfg_file = hf_dir / "config.json"
    hf_cfg = json.loads(cfg_file.read_text())
    assert hf_cfg.pop(models.C2_TOKENIZER_KEY) == "byte"
    cfg_file.write_text(json.dumps(hf_cfg))
    with pytest.raises(FileNotFoundError, match="no tokenizer.json in it.*c2_tokenizer"):
        models.load_model(f"hf:{hf_dir}")


def test_export_takes_a_chosen_checkpoint_and_names_the_steps_there(tmp_path, untrained_workdir):
    import jax
    import jax.numpy as jnp

    from c2.train.checkpoint import Checkpointer, CorruptCheckpoint

    work = untrained_workdir(tmp_path / "stage")
    first = models.load_model(str(work)).params
    later = jax.tree.map(lambda x: 2 * x, first)
    ckpt = Checkpointer(work / "checkpoints", async_save=False)
    ckpt.save(5, later, {"unused": jnp.zeros(1)}, {}, force=True)
    ckpt.close()
    models.main(["export", str(work), str(tmp_path / "at0"), "--step", "0"])
    models.main(["export", str(work), str(tmp_path / "newest")])
    chex.assert_trees_all_equal(models.load_model(f"hf:{tmp_path / 'at0'}").params, first)
    chex.assert_trees_all_equal(models.load_model(f"hf:{tmp_path / 'newest'}").params, later)
    with pytest.raises(CorruptCheckpoint, match=r"step 3: no such checkpoint .*\[0, 5\]"):
        models.export_stage(work, tmp_path / "none", step=3)
