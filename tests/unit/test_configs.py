"""Every shipped config loads and validates through axolotl; DeepSpeed configs parse; docs name every recipe.

No GPU and no model hub here: `base_model` is replaced by the local tiny model (the only key changed), and
DeepSpeed's process-group start-up is skipped as in `axolotl preprocess` (AXOLOTL_IS_PREPROCESS=1), because
it needs NCCL. Everything else is validated as written, from a checkout after the documented setup steps (the
plugin's validation checks that the data files the configs name exist): `data/gsm8k/train.jsonl` (docs/gpu.md)
and `demo/data/digits.jsonl` (`python -m grpo_plugin.demo --out demo`).
"""

from __future__ import annotations

import gzip
import json
import re
import shutil

import pytest
import yaml
from pydantic import ValidationError

from tests.conftest import ROOT, axolotl_load_cfg

CONFIGS = sorted((ROOT / "configs").rglob("*.yaml"))
RECIPES = sorted((ROOT / "configs" / "gsm8k").glob("*.yaml"))
CODE_RECIPES = sorted(p for p in (ROOT / "configs" / "code").glob("*.yaml") if not p.stem.startswith("agent_"))
CODE_AGENT_RECIPES = sorted((ROOT / "configs" / "code").glob("agent_*.yaml"))
DS_CONFIGS = sorted((ROOT / "deepspeed_configs").glob("*.json"))
SCALE = sorted((ROOT / "configs" / "scale").glob("*.yaml"))


def user_checkout(root, tiny_data_file=None):
    """The repo as a user has it: every entry linked; with tiny_data_file, the setup's data files in place."""
    root.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in ("demo", "data", "outputs", ".git") and not entry.name.startswith(".venv"):
            (root / entry.name).symlink_to(entry)
    if tiny_data_file is not None:
        (root / "data" / "gsm8k").mkdir(parents=True)
        with gzip.open(ROOT / "tests" / "data" / "gsm8k" / "train.jsonl.gz", "rt") as src:
            (root / "data" / "gsm8k" / "train.jsonl").write_text("".join(next(src) for _ in range(8)))
        (root / "data" / "code").mkdir(parents=True)
        (root / "data" / "code" / "train.jsonl").write_text(
            '{"instruction": "Write add(a, b).", "response": "def add(a, b):\\n    return a + b", '
            '"test_cases": ["assert add(1, 2) == 3"]}\n')
        (root / "demo" / "data").mkdir(parents=True)
        shutil.copy(tiny_data_file, root / "demo" / "data" / "digits.jsonl")
        from grpo_plugin.demo.tools import build_code_agent_task, build_tool_task

        build_tool_task(root / "demo" / "data" / "lookup.jsonl", n=8)
        build_code_agent_task(root / "demo" / "data" / "code_agent.jsonl", n=8)
    return root


@pytest.fixture
def load(tiny_model_dir, tiny_data_file, tmp_path, monkeypatch):
    monkeypatch.setenv("AXOLOTL_IS_PREPROCESS", "1")
    # configs use repo-relative paths (deepspeed_configs/, ./data, ./demo)
    monkeypatch.chdir(user_checkout(tmp_path / "checkout", tiny_data_file))

    def _load(cfg: dict):
        path = tmp_path / "cfg.yaml"
        path.write_text(yaml.safe_dump(dict(cfg, base_model=str(tiny_model_dir))))
        return axolotl_load_cfg(path)

    return _load


