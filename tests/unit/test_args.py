"""Schema: the grpo: block as axolotl really loads it (plugin registered, schema merged, validated)."""

from __future__ import annotations

import copy

import pytest
import yaml
from pydantic import ValidationError

from grpo_plugin.config.schema import GRPOSettings
from tests.conftest import ROOT, axolotl_load_cfg


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
    assert cfg.vllm.serve_module == "grpo_plugin.vllm_serve"


def test_the_serve_modules_former_name_still_serves(base_cfg, tmp_path):
    """Configs written with `vllm.serve_module: grpo_plugin.serve` (the module's former name) keep it, and axolotl's
    `vllm-serve` (import_module(serve_module).main) reaches the same function."""
    from importlib import import_module

    from grpo_plugin.vllm_serve import main

    base_cfg["vllm"] = {"serve_module": "grpo_plugin.serve"}
    cfg = load(base_cfg, tmp_path)
    assert cfg.vllm.serve_module == "grpo_plugin.serve"
    assert import_module(cfg.vllm.serve_module).main is main


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


def test_ipc_defaults_and_server_spec(base_cfg, tmp_path):
    from grpo_plugin.config.lookups import run_config
    from grpo_plugin.server.process import spec_from

    _ipc(base_cfg)
    cfg = load(base_cfg, tmp_path)
    assert (cfg.grpo["ipc_fence"], cfg.grpo["ipc_gemm"]) == ("trainer", "onednn")
    spec = spec_from(run_config(cfg))
    # one copy, one dtype: the server gets the trainer's; no LoRA; the export dir and GEMM reach the worker
    assert spec.ipc and spec.dtype == "float32" and not spec.enable_lora
    env = spec.env(base={"VLLM_PLUGINS": "lora_filesystem_resolver"}, ipc_export="/dev/shm/x")
    assert env["GRPO_IPC_EXPORT"] == "/dev/shm/x" and env["GRPO_IPC_GEMM"] == "onednn"
    assert env["VLLM_PLUGINS"] == "lora_filesystem_resolver,grpo_plugin_ipc"
    assert env["VLLM_DISABLE_COMPILE_CACHE"] == "1"
    assert "GRPO_IPC_EXPORT" not in spec.env(base={})


def test_ipc_is_accepted_on_a_cuda_machine_with_one_server(base_cfg, tmp_path, monkeypatch):
    import grpo_plugin.config.server

    monkeypatch.setattr(grpo_plugin.config.server, "cuda_available", lambda: True)
    monkeypatch.delenv("GRPO_IPC_CUDA", raising=False)  # the opt-in it once needed is gone, not just defaulted
    _ipc(base_cfg)
    assert load(copy.deepcopy(base_cfg), tmp_path).grpo["sync"] == "ipc"
    # the CUDA-only refusal still applies (so this test does run the CUDA branch): one GPU copy, one server
    base_cfg["grpo"]["num_servers"] = 2
    with pytest.raises(ValidationError, match="2 servers: on CUDA ipc shares one GPU's weights with one server"):
        load(base_cfg, tmp_path)


def test_empty_grpo_block_gets_defaults(base_cfg, tmp_path):
    base_cfg.pop("grpo")
    cfg = load(base_cfg, tmp_path)
    assert cfg.grpo["sync"] == "lora_sync" and cfg.grpo["verify_sync"] is True


def _ipc(c: dict, vllm: dict | None = None, grpo: dict | None = None, **top) -> None:
    """Turn the LoRA base config into a full fine-tune with grpo.sync: ipc, plus the given changes."""
    c.pop("adapter")
    c["grpo"].update(sync="ipc", **(grpo or {}))
    c.update(bf16=False, fp16=False)
    c.setdefault("vllm", {}).update(vllm or {})
    c.update(top)


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda c: c["grpo"].update(sync_intervall=2), "did you mean grpo.sync_interval"),
        (lambda c: c["grpo"].update(sync="ipc"), "ipc shares the full weights for full fine-tuning"),
        (lambda c: _ipc(c, grpo={"sync_interval": 2}),
         "does not apply to `grpo.sync: ipc`"),
        (lambda c: _ipc(c, vllm={"host": "10.0.0.7"}),
         "the server must run on this machine"),
        (lambda c: _ipc(c, vllm={"tensor_parallel_size": 2}),
         "ipc shares the weights of ONE vLLM worker"),
        (lambda c: _ipc(c, vllm={"dtype": "bfloat16"}),
         "one shared copy has one dtype"),
        (lambda c: _ipc(c, gptq=True),
         "quantized base weights cannot be trained in place"),
        (lambda c: _ipc(c, deepspeed=str(ROOT / "deepspeed_configs/zero2.json")),
         "a gathered copy would be the second copy ipc exists to avoid"),
        (lambda c: c["grpo"].update(ipc_fence="server"), "grpo.ipc_fence only applies to `grpo.sync: ipc`"),
        (lambda c: _ipc(c, grpo={"ipc_fence": "nccl"}), "'trainer' or 'server'"),
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
        (lambda c: c["grpo"].update(sync_interval=4, max_policy_lag=1), "grpo.max_policy_lag: 1 is below"),
        (lambda c: c.update(rl="dpo"), "needs `rl: grpo`"),
        (lambda c: c.update(use_ray=True, ray_num_workers=2), "use_ray: true (axolotl's Ray Train launcher"),
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


