"""ipc's shared weight file, both sides, without vLLM: export moves a model's parameters into one file and
re-points them; a second mapping (the trainer's) sees and makes the same writes; the manifest's HF map gives a
model that computes what the original did; a layout the map cannot cover is reported in the manifest."""

from __future__ import annotations

import json

import pytest
import torch

from grpo_plugin.ipc.layout import attach, views_from_layout
from grpo_plugin.ipc.shm import MANIFEST, export, map_manifest
from tests.unit.test_ipc_layout import _hf_model, meta_model, vllm_layout


class _Served(torch.nn.Module):
    """Stands in for vLLM's model: parameters in vLLM's layout (fused, padded), tied like vLLM ties them."""

    def __init__(self, tensors: dict[str, torch.Tensor], tied: bool):
        super().__init__()
        self.names = list(tensors)
        for i, t in enumerate(tensors.values()):
            self.register_parameter(f"p{i}", torch.nn.Parameter(t.clone(), requires_grad=False))
        self.tied = tied

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        for i, name in enumerate(self.names):
            yield name, getattr(self, f"p{i}")
        if self.tied:  # vLLM's tied lm_head: the embedding's parameter under a second name
            yield "lm_head.weight", getattr(self, f"p{self.names.index('model.embed_tokens.weight')}")


@pytest.mark.parametrize("tied", [True, False])
def test_export_then_attach_shares_one_copy(tmp_path, tied):
    ref = _hf_model(tied)
    layout = vllm_layout(ref)
    if tied:
        layout.pop("lm_head.weight", None)
    layout = {"model.embed_tokens.weight": layout.pop("model.embed_tokens.weight"), **layout}
    served = _Served(layout, tied)
    before = {n: p.detach().clone() for n, p in served.named_parameters()}
    manifest = export(served, tmp_path, model_name="m", hf_config=ref.config)
    assert json.loads((tmp_path / MANIFEST).read_text())["nbytes"] == manifest["nbytes"]
    assert all(e["offset"] % 64 == 0 for e in manifest["params"].values())
    if tied:
        assert manifest["params"]["lm_head.weight"]["alias_of"] == "model.embed_tokens.weight"
    for name, p in served.named_parameters():  # same values, now in the file
        assert torch.equal(p.detach(), before[name])
    model = meta_model(ref)
    attach(model, views_from_layout(manifest["hf"], map_manifest(manifest)))
    model.model.rotary_emb = type(ref.model.rotary_emb)(config=ref.config)
    ids = torch.randint(0, ref.config.vocab_size, (1, 10))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)
        model.model.layers[1].mlp.up_proj.weight.mul_(3.0)  # the trainer writes through its own mapping ...
    gate_rows = ref.config.intermediate_size
    fused = dict(served.named_parameters())["model.layers.1.mlp.gate_up_proj.weight"]
    assert torch.equal(fused[gate_rows:], model.model.layers[1].mlp.up_proj.weight)  # ... the server sees it
    assert torch.equal(fused[gate_rows:], before["model.layers.1.mlp.gate_up_proj.weight"][gate_rows:] * 3.0)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) is tied


def test_a_layout_the_map_cannot_cover_is_reported_in_the_manifest(tmp_path):
    ref = _hf_model(False)
    layout = vllm_layout(ref)
    layout["model.layers.0.mlp.gate_up_proj.weight"] = layout["model.layers.0.mlp.gate_up_proj.weight"][:-2]
    manifest = export(_Served(layout, False), tmp_path, hf_config=ref.config)
    assert "hf" not in manifest and "gate_up_proj.weight: 190 rows, expected 192" in manifest["hf_error"]


def test_a_missing_file_says_the_server_must_be_on_this_machine(tmp_path):
    manifest = {"file": str(tmp_path / "gone.bin"), "nbytes": 64, "params": {}}
    with pytest.raises(FileNotFoundError, match="same host"):
        map_manifest(manifest)