def test_the_expected_recipes_exist():
    names = {p.stem for p in RECIPES}
    for model in ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "llama-3.2-3b"):
        assert any(n.startswith(model) for n in names), model
    for mode in ("lora_sync", "restart"):
        for layout in ("1gpu", "2gpu", "8gpu"):
            assert any(f"-{mode}-{layout}" in n for n in names), (mode, layout)
    assert "qwen2.5-7b-qlora-1gpu" in names  # QLoRA: a 7B policy beside vLLM on one GPU


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT / "configs")))
def test_config_validates_through_axolotl(path, load):
    raw = yaml.safe_load(path.read_text())
    cfg = load(raw)
    assert cfg.rl == "grpo" and "grpo_plugin.GRPOPlugin" in cfg.plugins
    assert cfg.trainer_cls == "grpo_plugin.trainer.GRPOPluginTrainer"
    sync = cfg.grpo["sync"]
    assert sync in ("lora_sync", "restart", "ipc")
    assert (cfg.adapter in ("lora", "qlora")) is (sync == "lora_sync")
    assert (cfg.adapter == "qlora") is bool(cfg.load_in_4bit)
    # TRL: the generation batch (micro batch x steps x ranks) must hold whole groups, for any number of ranks
    assert cfg.micro_batch_size % cfg.trl.num_generations == 0
    if raw.get("deepspeed"):
        ds = ROOT / raw["deepspeed"]
        assert ds.exists() and ds.parent.name == "deepspeed_configs"
        stage = cfg.deepspeed["zero_optimization"]["stage"]
        assert stage in (1, 2, 3)
        assert stage != 3 or sync in ("lora_sync", "restart")  # ZeRO-3: each push gathers; ipc has no full copy


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_rewards_and_transform_resolve_as_axolotl_does(path):
    from axolotl.core.trainers.grpo import GRPOStrategy
    from axolotl.prompt_strategies.dpo import load as load_dpo

    raw = yaml.safe_load(path.read_text())
    for fqn in raw["trl"]["reward_funcs"]:
        fn = GRPOStrategy.get_reward_func(fqn)
        assert fn(completions=["... #### 4"], answer=["4"], prompts=["p"]) in ([1.0], [0.5])
    assert len(raw["trl"]["reward_weights"]) == len(raw["trl"]["reward_funcs"])
    transform, kwargs = load_dpo(raw["datasets"][0]["type"], {"datasets": raw["datasets"]}, dataset_idx=0)
    out = transform({"question": "2+2?", "answer": "2+2=4\n#### 4"})
    assert out["answer"] == "4" and out["prompt"][-1]["content"] == "2+2?"


def test_the_code_recipes_cover_the_guides_topologies():
    assert {p.stem.rsplit("-", 1)[1] for p in CODE_RECIPES} == {"1gpu", "2gpu", "4gpu"}


@pytest.mark.parametrize("path", CODE_RECIPES, ids=lambda p: p.stem)
def test_code_recipe_rewards_and_transform_resolve_as_axolotl_does(path):
    from axolotl.core.trainers.grpo import GRPOStrategy
    from axolotl.prompt_strategies.dpo import load as load_dpo

    raw = yaml.safe_load(path.read_text())
    assert len(raw["trl"]["reward_weights"]) == len(raw["trl"]["reward_funcs"])
    transform, kwargs = load_dpo(raw["datasets"][0]["type"], {"datasets": raw["datasets"]}, dataset_idx=0)
    row = transform({"instruction": "Write add(a, b).", "response": "def add(a, b): return a + b",
                     "test_cases": ["assert add(1, 2) == 3", "assert add(2, 2) == 5"]})
    assert row["prompt"][-1]["content"] == "Write add(a, b)." and "instruction" in kwargs["remove_columns"]
    good, bad = "```python\ndef add(a, b):\n    return a + b\n```", "```python\ndef add(a, b):\n    return a -\n```"
    scores = {fqn.rsplit(".", 1)[1]: GRPOStrategy.get_reward_func(fqn)(
        completions=[good, bad], test_cases=[row["test_cases"]] * 2, prompts=["p", "p"])
        for fqn in raw["trl"]["reward_funcs"]}
    assert scores == {"code_execution_reward": [0.5, 0.0], "soft_format_reward": [1.0, 0.0]}


@pytest.mark.parametrize("path", CODE_AGENT_RECIPES, ids=lambda p: p.stem)
def test_code_agent_recipe_environment_and_transform_resolve(path):
    from axolotl.prompt_strategies.dpo import load as load_dpo

    from grpo_plugin.config.preflight import agent_problems

    raw = yaml.safe_load(path.read_text())
    assert raw["grpo"]["environment_factory"] == "rewards.code_agent.CodeAgent"
    assert agent_problems(raw["grpo"]) == [None]
    assert len(raw["trl"]["reward_weights"]) == len(raw["trl"]["reward_funcs"])
    transform, kwargs = load_dpo(raw["datasets"][0]["type"], {"datasets": raw["datasets"]}, dataset_idx=0)
    row = transform({"instruction": "Write add(a, b).", "response": "def add(a, b): return a + b",
                     "test_cases": ["assert add(1, 2) == 3", "assert add(2, 2) == 5"]})
    assert json.loads(row["visible_tests"]) == ["assert add(1, 2) == 3"]
    assert json.loads(row["hidden_tests"]) == ["assert add(2, 2) == 5"]
    assert "assert add(2, 2) == 5" not in json.dumps(row["prompt"]) and kwargs["remove_columns"] == "__all__"


@pytest.mark.parametrize("path", DS_CONFIGS, ids=lambda p: p.name)
def test_deepspeed_config_parses(path):
    from transformers.integrations.deepspeed import HfDeepSpeedConfig

    conf = json.loads(path.read_text())
    zero = conf["zero_optimization"]
    stage = int(path.name[len("zero")])
    assert zero["stage"] == stage
    assert ("cpuoffload" in path.name) is ("offload_optimizer" in zero)
    if "bf16" in path.name:
        assert conf["bf16"]["enabled"] is True and conf["fp16"]["enabled"] is False
    ds = HfDeepSpeedConfig(conf)  # what transformers builds from it
    assert ds.is_zero3() is (stage == 3)
    assert ds.is_offload() is ("cpuoffload" in path.name)


