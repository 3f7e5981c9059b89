"""TRL's server-mode vLLM client is not built.

It would create an NCCL communicator, which asserts on CPU (`torch.cuda.current_device()`) and silently broadcasts
nothing with PyNccl disabled. The plugin talks to the stock vLLM server through its own client (server/client.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from trl.generation.vllm_generation import VLLMGeneration


@contextmanager
def without_trl_server_client() -> Iterator[None]:
    """Keep TRL from building its server client (and NCCL communicator) while the trainer is constructed."""
    orig = VLLMGeneration._init_vllm

    def _init_vllm(self_vllm):
        if self_vllm.mode == "server":
            self_vllm.vllm_client = None  # grpo_plugin's own client does generation and sync
            return
        orig(self_vllm)

    VLLMGeneration._init_vllm = _init_vllm
    try:
        yield
    finally:
        VLLMGeneration._init_vllm = orig
