import socket
from types import SimpleNamespace

import pytest

from grpo_plugin.config.lookups import run_config
from grpo_plugin.server.process import (
    PortInUseError,
    ServerSpec,
    VLLMServerProcess,
    lora_rank_for_vllm,
    spec_from,
)
from rewards.toy import digit_fraction, digit_reward


def test_command_has_what_lora_sync_needs():
    spec = ServerSpec(model="m", port=8123, dtype="float32", enforce_eager=True, max_lora_rank=16)
    cmd = spec.command()
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert cmd[cmd.index("--max-lora-rank") + 1] == "16" and "--enable-lora" in cmd and "--enforce-eager" in cmd
    env = spec.env({})
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True" and env["VLLM_SERVER_DEV_MODE"] == "1"


def test_spec_from_the_config_and_overrides():
    cfg = {"base_model": "m", "adapter": "lora", "lora_r": 12, "grpo": {"sync": "lora_sync"},
           "vllm": {"host": "127.0.0.1", "port": 9000, "dtype": "float32"}}
    spec = spec_from(run_config(cfg), port=9100)
    assert (spec.model, spec.port, spec.dtype, spec.max_lora_rank, spec.enable_lora) == ("m", 9100, "float32", 16, True)
    assert lora_rank_for_vllm(8) == 8 and lora_rank_for_vllm(33) == 64
    with pytest.raises(ValueError):
        lora_rank_for_vllm(10_000)


def test_port_in_use_is_a_clear_error_and_kills_nothing():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        server = VLLMServerProcess(ServerSpec(model="m", port=port))
        with pytest.raises(PortInUseError, match=f"port {port} on 127.0.0.1 is already in use.*Nothing was killed"):
            server.start()
        assert server.proc is None  # no server process was started
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # the port's owner was left alone


def test_digit_reward_plain_and_chat():
    assert digit_fraction("a1b2") == 0.5 and digit_fraction("") == 0.0
    assert digit_reward(None, ["12", "ab", [{"role": "assistant", "content": "1a"}], None]) == [1.0, 0.0, 0.5, 0.0]


def test_server_sampling_seed_follows_the_config_seed():
    cfg = {"base_model": "m", "grpo": {"sync": "lora_sync"}, "adapter": "lora"}
    assert "--seed" not in spec_from(run_config(cfg)).command()  # no seed in the config: vLLM's own default
    cmd = spec_from(run_config({**cfg, "seed": 7})).command()
    assert cmd[cmd.index("--seed") + 1] == "7"
    assert spec_from(run_config({**cfg, "seed": 8})).command()[cmd.index("--seed") + 1] == "8"


def test_one_rank_server_runs_its_worker_in_the_engine_process():
    spec = ServerSpec(model="m")
    cmd, env = spec.command(), spec.env({"VLLM_CPU_OMP_THREADS_BIND": "1-2,5"})
    assert cmd[cmd.index("--distributed-executor-backend") + 1] == "uni"
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # vLLM-CPU turns `uni` back into `mp` without it
    if "VLLM_CPU_KVCACHE_SPACE" in env:  # CPU: the explicit core list the mp executor would have given its worker
        assert (env["OMP_NUM_THREADS"], env["OMP_PLACES"], env["OMP_PROC_BIND"]) == ("3", "{1,2,5}", "true")
    assert "OMP_PLACES" not in spec.env({"VLLM_CPU_OMP_THREADS_BIND": "auto"})
    # several ranks, or the user's own executor choice: vLLM's defaults
    for other in (ServerSpec(model="m", tensor_parallel_size=2), ServerSpec(model="m", one_engine_process=False),
                  ServerSpec(model="m", extra_args=["--distributed-executor-backend=mp"])):
        assert "uni" not in other.command() and "VLLM_ENABLE_V1_MULTIPROCESSING" not in other.env({})
        assert "GRPO_VLLM_FORK_ENGINE" not in other.env({})  # several ranks: vLLM's spawn


def test_a_one_process_cpu_engine_is_forked_unless_the_user_says_no(monkeypatch):
    """in_vllm/fork_engine.py: the vLLM general plugin forks the engine process instead of spawning it (~9 s per
    server start); the server's environment asks for it, a user's GRPO_VLLM_FORK_ENGINE=0 keeps vLLM's spawn."""
    import grpo_plugin.server.process as process
    from grpo_plugin.in_vllm.fork_engine import one_process_engine

    monkeypatch.setattr(process, "cuda_available", lambda: False)
    assert ServerSpec(model="m").env({})["GRPO_VLLM_FORK_ENGINE"] == "1"
    assert ServerSpec(model="m").env({"GRPO_VLLM_FORK_ENGINE": "0"})["GRPO_VLLM_FORK_ENGINE"] == "0"
    monkeypatch.setattr(process, "cuda_available", lambda: True)
    assert "GRPO_VLLM_FORK_ENGINE" not in ServerSpec(model="m").env({})  # CUDA: vLLM's own choice

    def config(tp=1, pp=1, dp=1, backend="uni"):
        return SimpleNamespace(parallel_config=SimpleNamespace(
            tensor_parallel_size=tp, pipeline_parallel_size=pp, data_parallel_size=dp,
            distributed_executor_backend=backend))
    assert one_process_engine(config()) and one_process_engine(config(backend=None))
    assert not any(one_process_engine(c) for c in (config(tp=2), config(pp=2), config(dp=2), config(backend="mp")))