@pytest.mark.parametrize("path", [p for p in DS_CONFIGS if p.name.startswith("zero3")], ids=lambda p: p.name)
def test_zero3_runs_lora_sync_and_restart_and_refuses_ipc_saying_why(path, load):
    """Under ZeRO-3 every push gathers the weights (sync/ranks.py); ipc has no full copy to share."""
    raw = yaml.safe_load((ROOT / "configs/gsm8k/qwen2.5-7b-lora_sync-8gpu.yaml").read_text())
    raw["deepspeed"] = str(path.relative_to(ROOT))
    assert load(raw).grpo.sync == "lora_sync"
    raw = yaml.safe_load((ROOT / "configs/gsm8k/qwen2.5-1.5b-restart-2gpu.yaml").read_text())
    raw["deepspeed"] = str(path.relative_to(ROOT))
    assert load(raw).grpo.sync == "restart"
    raw = yaml.safe_load((ROOT / "configs/quickstart_ipc.yaml").read_text())
    raw["deepspeed"] = str(path.relative_to(ROOT))
    with pytest.raises(ValidationError, match=r"ipc needs the trainer's parameters .* for ZeRO-3 use restart"):
        load(raw)


def test_fsdp2_validates_and_fsdp1_and_quantized_bases_are_refused(load):
    raw = yaml.safe_load((ROOT / "configs/gsm8k/qwen2.5-1.5b-restart-2gpu.yaml").read_text())
    raw["fsdp_version"] = 2
    raw["fsdp_config"] = {"reshard_after_forward": True}
    assert load(raw).grpo.sync == "restart"  # FSDP2: each push gathers torch's full state dict (sync/ranks.py)
    raw4 = yaml.safe_load((ROOT / "configs/gsm8k/qwen2.5-7b-qlora-1gpu.yaml").read_text())
    raw4["fsdp_version"] = 2
    raw4["fsdp_config"] = {"reshard_after_forward": True}
    with pytest.raises(ValidationError, match=r"a quantized base .* with FSDP: not supported"):
        load(raw4)


def test_fsdp1_is_refused_by_the_plugin():
    from grpo_plugin.config.checks import check_cross_keys

    with pytest.raises(ValueError, match=r"FSDP version 1 \(the default\): the grpo_plugin gathers FSDP2"):
        check_cross_keys({"rl": "grpo", "grpo": {"sync": "restart"}, "fsdp_config": {"reshard_after_forward": True}})


def _named_with_their_commands(doc: str, path) -> None:
    """`doc` names the config, and the commands at the top of the config (axolotl's, or the Atropos launcher) name the
    config itself."""
    rel = str(path.relative_to(ROOT))
    assert rel in (ROOT / "docs" / doc).read_text(), f"docs/{doc} does not mention {rel}"
    header = path.read_text().split("\nbase_model:")[0]
    commands = re.findall(r"(?:axolotl (?:train|vllm-serve)|grpo_plugin\.atropos\.launch) (\S+)", header)
    assert commands and all(c == rel for c in commands), (rel, commands)


def test_docs_name_every_recipe_and_its_launch_commands():
    for path in RECIPES:
        _named_with_their_commands("gpu.md", path)
        header = path.read_text().split("\nbase_model:")[0]
        layout = path.stem.rsplit("-", 1)[1]
        if layout == "1gpu":
            assert "managed_server: true" in path.read_text()
        else:
            assert "CUDA_VISIBLE_DEVICES" in header


def test_scaling_docs_name_every_scale_config_and_the_configs_say_their_commands():
    assert SCALE
    for path in SCALE:
        _named_with_their_commands("scaling.md", path)
        raw = yaml.safe_load(path.read_text())
        header = path.read_text().split("\nbase_model:")[0]
        assert raw["grpo"].get("num_servers", 1) > 1 or "--num_processes 2" in header, path.name


