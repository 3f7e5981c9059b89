"""checkpoints.py: a run killed while saving must not stop the next one from resuming.

The last picker is axolotl's own `determine_last_checkpoint`, called here on the config the plugin settled."""

from __future__ import annotations

import json

import pytest
from axolotl.utils.dict import DictDefault
from axolotl.utils.train import determine_last_checkpoint

from grpo_plugin.plugin import GRPOPlugin
from grpo_plugin.training.checkpoints import (
    TRAINER_STATE,
    CheckpointError,
    checkpoints,
    is_complete,
    plan_resume,
    settle_resume,
)


def _ckpt(out, step, complete=True):
    d = out / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "adapter_model.safetensors").write_bytes(b"x")
    if complete:
        (d / TRAINER_STATE).write_text(json.dumps({"global_step": step}))
    return d


def _cfg(out, **kw):
    return DictDefault({"output_dir": str(out), "auto_resume_from_checkpoints": True, **kw})


def test_checkpoints_sorted_by_step_not_by_name(tmp_path):
    for s in (10, 9, 100):
        _ckpt(tmp_path, s)
    (tmp_path / "checkpoint-x").mkdir()
    (tmp_path / "checkpoint-7.tmp").mkdir()
    assert [p.name for p in checkpoints(tmp_path)] == ["checkpoint-9", "checkpoint-10", "checkpoint-100"]
    assert checkpoints(tmp_path / "missing") == []


def test_auto_resume_skips_a_checkpoint_killed_mid_save_and_axolotl_picks_the_complete_one(tmp_path, caplog):
    _ckpt(tmp_path, 3)
    _ckpt(tmp_path, 6, complete=False)
    cfg = _cfg(tmp_path)
    # without the plugin, axolotl picks checkpoint-6 (transformers then fails: "Can't find a valid checkpoint")
    assert determine_last_checkpoint(DictDefault(dict(cfg)), update=True).endswith("checkpoint-6")
    with caplog.at_level("WARNING", logger="grpo_plugin"):
        assert settle_resume(cfg).endswith("checkpoint-3")
    assert determine_last_checkpoint(cfg) == str(tmp_path / "checkpoint-3")
    assert not (tmp_path / "checkpoint-6").exists()
    kept = tmp_path / "incomplete-checkpoint-6"
    assert (kept / "adapter_model.safetensors").exists()  # moved aside, nothing deleted
    assert "checkpoint-6 never finished saving" in caplog.text and "Resuming from" in caplog.text


def test_only_incomplete_checkpoints_start_fresh_instead_of_failing(tmp_path):
    _ckpt(tmp_path, 3, complete=False)
    cfg = _cfg(tmp_path)
    assert settle_resume(cfg) is None
    assert determine_last_checkpoint(cfg) is None
    assert (tmp_path / "incomplete-checkpoint-3").is_dir()


def test_a_second_incomplete_save_of_the_same_step_is_kept_too(tmp_path):
    (tmp_path / "incomplete-checkpoint-6").mkdir()
    _ckpt(tmp_path, 3)
    _ckpt(tmp_path, 6, complete=False)
    settle_resume(_cfg(tmp_path))
    assert (tmp_path / "incomplete-checkpoint-6-2").is_dir()


def test_other_ranks_decide_the_same_without_moving_anything(tmp_path):
    _ckpt(tmp_path, 3)
    _ckpt(tmp_path, 6, complete=False)
    cfg = _cfg(tmp_path)
    assert settle_resume(cfg, rank=1).endswith("checkpoint-3")
    assert cfg.resume_from_checkpoint.endswith("checkpoint-3")
    assert (tmp_path / "checkpoint-6").is_dir()


def test_an_explicit_incomplete_checkpoint_is_an_error_naming_the_complete_one(tmp_path):
    _ckpt(tmp_path, 3)
    bad = _ckpt(tmp_path, 6, complete=False)
    with pytest.raises(CheckpointError, match=r"checkpoint-6 is incomplete .*resume from .*checkpoint-3"):
        plan_resume(tmp_path, str(bad), auto=False)
    with pytest.raises(CheckpointError, match="checkpoint-6 is incomplete"):
        GRPOPlugin().post_trainer_create(_cfg(tmp_path, resume_from_checkpoint=str(bad)), trainer=None)
    assert bad.is_dir()  # an explicit choice is never moved


def test_complete_and_unrelated_setups_are_left_alone(tmp_path):
    good = _ckpt(tmp_path, 3)
    assert is_complete(good)
    assert plan_resume(tmp_path, None, auto=False).resume_from is None  # no auto-resume: start fresh
    cfg = _cfg(tmp_path, resume_from_checkpoint=str(good))
    assert settle_resume(cfg) == str(good)
    assert settle_resume(_cfg(tmp_path / "new")) is None  # no output_dir yet
