"""Several trainer ranks on a machine without CUDA.

axolotl (0.19 and 0.21) asks torch, as soon as WORLD_SIZE > 1, whether CUDA devices can reach each other
(`check_cuda_p2p_support`, called from `prepare_optim_env` while the config loads). Without an NVIDIA driver
`torch.cuda.can_device_access_peer` raises RuntimeError("Found no NVIDIA driver"), which axolotl does not catch
(it catches AssertionError only): no run with two or more ranks can start on a CPU machine (measured: both ranks
of `--multi_gpu --num_processes 2` die there). Without CUDA there is no peer-to-peer question to answer, so on
such a machine the check answers what axolotl answers for one rank: True (leave NCCL's P2P setting alone — NCCL
is not used on CPU anyway: torch picks gloo). On a CUDA machine nothing is changed.

The second: with WORLD_SIZE > 1 axolotl's `normalize_config` sets `device_map: {"": LOCAL_RANK}` whatever
device it found — an integer, which transformers reads as a CUDA device, so the model load fails the same way
(measured next, once the first was past). axolotl's model loader copies the device map before any plugin hook
runs, so the correction follows `normalize_config` itself (the config loader's reference to it is wrapped): the
model loads on the CPU the config resolved (`cfg.device == "cpu"`).

The third: accelerate decides a run is distributed by its CUDA devices; without them every rank of
`--multi_gpu --num_processes 2` (or torchrun) runs as DistributedType.NO, each believing it is alone (measured:
process_index 0 and num_processes 1 in both ranks — both pushed the same adapter version). accelerate's own
switch for CPU ranks, ACCELERATE_USE_CPU, makes them one MULTI_CPU (gloo) run; it is set when WORLD_SIZE > 1.

The fourth, for DeepSpeed: with ACCELERATE_USE_CPU accelerate silently drops DeepSpeed (measured: the ranks ran
as plain DDP), and without it accelerate picks NO backend for a rank without CUDA while DeepSpeed starts its own
(its CPU accelerator, gloo): the trainer then computed its batch for one process and DeepSpeed's batch check failed
(`train_batch_size 16 != 16 * 1 * 2`). With a `deepspeed:` config the plugin leaves ACCELERATE_USE_CPU unset, sets
DS_ACCELERATOR=cpu, and makes accelerate's backend choice answer gloo (MULTI_CPU) where it found none: accelerate
then counts the ranks DeepSpeed counts and turns the run into DEEPSPEED on `cpu` (measured: ZeRO-2 and ZeRO-3).

The fifth and sixth, for FSDP2: axolotl builds its device mesh for "cuda" (both ranks died in torch.cuda.set_device)
— without CUDA it is built for "cpu"; and accelerate selects FSDP only for GPU-type ranks, so a MULTI_CPU run with an
FSDP plugin silently ran as DDP — without CUDA it is FSDP (measured: lora_sync and restart, 2 ranks, gloo).
"""

from __future__ import annotations

import os

import torch
from accelerate.parallelism_config import ParallelismConfig
from accelerate.state import AcceleratorState, DistributedType, PartialState

from grpo_plugin.config.runtime import world_size


def _no_cuda_peers() -> bool:
    return True


def allow_cpu_ranks(deepspeed: bool = False, fsdp: bool = False) -> bool:
    """Install the CPU answer when this machine has no CUDA; True if it was installed. `deepspeed`: the config
    names a DeepSpeed config (the ranks then run as DeepSpeed on its CPU accelerator, not as DDP); `fsdp`: the
    config shards with FSDP2 (the ranks then run as FSDP over gloo)."""
    if torch.cuda.is_available():
        return False
    if world_size() > 1:
        if deepspeed:
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
            _gloo_without_cuda()
        else:
            os.environ.setdefault("ACCELERATE_USE_CPU", "true")
        if fsdp:
            _fsdp_on_cpu()
    try:  # here: optional: outside axolotl (the plugin's checks, its tests) there is nothing to patch
        import axolotl.utils.trainer as trainer_utils
    except ImportError:  # not under axolotl
        return False
    if not hasattr(trainer_utils, "check_cuda_p2p_ib_support"):
        return False
    trainer_utils.check_cuda_p2p_ib_support = _no_cuda_peers
    try:  # here: optional, as above
        import axolotl.cli.config as cli_config
    except ImportError:
        return True
    original = getattr(cli_config, "normalize_config", None)
    if original is not None and not getattr(original, "_grpo_cpu_ranks", False):
        def normalize_config(cfg, *args, **kwargs):
            result = original(cfg, *args, **kwargs)
            cpu_device_map(cfg)
            return result

        normalize_config._grpo_cpu_ranks = True
        cli_config.normalize_config = normalize_config
    return True