def test_a_config_whose_files_are_missing_fails_before_loading_naming_each(tiny_model_dir, tmp_path, monkeypatch):
    """A bare checkout (setup not done): validation names every missing file and the command that makes it."""
    monkeypatch.setenv("AXOLOTL_IS_PREPROCESS", "1")
    monkeypatch.chdir(user_checkout(tmp_path / "bare"))
    raw = yaml.safe_load((ROOT / "configs" / "quickstart_lora_sync.yaml").read_text())
    raw["trl"]["reward_funcs"] = ["rewards.toy.digit_rewad", "rewards.gsm8k.accuracy_reward"]
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw))  # base_model ./demo/tiny-qwen2 as shipped: not built yet
    with pytest.raises(ValidationError) as err:
        axolotl_load_cfg(path)
    msg = str(err.value)
    assert "found 3 problem(s)" in msg, msg
    assert "'rewards.toy' has no 'digit_rewad'. Did you mean 'digit_reward'?" in msg
    assert "base_model: './demo/tiny-qwen2' does not exist" in msg
    assert "datasets[0].path: './demo/data/digits.jsonl' does not exist" in msg
    assert msg.count("python -m grpo_plugin.demo --out demo") == 2


def test_the_mode_list_and_default_are_one_table():
    """The schema's modes and default come from the modes' table (config/modes.py), and the registry that builds a
    mode is keyed by its objects: a mode added to one and not the other fails here."""
    from typing import get_args

    from grpo_plugin.config.modes import DEFAULT_SYNC, MODES, SYNC_MODES
    from grpo_plugin.config.schema import GRPOSettings
    from grpo_plugin.sync import BUILDERS

    assert set(BUILDERS) == set(MODES.values()) and all(MODES[name].name == name for name in SYNC_MODES)
    assert set(get_args(GRPOSettings.model_fields["sync"].annotation)) == set(SYNC_MODES)
    assert DEFAULT_SYNC in SYNC_MODES and GRPOSettings().sync == DEFAULT_SYNC


def test_a_mode_name_is_compared_only_in_the_modes_table_and_sync():
    """Schema, preflight and the server's spec ask the mode object (config/modes.py) instead of comparing its name:
    outside sync/, config/modes.py and the benchmarks, no code compares `grpo.sync` with a mode's name."""
    names = r"""["'](?:ipc|lora_sync|restart)["']"""
    compared = re.compile(rf"""[=!]=\s*{names}|{names}\s*[=!]=|\bin\s*\([^)]*{names}""")
    found = []
    for path in sorted((ROOT / "src" / "grpo_plugin").rglob("*.py")):
        rel = path.relative_to(ROOT / "src" / "grpo_plugin").as_posix()
        if rel.startswith(("sync/", "bench/")) or rel == "config/modes.py":
            continue
        found += [f"{rel}:{n}" for n, line in enumerate(path.read_text().splitlines(), 1) if compared.search(line)]
    assert not found, found


def test_the_config_is_read_through_its_views_only():
    """Outside config/ (and the benchmarks, which write configs), code reads the config through the views
    config.lookups.run_config builds (`grpo:` validated, `vllm:` and `trl:` typed), never its blocks as raw dicts,
    and never axolotl's loaded config itself."""
    raw = re.compile(r"""\.get\(\s*["'](grpo|vllm|trl)["']\s*\)|\[\s*["'](grpo|vllm|trl)["']\s*\]|loaded_cfg\(""")
    found = []
    for path in sorted((ROOT / "src" / "grpo_plugin").rglob("*.py")):
        rel = path.relative_to(ROOT / "src" / "grpo_plugin").as_posix()
        if rel.startswith(("config/", "bench/")):
            continue
        found += [f"{rel}:{n}" for n, line in enumerate(path.read_text().splitlines(), 1) if raw.search(line)]
    assert not found, found


def test_the_config_is_validated_once_per_process_and_read_again_when_it_changed(monkeypatch):
    """The plugin's hooks, the trainer and a reward function named by path each resolve the run's config
    (config.lookups.run_config); the `grpo:` block is validated once for them all, and again only when what the
    views read changed (a key, or the trainer ranks the schema's defaults depend on)."""
    from grpo_plugin.config import lookups
    from grpo_plugin.server.process import specs_from

    monkeypatch.setattr(lookups, "_last", None)  # whatever an earlier test read
    validated = []
    settings_of = lookups.settings_of
    monkeypatch.setattr(lookups, "settings_of", lambda cfg: validated.append(1) or settings_of(cfg))
    cfg = {"base_model": "m", "grpo": {"sync": "ipc", "num_servers": 3}, "vllm": {"port": 8100}}
    first = lookups.run_config(cfg)
    assert len(specs_from(first)) == 3 and lookups.run_config(cfg) is first and len(validated) == 1
    assert (first.vllm.port, first.vllm.host, first.base_model, first.lora_r) == (8100, None, "m", 16)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert lookups.run_config(cfg).grpo.ipc_fence == "server" and len(validated) == 2
    cfg["vllm"]["port"] = 8200
    assert lookups.run_config(cfg).vllm.port == 8200 and len(validated) == 3
