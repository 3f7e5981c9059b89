"""ipc (work in progress): a real vLLM-CPU server with the export plugin shares ONE copy of the weights with a
trainer model attached to it; in-place optimizer steps are what the server computes with next."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from grpo_plugin import probe
from grpo_plugin.ipc.layout import attach, hf_views
from grpo_plugin.ipc.vllm_plugin import ENV, MANIFEST, attach_tensors
from grpo_plugin.server import ServerSpec, VLLMServerProcess
from tests.conftest import ROOT, free_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ipc_server(tiny_model_dir, cache_env, tmp_path_factory, monkeypatch_module):
    from grpo_plugin.client import VLLMServerClient

    # The entry point, as an installed dist-info would declare it (the branch is not installed as a package).
    plug = tmp_path_factory.mktemp("plugin") / "grpo_plugin_ipc-0.0.dist-info"
    plug.mkdir()
    (plug / "METADATA").write_text("Metadata-Version: 2.1\nName: grpo-plugin-ipc\nVersion: 0.0\n")
    (plug / "entry_points.txt").write_text("[vllm.general_plugins]\ngrpo_ipc = grpo_plugin.ipc.vllm_plugin:register\n")
    export = Path("/dev/shm") / f"grpo_plugin-ipc-{os.getpid()}-test"
    monkeypatch_module.setenv(ENV, str(export))
    monkeypatch_module.setenv("PYTHONPATH", f"{ROOT / 'src'}:{plug.parent}")
    spec = ServerSpec(model=str(tiny_model_dir), port=free_port(), dtype="float32", max_model_len=512,
                      enforce_eager=True, enable_lora=False)
    server = VLLMServerProcess(spec, log_path=tmp_path_factory.mktemp("logs") / "ipc.log")
    server.start()
    client = VLLMServerClient(spec.base_url, timeout=120)
    try:
        server.wait_healthy(300, client.healthy)
        yield client, export, str(tiny_model_dir)
    finally:
        server.stop()
        for f in export.glob("*"):
            f.unlink()
        export.rmdir()


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_trainer_steps_in_place_and_the_server_computes_with_them(ipc_server):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    client, export, model_dir = ipc_server
    manifest, tensors = attach_tensors(export / MANIFEST)
    assert Path(manifest["file"]).stat().st_size >= manifest["nbytes"] > 0
    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    attach(model, hf_views(config, tensors))
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = AutoTokenizer.from_pretrained(model_dir)("ipc probe 0123456789 qwerty", add_special_tokens=False)[
        "input_ids"]
    model.eval()
    assert probe.logprob_diff(probe.token_logprobs(model, ids), probe.token_logprobs(ref, ids))[1] == 0.0
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = client.prompt_logprobs(ids, model=model_dir)
    for _ in range(3):
        model.train()
        model(torch.tensor([ids]), labels=torch.tensor([ids])).loss.backward()
        opt.step()  # the sync: no copy, no RPC
        opt.zero_grad()
        client.reset_prefix_cache()
        model.eval()
        served = client.prompt_logprobs(ids, model=model_dir)
        mean, mx = probe.logprob_diff(served, probe.token_logprobs(model, ids))
        assert mean <= 1e-5 and mx <= 1e-4, (mean, mx)
        assert probe.logprob_diff(served, before)[0] > 1e-3
        before = served
