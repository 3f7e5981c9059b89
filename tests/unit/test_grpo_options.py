"""Every GRPO option of the installed host is accounted for (grpo_plugin/config/options.py), the docs table says the
same, each refusal happens before the model loads, and the sampling options reach the vLLM server's request."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers
import trl
from axolotl.utils.schemas.trl import TRLConfig

from grpo_plugin.config.checks import check_cross_keys, trl_problems
from grpo_plugin.config.options import (
    GENERATE_FIELDS,
    INHERITED,
    LOSS_TYPES,
    NOT_AXOLOTL_KEYS_INSTEAD,
    OPTIONS,
    REFUSED,
    REFUSED_WHEN_SET,
    WORKS,
)
from grpo_plugin.producers.rollout import record_of
from grpo_plugin.server.client import VLLMServerClient
from tests.conftest import ROOT

TRL_FIELDS = ({f.name for f in dataclasses.fields(trl.GRPOConfig)}
              - {f.name for f in dataclasses.fields(transformers.TrainingArguments)})
AXOLOTL_KEYS = set(TRLConfig.model_fields)
SECTION = "## Every TRL GRPOConfig field and axolotl `trl:` key"


def test_every_grpo_option_of_the_installed_host_is_accounted_for():
    """Walks the INSTALLED TRL and axolotl (a field one stack lacks is simply not walked)."""
    missing = sorted((TRL_FIELDS | AXOLOTL_KEYS) - set(OPTIONS))
    assert not missing, (f"TRL {trl.__version__} / axolotl's trl: block have options grpo_plugin/config/options.py "
                         f"does not account for (works, inherited or refused; and a row in docs/config.md): {missing}")
    bad = {k: s for k, (s, _) in OPTIONS.items() if s not in (WORKS, INHERITED, REFUSED)}
    assert not bad, bad


def _resolve(dotted: str):
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_the_evidence_of_every_option_exists(name):
    """Each test named exists, and each code path resolves in the installed packages."""
    for ref in OPTIONS[name][1].split("; "):
        if "::" in ref:
            path, test = ref.split("::")
            assert re.search(rf"^def {test}\(", (ROOT / path).read_text(), re.M), f"{name}: no test {ref}"
        else:
            assert _resolve(ref) is not None, f"{name}: {ref}"


def _docs_rows() -> dict[str, str]:
    text = (ROOT / "docs/config.md").read_text()
    assert SECTION in text, f"docs/config.md has no section {SECTION!r}"
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in body.splitlines():
        m = re.match(r"\| `([a-z_0-9]+)` \|", line)
        if m:
            assert m.group(1) not in rows, f"docs/config.md lists {m.group(1)} twice"
            rows[m.group(1)] = line
    return rows


def test_the_docs_table_names_exactly_these_options_with_their_status_and_evidence():
    rows = _docs_rows()
    assert set(rows) == set(OPTIONS), (f"only in docs/config.md: {sorted(set(rows) - set(OPTIONS))}; only in "
                                       f"options.py: {sorted(set(OPTIONS) - set(rows))}")
    for name, line in rows.items():
        status, evidence = OPTIONS[name]
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert cells[2].startswith(f"**{status}**"), f"{name}: docs say {cells[2]!r}, options.py says {status}"
        for ref in evidence.split("; "):
            assert f"`{ref}`" in line, f"{name}: docs row does not name {ref}"
        # where the option lives: TRL's GRPOConfig and/or axolotl's trl: block, as installed
        assert ("GRPOConfig" in cells[1]) == (name in TRL_FIELDS), f"{name}: docs say it is in {cells[1]!r}"
        assert ("trl:" in cells[1]) == (name in AXOLOTL_KEYS), f"{name}: docs say it is in {cells[1]!r}"


# an "on" value for every key REFUSED_WHEN_SET refuses
ON = {
    "vllm_server_timeout": 30, "vllm_guided_decoding_regex": r"\d+", "vllm_enable_sleep_mode": True,
    "chat_template_kwargs": {"enable_thinking": False}, "vllm_sync_interval": 2,
    "streaming_min_groups": 2, "reroll_start_fraction": 0.5, "reroll_max_groups": 2,
    "entropy_coef": 0.01, "use_adaptive_entropy": True, "entropy_coef_min": 0.0, "entropy_coef_max": 1.0,
    "entropy_coef_delta": 0.005, "entropy_target": 0.2, "vllm_importance_sampling_clip_min": 0.5,
    "vllm_importance_sampling_clip_max": 2.0,
}


def _cfg(**trl_keys) -> dict:
    return {"rl": "grpo", "grpo": {}, "adapter": "lora", "trl": dict(trl_keys)}


def test_every_refused_option_is_refused_and_no_other():
    refused = {k for k, (s, _) in OPTIONS.items() if s == REFUSED}
    by_rule = (set(REFUSED_WHEN_SET) | set(NOT_AXOLOTL_KEYS_INSTEAD) | (set(OPTIONS) - AXOLOTL_KEYS)
               | {"vllm_lora_sync"})  # the last: refused by its own check (test_args.py)
    assert refused == by_rule & set(OPTIONS), (sorted(refused - by_rule), sorted(by_rule & set(OPTIONS) - refused))
    assert set(ON) == set(REFUSED_WHEN_SET), "every refusal has an 'on' value in this test"
    # a key that works or is inherited passes the check (None: the value that means "unset" for every key)
    for name in sorted(set(OPTIONS) - refused):
        assert trl_problems({name: None}) == [], name


@pytest.mark.parametrize("name", sorted(REFUSED_WHEN_SET))
def test_a_refused_axolotl_key_is_refused_when_on_and_accepted_when_off(name):
    with pytest.raises(ValueError, match=rf"trl\.{name}: .*{re.escape(REFUSED_WHEN_SET[name][1][:40])}"):
        check_cross_keys(_cfg(**{name: ON[name]}))
    for off in REFUSED_WHEN_SET[name][0]:
        check_cross_keys(_cfg(**{name: off}))


@pytest.mark.parametrize("name", sorted(TRL_FIELDS - AXOLOTL_KEYS))
def test_a_trl_field_axolotl_would_drop_is_refused_naming_it_and_what_to_use(name):
    with pytest.raises(ValueError, match=rf"trl\.{name}: not a key of axolotl's `trl:` block") as err:
        check_cross_keys(_cfg(**{name: 1}))
    if name in NOT_AXOLOTL_KEYS_INSTEAD:
        assert f"Instead: {NOT_AXOLOTL_KEYS_INSTEAD[name]}." in str(err.value)


def test_a_misspelt_trl_key_gets_the_closest_one():
    assert trl_problems({"temprature": 0.7}) == [
        "trl.temprature: not a key of axolotl's `trl:` block, which would drop it silently (TRL's default would "
        "apply). Did you mean trl.temperature?"]


def test_refusals_reach_the_user_through_axolotl_before_anything_loads(tiny_model_dir, tiny_data_file, tmp_path):
    import yaml
    from pydantic import ValidationError

    from tests.conftest import axolotl_load_cfg

    def load(config: dict, where: Path):
        (where / "cfg.yaml").write_text(yaml.safe_dump(config))
        return axolotl_load_cfg(where / "cfg.yaml")

    cfg = {"base_model": str(tiny_model_dir), "plugins": ["grpo_plugin.GRPOPlugin"], "rl": "grpo",
           "grpo": {"sync": "lora_sync"}, "adapter": "lora", "lora_r": 8, "lora_alpha": 16,
           "lora_target_modules": ["q_proj"], "datasets": [{"path": str(tiny_data_file), "ds_type": "json",
                                                            "split": "train"}],
           "trl": {"num_generations": 4, "max_completion_length": 8, "reward_funcs": ["rewards.toy.digit_reward"],
                   "generation_kwargs": {"stop_token_ids": [3]}},
           "micro_batch_size": 4, "max_steps": 1, "learning_rate": 1e-3, "sequence_len": 64,
           "output_dir": str(tmp_path / "out")}
    assert load(copy.deepcopy(cfg), tmp_path).trl.generation_kwargs == {"stop_token_ids": [3]}
    cfg["trl"].update(delta=2.0, entropy_coef=0.01)
    with pytest.raises(ValidationError) as err:
        load(cfg, tmp_path)
    assert "trl.delta: not a key of axolotl's `trl:` block" in str(err.value)
    assert "trl.entropy_coef: 0.01: axolotl's GRPO loss" in str(err.value)


def test_colocate_is_refused_pointing_one_gpu_users_at_ipc():
    with pytest.raises(ValueError, match="trl.vllm_mode: 'colocate'") as err:
        check_cross_keys(_cfg(vllm_mode="colocate"))
    assert "`grpo.sync: ipc` is the plugin's colocated mode" in str(err.value)
    assert "docs/modes.md#ipc-on-cuda" in str(err.value)
    check_cross_keys(_cfg(vllm_mode="server"))


def test_a_loss_axolotl_does_not_implement_is_refused():
    for loss in LOSS_TYPES:
        check_cross_keys(_cfg(loss_type=loss))
    with pytest.raises(ValueError, match=r"trl.loss_type: 'vespo' is not a loss axolotl's GRPO loss implements"):
        check_cross_keys(_cfg(loss_type="vespo"))


def _source(dotted: str) -> str:
    return inspect.getsource(_resolve(dotted))


_AX = "axolotl.core.trainers.grpo."


def test_the_host_gaps_behind_the_refusals_are_still_there():
    """Each refusal rests on a fact of the installed axolotl; when an upgrade removes one, lift its refusal."""
    from axolotl.core.trainers.grpo import GRPOStrategy
    from axolotl.utils.dict import DictDefault

    loss = _source(_AX + "async_trainer.AsyncGRPOTrainer._compute_loss")
    assert all(f'"{name}"' in loss for name in LOSS_TYPES) and '"vespo"' not in loss
    assert "entropy_coef" not in loss  # no entropy bonus
    assert "clip_m" not in _source(_AX + "async_trainer.AsyncGRPOTrainer._compute_deferred_scores")
    # trl.chat_template_kwargs / generation_kwargs are not passed on to TRL's args
    args = GRPOStrategy.set_training_args_kwargs(DictDefault(
        trl=TRLConfig(chat_template_kwargs={"a": 1}, generation_kwargs={"b": 2}), vllm=None, context_parallel_size=1))
    assert "chat_template_kwargs" not in args and "generation_kwargs" not in args and "num_generations" not in args
    # nothing calls the re-roll hook (a "def" aside)
    grpo_dir = Path(importlib.import_module("axolotl.core.trainers.grpo").__file__).parent
    calls = [p.name for p in grpo_dir.glob("*.py") if re.search(r"[^f] _pre_produce_hook\(|\._pre_produce_hook\(",
                                                                   p.read_text())]
    assert calls == [], calls
    # axolotl's streaming scorer does not go through the plugin's scoring hook: the trainer keeps it off, streams itself
    assert "_compute_deferred_scores" not in _source(_AX + "async_trainer.AsyncGRPOTrainer._score_streaming")


# ---- the sampling options reach the server ----------------------------------------------------------------------

class _Tok:
    def batch_decode(self, ids, skip_special_tokens=True):
        return ["t" * len(x) for x in ids]


def _produce(monkeypatch, *, loaded_trl: dict, args_kwargs=None, **sampling):
    """One rollout through the real LocalRolloutProducer and VLLMServerClient; returns the request body sent."""
    from axolotl.core.trainers.grpo.async_trainer import ProducerConfig

    from grpo_plugin.config.views import TRLView
    from grpo_plugin.producers.local import LocalRolloutProducer, generation_kwargs, sampling_kwargs
    from grpo_plugin.producers.spec import GenerationSpec
    from grpo_plugin.sync.gate import PolicyGate

    sent = []

    def post(path, payload, timeout=None):
        sent.append((path, payload))
        choices = [{"index": i, "finish_reason": "stop",
                    "logprobs": {"tokens": ["token_id:5", "token_id:9"], "token_logprobs": [-0.5, -0.25]}}
                   for i in range(len(payload["prompt"]) * payload["n"])]
        return SimpleNamespace(json=lambda: {"choices": choices}, text="")

    client = VLLMServerClient("http://127.0.0.1:9")
    monkeypatch.setattr(client, "_post", post)
    gate = PolicyGate()
    gate.publish(0, "policy-v0")
    # what the trainer hands its producer (trainer.py `_create_data_producer`), from TRL's attributes
    trainer = SimpleNamespace(**sampling)
    spec = GenerationSpec(
        client=client, gate=gate, guard=SimpleNamespace(run=lambda what, fn, **kw: fn()), tokenizer=_Tok(),
        pad_token_id=0, num_generations=sampling["num_generations"], temperature=sampling["temperature"],
        sampling=sampling_kwargs(trainer, generation_kwargs(SimpleNamespace(generation_kwargs=args_kwargs),
                                                           TRLView.of(loaded_trl))),
        tokenize_prompts=lambda prompts: ([[1, 2, len(p)] for p in prompts], None, {}), stop_token_ids=(0, 9),
        mask_truncated=True, shuffle_dataset=False, scale_rewards="group", vocab_size=16, device="cpu",
        num_processes=1, gather=None, gather_object=None, step=lambda: 0, synced_version=lambda: 0,
        add_callback=None)
    producer = LocalRolloutProducer(
        config=ProducerConfig(), prompt_dataset=[], num_generations=sampling["num_generations"],
        generation_batch_size=4, train_batch_size=4, steps_per_generation=1, shuffle_dataset=False, seed=0,
        spec=spec, max_policy_lag=1, lag_timeout=5.0)
    producer._prompt_dl = [[{"prompt": "ab"}] * 2 + [{"prompt": "abc"}] * 2]
    producer._prompt_iter = iter(producer._prompt_dl)
    rollout = producer.produce(None, 0)._data
    assert record_of(rollout).policy_version == 0
    assert rollout["completion_ids"].tolist() == [[5, 9]] * 4 and rollout["completion_mask"].sum() == 8
    assert torch.allclose(rollout["sampling_per_token_logps"], torch.tensor([[-0.5, -0.25]] * 4))
    assert [path for path, _ in sent] == ["/v1/completions"]
    return sent[0][1]


@pytest.mark.parametrize(("sampling", "generation_kwargs"), [
    ({"num_generations": 2, "max_completion_length": 7, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "min_p": 0.05,
      "repetition_penalty": 1.3}, {"stop_token_ids": [9], "presence_penalty": 0.5}),
    ({"num_generations": 4, "max_completion_length": 3, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": None,
      "repetition_penalty": 1.0}, None),
])
def test_every_sampling_option_reaches_the_server_request(monkeypatch, sampling, generation_kwargs):
    body = _produce(monkeypatch, loaded_trl={"generation_kwargs": generation_kwargs}, **sampling)
    g = sampling["num_generations"]
    assert body["model"] == "policy-v0"
    assert body["prompt"] == [[1, 2, 2], [1, 2, 3]][: 4 // g] and body["n"] == g
    assert body["max_tokens"] == sampling["max_completion_length"]
    for key in ("temperature", "top_p", "repetition_penalty"):
        assert body[key] == sampling[key], key
    # TRL's "off" values (top_k 0, min_p None) are not sent: vLLM's defaults are off too
    assert body.get("top_k") == (sampling["top_k"] or None)
    assert body.get("min_p") == sampling["min_p"]
    for key, value in (generation_kwargs or {}).items():
        assert body[key] == value, key
    assert set(body) - set(GENERATE_FIELDS) == set(generation_kwargs or {})


def test_generation_kwargs_in_the_trainer_args_win_over_the_loaded_config(monkeypatch):
    sampling = {"num_generations": 2, "max_completion_length": 4, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
                "min_p": None, "repetition_penalty": 1.0}
    body = _produce(monkeypatch, loaded_trl={"generation_kwargs": {"min_tokens": 1}},
                    args_kwargs={"min_tokens": 2}, **sampling)
    assert body["min_tokens"] == 2


def test_generation_kwargs_may_not_set_what_the_plugin_sets():
    client = VLLMServerClient("http://127.0.0.1:9")
    for field in GENERATE_FIELDS:  # the request builder refuses each, whatever config checks let through
        with pytest.raises(ValueError, match=field):
            client.generate([[1, 2]], model="m", n=1, max_tokens=2, extra={field: 1})
    with pytest.raises(ValueError) as err:
        check_cross_keys(_cfg(generation_kwargs={"temperature": 0.1, "n": 3, "stop": ["\n"]}))
    msg = str(err.value)
    assert "trl.generation_kwargs.temperature: the plugin sets `temperature` in every generation request itself " \
           "(use trl.temperature; the trainer scores at it too)" in msg
    assert "trl.generation_kwargs.n:" in msg and "use trl.num_generations" in msg and ".stop" not in msg
    check_cross_keys(_cfg(generation_kwargs={"stop": ["\n"], "min_tokens": 2}))
    client = VLLMServerClient("http://127.0.0.1:9")
    with pytest.raises(ValueError, match=r"may not set \['logprobs'\]"):
        client.generate([[1]], model="m", n=1, max_tokens=1, extra={"logprobs": 5})
