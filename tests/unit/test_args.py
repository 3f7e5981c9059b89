"""Schema: the grpo: block as axolotl really loads it (plugin registered, schema merged, validated)."""

from __future__ import annotations

import copy

import pytest
import yaml
from pydantic import ValidationError

from grpo_plugin.args import GRPOSettings
from tests.conftest import axolotl_load_cfg


@pytest.fixture
def base_cfg(tiny_model_dir, tiny_data_file, tmp_path):
    return {
        "base_model": str(tiny_model_dir),
        "plugins": ["grpo_plugin.GRPOPlugin"],
        "rl": "grpo",
        "grpo": {"sync": "lora_sync"},
        "adapter": "lora",
        "lora_r": 8,
        "lora_alpha": 16,
        "lora_target_modules": ["q_proj", "v_proj"],
        "trl": {"num_generations": 4, "max_completion_length": 8, "reward_funcs": ["rewards.toy.digit_reward"]},
        "datasets": [{"path": str(tiny_data_file), "ds_type": "json", "split": "train"}],
        "micro_batch_size": 4,
        "gradient_accumulation_steps": 1,
        "max_steps": 2,
        "learning_rate": 1e-3,
        "sequence_len": 256,
        "output_dir": str(tmp_path / "out"),
    }


def load(cfg: dict, tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return axolotl_load_cfg(path)


def test_good_config_is_wired(base_cfg, tmp_path):
    cfg = load(base_cfg, tmp_path)
    assert cfg.grpo["sync"] == "lora_sync"
    assert cfg.grpo["sync_interval"] == 1
    assert cfg.trainer_cls == "grpo_plugin.trainer.GRPOPluginTrainer"
    assert cfg.trl.use_data_producer is True
    assert cfg.trl.use_vllm is True
    assert cfg.vllm.serve_module == "grpo_plugin.serve"


@pytest.mark.parametrize("strategy", [None, "reload", "process"])
def test_restart_config_is_wired(base_cfg, tmp_path, strategy):
    for key in ("adapter", "lora_r", "lora_alpha", "lora_target_modules"):
        base_cfg.pop(key)
    base_cfg["grpo"] = {"sync": "restart", "managed_server": True}
    if strategy:
        base_cfg["grpo"]["restart_strategy"] = strategy
    cfg = load(base_cfg, tmp_path)
    assert cfg.grpo["sync"] == "restart"
    assert cfg.grpo["restart_strategy"] == (strategy or "reload")


def test_empty_grpo_block_gets_defaults(base_cfg, tmp_path):
    base_cfg.pop("grpo")
    cfg = load(base_cfg, tmp_path)
    assert cfg.grpo["sync"] == "lora_sync" and cfg.grpo["verify_sync"] is True


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda c: c["grpo"].update(sync_intervall=2), "did you mean grpo.sync_interval"),
        (lambda c: c["grpo"].update(sync="ipc"), "'ipc' is not available yet"),
        (lambda c: c["grpo"].update(sync="restart"), "remove `adapter:`"),
        (lambda c: c["grpo"].update(restart_strategy="reload"), "only applies to `grpo.sync: restart`"),
        (lambda c: (c.pop("adapter"), c["grpo"].update(sync="restart", restart_strategy="process")),
         "Set `grpo.managed_server: true`"),
        (lambda c: (c.pop("adapter"), c["grpo"].update(sync="restart", restart_strategy="kill")),
         "'reload' or 'process'"),
        (lambda c: c["grpo"].update(sync="nccl"), "'ipc', 'lora_sync' or 'restart'"),
        (lambda c: c.pop("adapter"), "add `adapter: lora`"),
        (lambda c: c["grpo"].update(sync_interval=0), "sync_interval"),
        (lambda c: c["trl"].update(use_vllm=False), "trl.use_vllm: false"),
        (lambda c: c["trl"].update(vllm_lora_sync=True), "remove trl.vllm_lora_sync"),
        (lambda c: c["trl"].update(vllm_mode="colocate"), "trl.vllm_mode"),
        (lambda c: c["trl"].update(use_data_producer=False), "trl.use_data_producer: false"),
        (lambda c: c["trl"].update(async_prefetch=True), "trl.async_prefetch: true is not supported"),
        (lambda c: c.update(rl="dpo"), "needs `rl: grpo`"),
    ],
)
def test_bad_config_names_key_and_fix(base_cfg, tmp_path, mutate, expected):
    cfg = copy.deepcopy(base_cfg)
    mutate(cfg)
    with pytest.raises(ValidationError) as err:
        load(cfg, tmp_path)
    assert expected in str(err.value)


def test_settings_model_defaults():
    s = GRPOSettings()
    assert (s.sync, s.sync_interval, s.verify_sync, s.managed_server) == ("lora_sync", 1, True, False)