def _atropos(c: dict, **atropos) -> dict:
    """The LoRA base config fed by Atropos: no datasets, no reward functions, the run-api on its own port."""
    c.pop("datasets")
    c["trl"].pop("reward_funcs")
    c["trl"].pop("num_generations")
    c["grpo"]["atropos"] = {"url": "http://127.0.0.1:8000", **atropos}
    c["vllm"] = {"port": 8001}
    return c


def test_atropos_config_is_wired(base_cfg, tmp_path):
    from grpo_plugin.config.checks import ATROPOS_DATASET_MARKER, ENV_SCORE_REWARD

    cfg = load(_atropos(base_cfg, group_size=2), tmp_path)
    a = cfg.grpo["atropos"]
    assert (a["group_size"], a["prefetch"], a["reset_on_start"], a["wait_timeout"]) == (2, 1, True, 1800.0)
    assert cfg.trl.reward_funcs == [ENV_SCORE_REWARD]
    assert cfg.trl.num_generations == 2
    assert [d["path"] for d in cfg.datasets] == [ATROPOS_DATASET_MARKER]


def test_atropos_without_group_size_groups_the_whole_batch(base_cfg, tmp_path):
    cfg = load(_atropos(base_cfg), tmp_path)
    assert cfg.trl.num_generations == 4  # micro_batch_size x gradient_accumulation_steps


def test_atropos_ipc_fence_defaults_to_server(base_cfg, tmp_path):
    _ipc(_atropos(base_cfg))
    assert load(base_cfg, tmp_path).grpo["ipc_fence"] == "server"


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda c: c["grpo"]["atropos"].update(prefech=2), "did you mean grpo.atropos.prefetch"),
        (lambda c: c["grpo"]["atropos"].update(url="localhost"), "must look like http://HOST:PORT"),
        (lambda c: c["grpo"]["atropos"].update(group_size=3), "is not a multiple of grpo.atropos.group_size 3"),
        (lambda c: c["grpo"]["atropos"].update(prefetch=0), "prefetch"),
        (lambda c: c["trl"].update(reward_funcs=["rewards.toy.digit_reward"]), "Remove trl.reward_funcs"),
        (lambda c: c.update(datasets=[{"path": "x.jsonl", "ds_type": "json"}]), "Remove datasets"),
        (lambda c: c.pop("max_steps"), "`max_steps` is required with grpo.atropos"),
        (lambda c: c["trl"].update(num_generations=3), "Remove trl.num_generations"),
        (lambda c: c["vllm"].update(port=8000), "use the same port"),
        (lambda c: _ipc(c, grpo={"ipc_fence": "trainer"}), "the environments generate on it too"),
        (lambda c: (c.pop("adapter"), c["grpo"].update(sync="restart", restart_strategy="process",
                                                       managed_server=True)),
         "breaks the Atropos environments"),
        (lambda c: c["grpo"]["atropos"].update(envs=[{"module": "m", "arg": []}]), "Extra inputs"),
        (lambda c: c.update(val_set_size=0.1, eval_strategy="steps", eval_steps=5),
         "Give the eval prompts as `test_datasets`"),
        (lambda c: c.update(test_datasets=[{"path": "t.jsonl", "ds_type": "json"}], eval_strategy="steps"),
         "Set grpo.atropos.eval_reward_funcs"),
        (lambda c: (c.update(test_datasets=[{"path": "t.jsonl", "ds_type": "json"}], eval_strategy="steps"),
                    c["grpo"]["atropos"].update(eval_reward_funcs=["rewards.toy.no_such_reward"])),
         "grpo.atropos.eval_reward_funcs: 'rewards.toy.no_such_reward'"),
    ],
)
def test_bad_atropos_config_names_key_and_fix(base_cfg, tmp_path, mutate, expected):
    cfg = _atropos(copy.deepcopy(base_cfg), group_size=2)
    mutate(cfg)
    with pytest.raises(ValidationError) as err:
        load(cfg, tmp_path)
    assert expected in str(err.value)


def test_atropos_with_a_local_eval_set_scored_by_its_own_reward_functions(base_cfg, tmp_path):
    cfg = _atropos(copy.deepcopy(base_cfg), group_size=2)
    cfg.update(test_datasets=[{"path": "t.jsonl", "ds_type": "json"}], eval_strategy="steps", eval_steps=5)
    cfg["grpo"]["atropos"]["eval_reward_funcs"] = ["rewards.toy.digit_reward"]
    loaded = load(cfg, tmp_path)
    assert loaded.grpo["atropos"]["eval_reward_funcs"] == ["rewards.toy.digit_reward"]


def test_every_mode_the_schema_accepts_has_a_builder():
    from grpo_plugin.config.modes import MODES, SYNC_MODES
    from grpo_plugin.sync import BUILDERS

    assert {mode.name for mode in BUILDERS} == set(SYNC_MODES) == set(MODES)


def test_policy_lag_bound_defaults_to_one_or_what_the_sync_interval_implies():
    assert GRPOSettings().policy_lag_bound == 1
    assert GRPOSettings(sync_interval=8).policy_lag_bound == 7
    assert GRPOSettings(max_policy_lag=0).policy_lag_bound == 0
    assert GRPOSettings(sync_interval=3, max_policy_lag=4).policy_lag_bound == 4
