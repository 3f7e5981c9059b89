"""Sync storage and checkpoint naming (pure, no server)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from grpo_plugin.config.storage import SyncDir, SyncStorageError, remove_stale
from grpo_plugin.sync.restart import checkpoint_tensors


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_sync_dir_is_private_tagged_and_removed(tmp_path):
    d = SyncDir("restart", tmp_path)
    assert d.path.parent == tmp_path and d.path.name.startswith(f"grpo_plugin-restart-{os.getpid()}-")
    (d.path / "model.safetensors").write_bytes(b"x" * 10)
    d.close()
    assert not d.path.exists()


def test_stale_dirs_of_dead_runs_are_removed_live_ones_kept(tmp_path):
    dead = tmp_path / f"grpo_plugin-restart-{_dead_pid()}-abc"
    alive = tmp_path / f"grpo_plugin-lora-{os.getppid()}-def"  # our parent is alive
    foreign = tmp_path / "someone-elses-dir"
    for p in (dead, alive, foreign):
        p.mkdir()
        (p / "f").write_text("x")
    assert remove_stale(tmp_path) == [dead]
    assert not dead.exists() and alive.exists() and foreign.exists()
    # and a new SyncDir does the same on creation
    dead2 = tmp_path / f"grpo_plugin-lora-{_dead_pid()}-xyz"
    dead2.mkdir()
    SyncDir("lora", tmp_path).close()
    assert not dead2.exists() and alive.exists()


def test_space_check_names_the_sizes_and_the_key(tmp_path):
    d = SyncDir("restart", tmp_path)
    try:
        d.ensure_space(1024, "writing the weights")
        with pytest.raises(SyncStorageError, match=r"needs .* MiB but only .* MiB are free .*grpo.sync_dir"):
            d.ensure_space(1 << 60, "writing the weights")
    finally:
        d.close()


@pytest.mark.parametrize("tied", [True, False])
def test_checkpoint_tensors_dedupes_tied_weights_and_are_live(tied):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=tied)
    model = Qwen2ForCausalLM(cfg)
    tensors = checkpoint_tensors(model)
    assert ("lm_head.weight" in tensors) is (not tied)
    assert "model.embed_tokens.weight" in tensors
    assert set(tensors) <= set(model.state_dict())
    assert sum(t.numel() for t in tensors.values()) == sum(p.numel() for p in model.parameters())
    with torch.no_grad():  # an in-place optimizer update is visible without asking again
        model.model.embed_tokens.weight.add_(1.0)
    assert torch.equal(tensors["model.embed_tokens.weight"], model.model.embed_tokens.weight)