def _gloo_without_cuda() -> None:
    """accelerate picks a backend by device; with LOCAL_RANK set and no CUDA it picks none, and a DeepSpeed run
    then counts one process while DeepSpeed counts them all. Without CUDA the answer is gloo, as for CPU ranks."""
    original = PartialState._prepare_backend
    if getattr(original, "_grpo_cpu_ranks", False):
        return

    def _prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        chosen, kind = original(self, cpu, sagemaker_dp, backend)
        if chosen is None and kind == DistributedType.NO and int(os.environ.get("LOCAL_RANK", -1)) != -1:
            return "gloo", DistributedType.MULTI_CPU
        return chosen, kind

    _prepare_backend._grpo_cpu_ranks = True
    PartialState._prepare_backend = _prepare_backend


def _fsdp_on_cpu() -> None:
    """FSDP2 on CPU ranks: axolotl builds its device mesh for "cuda" (both ranks died in torch.cuda.set_device),
    and accelerate selects FSDP only for GPU-type ranks (a MULTI_CPU run would silently be DDP). Without CUDA the
    mesh is built for "cpu" (gloo has the collectives FSDP2 uses) and a MULTI_CPU run given an FSDP plugin is FSDP."""
    build = ParallelismConfig.build_device_mesh
    if not getattr(build, "_grpo_cpu_ranks", False):
        def build_device_mesh(self, device_type):
            return build(self, "cpu" if device_type == "cuda" else device_type)

        build_device_mesh._grpo_cpu_ranks = True
        ParallelismConfig.build_device_mesh = build_device_mesh
    init = AcceleratorState.__init__
    if not getattr(init, "_grpo_cpu_ranks", False):
        def __init__(self, *args, **kwargs):
            init(self, *args, **kwargs)
            plugin = kwargs.get("fsdp_plugin")
            if plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
                self.distributed_type = DistributedType.FSDP
                self.fsdp_plugin = plugin
                PartialState._shared_state["distributed_type"] = DistributedType.FSDP

        __init__._grpo_cpu_ranks = True
        AcceleratorState.__init__ = __init__


def cpu_device_map(cfg) -> bool:
    """Without CUDA, several ranks: the model loads on the CPU (not on `cuda:<local rank>`). True if changed."""
    if torch.cuda.is_available() or int(cfg.get("world_size") or 1) == 1 or cfg.get("device") != "cpu":
        return False
    if cfg.get("device_map") == {"": "cpu"}:
        return False
    cfg["device_map"] = {"": "cpu"}
    return True


def describe_ranks(accelerator) -> str:
    """One line per rank: which rank of how many, how they are joined (DDP / DeepSpeed ZeRO-n), who pushes."""
    kind = str(accelerator.distributed_type).rsplit(".", 1)[-1]
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is not None:
        kind += f" ZeRO-{plugin.zero_stage}"
    from grpo_plugin.sync.ranks import for_accelerator  # here: torch.distributed, when ranks are described

    if for_accelerator(accelerator).sharded:  # ZeRO-3 / FSDP2: every rank takes part in each sync
        role = ("gathers the weights with the other ranks, pushes them to vLLM" if accelerator.is_main_process
                else "joins rank 0's gathers and probe passes")
    else:
        role = "pushes the weights to vLLM" if accelerator.is_main_process else "waits for rank 0's pushes"
    return (f"trainer rank {accelerator.process_index} of {accelerator.num_processes} ({kind}, "
            f"{accelerator.device}): {role}")
