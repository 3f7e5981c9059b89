"""compat/cpu_ranks.py and the rules for several trainer ranks, without launching ranks (the 2-rank runs through
`axolotl train` are tests/e2e/test_multiprocess_train.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from grpo_plugin.compat.cpu_ranks import cpu_device_map, describe_ranks


def test_without_cuda_several_ranks_load_the_model_on_the_cpu():
    cfg = {"world_size": 2, "device": "cpu", "device_map": {"": 1}}  # what axolotl 0.21 sets for rank 1
    assert cpu_device_map(cfg) and cfg["device_map"] == {"": "cpu"}
    assert not cpu_device_map({"world_size": 1, "device": "cpu", "device_map": "auto"})
    one = {"world_size": 1, "device": "cpu", "device_map": "auto"}
    cpu_device_map(one)
    assert one["device_map"] == "auto"  # one rank: axolotl's own choice stays


def test_each_rank_says_which_it_is_how_they_are_joined_and_who_pushes():
    def acc(index, kind, zero=None):
        plugin = SimpleNamespace(zero_stage=zero) if zero else None
        return SimpleNamespace(process_index=index, num_processes=2, is_main_process=index == 0, device="cpu",
                               distributed_type=f"DistributedType.{kind}",
                               state=SimpleNamespace(deepspeed_plugin=plugin))

    assert describe_ranks(acc(0, "MULTI_CPU")) == ("trainer rank 0 of 2 (MULTI_CPU, cpu): pushes the weights to "
                                                   "vLLM")
    assert describe_ranks(acc(1, "DEEPSPEED", zero=2)).startswith("trainer rank 1 of 2 (DEEPSPEED ZeRO-2, cpu): "
                                                                  "waits for rank 0's pushes")
    assert describe_ranks(acc(1, "DEEPSPEED", zero=3)) == ("trainer rank 1 of 2 (DEEPSPEED ZeRO-3, cpu): joins rank "
                                                           "0's gathers and probe passes")
    assert describe_ranks(acc(0, "DEEPSPEED", zero=3)).endswith("gathers the weights with the other ranks, pushes "
                                                                "them to vLLM")


def test_deepspeed_ranks_without_cuda_get_gloo_not_a_silent_single_process(monkeypatch):
    """accelerate picked no backend for a CPU rank and counted one process while DeepSpeed counted two (its batch
    check failed); with ACCELERATE_USE_CPU it dropped DeepSpeed. The plugin's answer: gloo, MULTI_CPU."""
    import torch
    from accelerate.state import DistributedType, PartialState

    from grpo_plugin.compat.cpu_ranks import allow_cpu_ranks

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(PartialState, "_prepare_backend", PartialState._prepare_backend)  # undone after
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    state = object.__new__(PartialState)
    assert PartialState._prepare_backend(state, False) == (None, DistributedType.NO)  # accelerate's own answer
    allow_cpu_ranks(deepspeed=True)
    allow_cpu_ranks(deepspeed=True)  # twice: wrapped once
    assert PartialState._prepare_backend(state, False) == ("gloo", DistributedType.MULTI_CPU)
    assert "ACCELERATE_USE_CPU" not in __import__("os").environ  # it would drop DeepSpeed
    assert __import__("os").environ["DS_ACCELERATOR"] == "cpu"
    monkeypatch.delenv("LOCAL_RANK")
    assert PartialState._prepare_backend(state, False) == (None, DistributedType.NO)  # not a launched rank


def test_several_ranks_refuse_what_would_hang_or_race(monkeypatch):
    from grpo_plugin.config.checks import check_cross_keys
    from grpo_plugin.config.schema import GRPOSettings

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"skip_zero_advantage_batches: true with 2 trainer ranks deadlocks"):
        check_cross_keys({"rl": "grpo", "grpo": {"sync": "restart"}, "trl": {"skip_zero_advantage_batches": True}})
    with pytest.raises(ValidationError, match=r"ipc_fence: trainer assumes one trainer process"):
        GRPOSettings(sync="ipc", ipc_fence="trainer")
    assert GRPOSettings(sync="ipc").ipc_fence == "server"  # the default with several ranks
    check_cross_keys({"rl": "grpo", "grpo": {"sync": "restart"}, "deepspeed": "deepspeed_configs/zero2.json"})
    # async prefetch with several ranks: each rank prefetches its own rollouts (tests/e2e/test_multiprocess_train.py)
    check_cross_keys({"rl": "grpo", "grpo": {"sync": "lora_sync"}, "adapter": "lora", "trl": {"async_prefetch": True}})
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert GRPOSettings(sync="ipc").ipc_fence == "trainer"
    check_cross_keys({"rl": "grpo", "grpo": {"sync": "restart"}, "trl": {"skip_zero_advantage_batches": True}})
    check_cross_keys({"rl": "grpo", "grpo": {"sync": "restart"}, "trl": {"async_prefetch": True}})  # one rank: fine


