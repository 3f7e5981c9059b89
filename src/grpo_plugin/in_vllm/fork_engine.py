"""vLLM general plugin (entry point `grpo_plugin_fork_engine`, pyproject.toml): on vLLM-CPU, the server's engine
process is forked from the API server instead of spawned.

Why: vLLM's OpenAI server always runs its engine in a second process, and vLLM-CPU sets the start method to
`spawn` for every server (platforms/cpu.py: `VLLM_WORKER_MULTIPROC_METHOD=spawn`, no condition). A spawned engine
is a fresh Python that imports torch, transformers and vLLM again before it reads a weight: measured ~9 s of the
~23 s a tiny model's server takes to answer /health on 2 cores (14 s forked). Every managed start, restart and
recovery pays it.

When: only with `GRPO_VLLM_FORK_ENGINE=1` in the server's environment (server/process.py sets it for a CPU server
whose engine runs in one process: one rank, no tensor, pipeline or data parallelism), and only if the config
vLLM built says the same. Why forking is sound there: the API server has started no OpenMP threads when the
engine starts (it has run no model; the engine binds and starts its own threads after the fork), there is no
CUDA context to inherit, and vLLM itself forks this same engine process on every platform that does not force
spawn (its `_configure_uniproc_startup_threads` reads "fork inherits Torch's setting"). Run by every server of
the test suite. `GRPO_VLLM_FORK_ENGINE=0` keeps vLLM's spawn.
"""

from __future__ import annotations

import os

from grpo_plugin.config.server import FORK_ENGINE_ENV as ENV  # the launcher sets it (server/process.py)

ENTRY_POINT = "grpo_plugin_fork_engine"  # its name in pyproject.toml (for VLLM_PLUGINS allow-lists)


def one_process_engine(vllm_config) -> bool:
    """The engine is one process: one rank, nothing parallel."""
    p = vllm_config.parallel_config
    return (p.tensor_parallel_size == 1 and p.pipeline_parallel_size == 1 and p.data_parallel_size == 1
            and p.distributed_executor_backend in ("uni", None))


def register() -> None:
    if os.environ.get(ENV) != "1":
        return
    from vllm.platforms import current_platform  # here: vLLM loads this module in every process; inert unless asked

    if not current_platform.is_cpu():
        return
    platform = type(current_platform)
    if getattr(platform, "_grpo_fork_engine", False):
        return
    platform._grpo_fork_engine = True
    check = platform.check_and_update_config.__func__

    def check_and_update_config(cls, vllm_config) -> None:
        check(cls, vllm_config)  # sets VLLM_WORKER_MULTIPROC_METHOD=spawn, among the rest
        if one_process_engine(vllm_config):
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
            if not os.environ.get("_GRPO_FORK_ENGINE_SAID"):
                os.environ["_GRPO_FORK_ENGINE_SAID"] = "1"
                print("[grpo_plugin] vLLM-CPU: the engine process is forked from the API server, not spawned "
                      f"({ENV}=1)", flush=True)

    platform.check_and_update_config = classmethod(check_and_update_config)
