"""preflight.py: what the config points at is checked before anything loads, every problem in one message."""

from __future__ import annotations

import shutil
from collections import namedtuple

import pytest

from grpo_plugin.config import preflight
from grpo_plugin.config.preflight import checkpoint_numel, config_problems, reward_func_problem


def test_reward_paths_resolve_like_axolotl_or_say_what_is_wrong(tmp_path, monkeypatch):
    assert reward_func_problem("rewards.gsm8k.accuracy_reward") is None
    assert reward_func_problem("org/reward-model") is None  # a hub reward model: axolotl loads it
    assert "Did you mean 'accuracy_reward'?" in reward_func_problem("rewards.gsm8k.acuracy_reward")
    assert "module 'rewards.gsmk8' not found" in reward_func_problem("rewards.gsmk8.accuracy_reward")
    assert "Did you mean 'rewards.gsm8k'?" in reward_func_problem("rewards.gsmk8.accuracy_reward")
    assert "not an import path" in reward_func_problem("accuracy_reward")
    (tmp_path / "badmod.py").write_text("raise RuntimeError('broken at import')\nx = 1\n")
    (tmp_path / "okmod.py").write_text("VALUE = 3\n")
    monkeypatch.chdir(tmp_path)  # imported from the working directory, as axolotl's trainer does
    assert "RuntimeError: broken at import" in reward_func_problem("badmod.fn")
    assert "is a int, not a function" in reward_func_problem("okmod.VALUE")


def test_a_rollout_func_in_the_working_directory_is_checked_and_stays_importable(tmp_path, monkeypatch):
    """trl.rollout_func: a typo is named before anything loads; a function in the run's directory is imported from
    there and stays imported, so axolotl's own import of it (after the check) finds it even when the directory is
    not on sys.path (`axolotl train ... --launcher python`)."""
    import importlib
    import sys

    (tmp_path / "my_agent_mod.py").write_text("def rollout(prompts, trainer):\n    return {}\n")
    monkeypatch.chdir(tmp_path)
    problems = config_problems({"trl": {"rollout_func": "my_agent_mod.rolout"}})
    assert problems == ["trl.rollout_func: 'my_agent_mod.rolout': 'my_agent_mod' has no 'rolout'. Did you mean "
                        "'rollout'?"], problems
    assert "trl.rollout_func: 'org/agent'" in config_problems({"trl": {"rollout_func": "org/agent"}})[0]
    monkeypatch.delitem(sys.modules, "my_agent_mod")
    before = list(sys.path)
    assert config_problems({"trl": {"rollout_func": "my_agent_mod.rollout"}}) == []
    assert sys.path == before  # the directory was importable for the check only ...
    assert "my_agent_mod" in sys.modules  # ... and the module stays imported for axolotl's import_module
    assert importlib.import_module("my_agent_mod").rollout.__module__ == "my_agent_mod"
    monkeypatch.delitem(sys.modules, "my_agent_mod")


def test_local_paths_are_checked_hub_ids_are_not(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.jsonl").write_text("{}\n")
    cfg = {"base_model": "Qwen/Qwen2.5-0.5B-Instruct", "grpo": {"sync": "lora_sync"},
           "datasets": [{"path": "openai/gsm8k"}, {"path": "d.jsonl"}, {"path": "json", "data_files": ["x.jsonl"]},
                        {"path": "./nowhere/train.jsonl"}]}
    problems = config_problems(cfg)
    assert problems == [
        f"datasets[2].data_files: 'x.jsonl' does not exist (relative to {tmp_path}).",
        f"datasets[3].path: './nowhere/train.jsonl' does not exist (relative to {tmp_path}).",
    ]
    cfg["base_model"] = "./models/mine"
    assert "base_model: './models/mine' does not exist" in config_problems(cfg)[0]
    assert "Fix the path, or use a Hugging Face model id" in config_problems(cfg)[0]


def test_a_missing_demo_names_the_command_that_builds_it(tmp_path, monkeypatch):
    """The agent quickstarts' model and data come from `--tool-warm-start` only; the others' from the plain build."""
    monkeypatch.chdir(tmp_path)
    tools = config_problems({"base_model": "./demo/tiny-qwen2-tools",
                             "datasets": [{"path": "./demo/data/lookup.jsonl"}]})
    assert len(tools) == 2 and all("`python -m grpo_plugin.demo --out demo --tool-warm-start`" in p for p in tools)
    plain = config_problems({"base_model": "./demo/tiny-qwen2", "datasets": [{"path": "./demo/data/digits.jsonl"}]})
    assert len(plain) == 2 and all("`python -m grpo_plugin.demo --out demo` (from" in p for p in plain), plain


def test_checkpoint_numel_reads_the_safetensors_headers(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    unique = {p.data_ptr(): p.numel() for p in model.parameters()}
    assert checkpoint_numel(tiny_model_dir) == sum(unique.values())
    assert checkpoint_numel(tiny_model_dir.parent) is None


def test_sync_dir_must_be_writable_and_hold_one_copy_for_full_weight_modes(tiny_model_dir, tmp_path,
                                                                          monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    cfg = {"base_model": str(tiny_model_dir), "grpo": {"sync": "lora_sync", "sync_dir": str(blocker / "sub")}}
    (msg,) = config_problems(cfg)
    assert "is not writable" in msg and "grpo.sync_dir" in msg

    cfg["grpo"] = {"sync": "restart", "sync_dir": str(tmp_path / "sync")}
    assert config_problems(cfg) == []  # plenty of room here
    need = checkpoint_numel(tiny_model_dir) * 4  # fp32 (no bf16/fp16 key)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(need, need - need // 2, need // 2))  # injected
    (msg,) = config_problems(cfg)
    assert f"{need / 2**20:.0f} MiB" in msg and "grpo.sync=restart writes one copy" in msg
    cfg["grpo"]["sync"] = "lora_sync"
    assert config_problems(cfg) == []  # an adapter needs megabytes: not sized


def test_every_problem_is_listed_at_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = {"base_model": "./demo/tiny-qwen2", "grpo": {"sync": "lora_sync"},
           "trl": {"reward_funcs": ["rewards.toy.digit_rewad", "rewards.gsm8k.accuracy_reward"]},
           "datasets": [{"path": "./demo/data/digits.jsonl"}]}
    problems = config_problems(cfg)
    assert len(problems) == 3, problems
    assert sum(preflight.TINY_BUILD in p for p in problems) == 2


@pytest.mark.parametrize("value, local", [("./m", True), ("../m", True), ("/abs/m", True), ("~/m", True),
                                          ("Qwen/Qwen2.5", False), ("gpt2", False)])
def test_what_counts_as_a_local_path(value, local):
    assert preflight.looks_local(value) is local