def test_the_plugin_turns_zero_advantage_skipping_off_only_for_several_ranks(monkeypatch):
    from grpo_plugin.plugin import GRPOPlugin

    monkeypatch.setenv("ACCELERATE_USE_CPU", "unset-after")  # register() sets it for several ranks: undone after
    monkeypatch.delenv("ACCELERATE_USE_CPU")
    for world, expected in (("2", False), ("1", None)):
        monkeypatch.setenv("WORLD_SIZE", world)
        cfg = {"rl": "grpo", "grpo": {"sync": "restart"}}
        GRPOPlugin().register(cfg)
        assert cfg["trl"].get("skip_zero_advantage_batches") is expected


def test_fsdp_ranks_without_cuda_get_a_cpu_mesh_and_run_as_fsdp(monkeypatch):
    """axolotl built its device mesh for "cuda" (both ranks died in torch.cuda.set_device) and accelerate selects
    FSDP for GPU ranks only (a CPU run would be DDP). Without CUDA: a "cpu" mesh, and FSDP."""
    import torch
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.state import AcceleratorState, DistributedType, PartialState

    from grpo_plugin.compat.cpu_ranks import allow_cpu_ranks

    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(ParallelismConfig, "build_device_mesh", lambda self, device_type: asked.append(device_type))

    def accelerate_init(self, *args, **kwargs):  # what accelerate decides for CPU ranks
        self.__dict__ = {}
        self.distributed_type = DistributedType.MULTI_CPU

    monkeypatch.setattr(AcceleratorState, "__init__", accelerate_init)
    monkeypatch.setattr(PartialState, "_shared_state", {})
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    allow_cpu_ranks(fsdp=True)
    allow_cpu_ranks(fsdp=True)  # twice: wrapped once
    ParallelismConfig.build_device_mesh(object(), "cuda")
    assert asked == ["cpu"]
    plugin = object()
    state = AcceleratorState(fsdp_plugin=plugin)
    assert state.distributed_type == DistributedType.FSDP and state.fsdp_plugin is plugin
    assert PartialState._shared_state["distributed_type"] == DistributedType.FSDP
    assert AcceleratorState().distributed_type == DistributedType.MULTI_CPU  # no FSDP plugin: DDP as before


@pytest.mark.parametrize("grpo", [{"sync": "lora_sync"}, {"sync": "restart", "managed_server": True},
                                  {"sync": "ipc", "managed_server": True}])
def test_axolotls_ray_launcher_is_refused_with_the_reason_and_the_launchers_to_use(grpo):
    """`use_ray: true` (Ray Train workers) is refused in every mode, naming why and accelerate / torchrun instead;
    `use_ray: false` and a lone `ray_num_workers` (axolotl ignores it without use_ray) are accepted."""
    from grpo_plugin.config.checks import check_cross_keys

    base = {"rl": "grpo", "grpo": grpo, **({"adapter": "lora"} if grpo["sync"] == "lora_sync" else {})}
    check_cross_keys({**base, "use_ray": False, "ray_num_workers": 2})
    check_cross_keys({**base, "ray_num_workers": 2})
    for value in (True, "true"):
        with pytest.raises(ValueError) as err:
            check_cross_keys({**base, "use_ray": value, "ray_num_workers": 2})
        message = str(err.value)
        assert message.startswith("use_ray: true (axolotl's Ray Train launcher, ray_num_workers: 2)")
        for reason in ("one GPU per worker", "not its main thread", "skip_zero_advantage_batches: true"):
            assert reason in message
        assert "--launcher accelerate -- --multi_gpu --num_processes 2" in message and "torchrun" in message
