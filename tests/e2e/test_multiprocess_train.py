"""Two trainer ranks through `axolotl train ... --launcher accelerate -- --multi_gpu --num_processes 2`, on CPU:
the launch line of the multi-GPU recipes. The ranks are joined for real (gloo, accelerate's MULTI_CPU: DDP) — each
rank says so in its own log line (compat/cpu_ranks.py makes this reachable on a machine without CUDA; before, both
ranks died in axolotl's CUDA peer-to-peer check, and with that fixed each rank believed it was alone and both
pushed; DeepSpeed was dropped silently or failed its batch check).

DDP: only rank 0 pushes and verifies; every rank waits for its push and samples with the model name it broadcasts
(trainer.py). DeepSpeed ZeRO-3 and FSDP2: each rank holds a part of every weight; every rank joins the push's gather
and the probe's forward pass, rank 0 writes and verifies (sync/ranks.py). lora_sync runs on the session server as
`axolotl vllm-serve` would start it (no server start of its own). ipc needs servers of its own (its weights are
written in place): its two DDP ranks run on two servers, and restart's two ZeRO-3 ranks on two servers, in
tests/e2e/test_scale_train.py (one run for both features each, to keep CI's time); restart under DDP is the same
rank-0 push as lora_sync's and ipc's."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, free_port
from tests.e2e import hosts
from tests.e2e.test_axolotl_train import BIN, env, quickstart
from tests.e2e.test_server_faults import _finish

pytestmark = pytest.mark.e2e
TOL = 1e-4


TWO_RANKS = ("--launcher", "accelerate", "--", "--multi_gpu", "--num_processes", "2")


def _two_ranks(path: Path) -> str:
    proc = subprocess.run([str(BIN / "axolotl"), "train", str(path), *TWO_RANKS], cwd=ROOT, env=env(), text=True,
                          capture_output=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    return log


def assert_two_ranks(log: str, joined: str, roles=("pushes", "waits")) -> None:
    """Both ranks said they were joined (`joined`: accelerate's distributed type) and what each does at a push."""
    ranks = re.findall(r"trainer rank (\d) of 2 \(([A-Z_]+(?: ZeRO-\d)?), cpu[^)]*\): (\w+)", log)
    assert sorted(ranks) == [("0", joined, roles[0]), ("1", joined, roles[1])], ranks


def _assert_two_ranks_trained_verified(log: str, cfg: dict, steps: int, joined: str,
                                      roles=("pushes", "waits")) -> dict:
    assert_two_ranks(log, joined, roles)
    recs = [json.loads(x) for x in (Path(cfg["output_dir"]) / "grpo_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(1, steps + 1))  # rank 0 records every step once
    synced = [r for r in recs if r["sync_logprob_diff"] is not None]
    assert synced and all(r["sync_logprob_diff"] <= TOL for r in synced), [r["sync_logprob_diff"] for r in recs]
    s = json.loads((Path(cfg["output_dir"]) / "grpo_summary.json").read_text())
    assert s["all_syncs_verified"] is True and s["steps"] == steps, s
    return s


def _assert_prefetched(cfg: dict, steps: int) -> None:
    """Async prefetch with 2 ranks: after the synchronous first rollout, rollouts were generated while the step
    before trained (policy lag 1, the bound), each rank's own (no collective in the background thread)."""
    recs = [json.loads(x) for x in (Path(cfg["output_dir"]) / "grpo_metrics.jsonl").read_text().splitlines()]
    lags = [r["policy_lag"] for r in recs]
    assert lags[0] == 0 and all(lag in (0, 1) for lag in lags) and lags.count(1) >= steps // 2, lags


@pytest.mark.skipif(hosts.available() is not None, reason=f"three hosts: {hosts.available()}")
def test_two_ranks_on_two_hosts_ddp_lora_sync_async_prefetch_server_on_a_third(tmp_path, tiny_model_dir,
                                                                              tiny_data_file, cache_env):
    """DDP across machines with trl.async_prefetch: trainer rank 0 on host A, rank 1 on host B, `axolotl vllm-serve`
    on host C (tests/e2e/hosts.py: each its own network, mount and PID namespaces on one bridge; B and C with a
    private /tmp holding their copy of the model, data and config), launched as the multi-node recipe says
    (`--num_machines 2 --machine_rank i --main_process_ip <A>`), gloo over the link. Each rank's background thread
    generates its next rollout on C while the step trains; rank 0 pushes every adapter version to C over HTTP (C
    cannot read its sync directory) and verifies it; rank 1 samples with the version rank 0 announces."""
    steps = 6
    with hosts.Hosts(("a", "b", "c")) as net:
        path, cfg = quickstart(tmp_path, tiny_model_dir, tiny_data_file, "scale/quickstart_2ranks_lora_sync.yaml",
                               max_steps=steps, trl={"async_prefetch": True},
                               grpo={"managed_server": False, "server_timeout": 240})
        cfg["vllm"]["host"] = net.addr("c")
        path.write_text(yaml.safe_dump(cfg))
        serve_cfg = hosts.server_host_copy(tmp_path / "host-c", cfg, tiny_model_dir, tiny_data_file)
        rank1_cfg = hosts.server_host_copy(tmp_path / "host-b", cfg, tiny_model_dir, tiny_data_file)
        serve = net.popen("c", [str(BIN / "axolotl"), "vllm-serve", serve_cfg], log=tmp_path / "serve.log",
                          env=env(), cwd=ROOT, private_tmp=tmp_path / "host-c")
        port = free_port()

        def launch(rank: int) -> list[str]:
            return ["--launcher", "accelerate", "--", "--multi_gpu", "--num_machines", "2", "--machine_rank",
                    str(rank), "--num_processes", "2", "--main_process_ip", net.addr("a"),
                    "--main_process_port", str(port)]

        logs = [tmp_path / "rank0.log", tmp_path / "rank1.log"]
        try:
            ranks = [net.popen("a", [str(BIN / "axolotl"), "train", str(path), *launch(0)], log=logs[0], env=env(),
                               cwd=ROOT),
                     net.popen("b", [str(BIN / "axolotl"), "train", rank1_cfg, *launch(1)], log=logs[1], env=env(),
                               cwd=ROOT, private_tmp=tmp_path / "host-b")]
            texts = [_finish(p, log) for p, log in zip(ranks, logs)]
        finally:
            os.killpg(serve.pid, signal.SIGINT)  # Ctrl-C in host C's terminal
            serve.wait(timeout=90)
    assert [p.returncode for p in ranks] == [0, 0], texts[0][-4000:] + texts[1][-4000:]
    s = _assert_two_ranks_trained_verified(texts[0] + texts[1], cfg, steps, "MULTI_CPU")
    assert s["num_syncs"] == steps
    _assert_prefetched(cfg, steps)
    assert [x["weight_transport"] for x in s["servers"]] == ["network"], s["servers"]
    assert s["servers"][0]["url"] == f"http://{net.addr('c')}:{cfg['vllm']['port']}"


def zero3_gathered(log: str, tensors: int, name: str = "ZeRO-3") -> tuple[int, int]:
    """The push's gather, as rank 0 reports it once: (elements gathered, elements rank 0 holds between pushes)."""
    m = re.search(name + r": each push gathers (\d+) tensors, ([\d,]+) elements \(rank 0 holds ([\d,]+) of them", log)
    assert m, log[-4000:]
    assert int(m.group(1)) == tensors
    return int(m.group(2).replace(",", "")), int(m.group(3).replace(",", ""))


def test_two_ranks_zero3_lora_sync_async_prefetch(tmp_path, tiny_model_dir, tiny_data_file, vllm_server, cache_env):
    """DeepSpeed ZeRO-3 with 2 CPU ranks and trl.async_prefetch: the adapter is partitioned; each push gathers it on
    both ranks (main thread) while each rank's background thread only talks to the server."""
    steps = 6
    path, cfg = quickstart(tmp_path, tiny_model_dir, tiny_data_file, "scale/quickstart_2ranks_zero3_lora_sync.yaml",
                           server=vllm_server, max_steps=steps, deepspeed=str(ROOT / "deepspeed_configs/zero3.json"),
                           trl={"async_prefetch": True})
    log = _two_ranks(path)
    s = _assert_two_ranks_trained_verified(log, cfg, steps, "DEEPSPEED ZeRO-3", roles=("gathers", "joins"))
    assert s["num_syncs"] == steps and s["optimizer"] == "DeepSpeedZeroOptimizer_Stage3", s
    _assert_prefetched(cfg, steps)
    lora_tensors = 2 * 7 * 2  # A and B for 7 target modules in each of the tiny model's 2 layers
    full, held = zero3_gathered(log, lora_tensors)
    assert held <= full // 2 + lora_tensors, (full, held)  # rank 0 holds half of each tensor (rounded up)


def test_two_ranks_fsdp2_lora_sync(tmp_path, tiny_model_dir, tiny_data_file, vllm_server, cache_env):
    """FSDP2 with 2 CPU ranks (compat/cpu_ranks.py: a "cpu" device mesh, and FSDP for MULTI_CPU ranks): the weights
    are DTensors; each push gathers torch's full state dict to rank 0, which picks the adapter out of it."""
    steps = 6
    path, cfg = quickstart(tmp_path, tiny_model_dir, tiny_data_file, "scale/quickstart_2ranks_fsdp2_lora_sync.yaml",
                           server=vllm_server, max_steps=steps)
    log = _two_ranks(path)
    s = _assert_two_ranks_trained_verified(log, cfg, steps, "FSDP", roles=("gathers", "joins"))
    assert s["num_syncs"] == steps, s
    lora_tensors = 2 * 7 * 2  # A and B for 7 target modules in each of the tiny model's 2 layers
    full, held = zero3_gathered(log, lora_tensors, name="FSDP2")
    assert held <= full // 2 + lora_tensors, (full, held)  # rank 0 holds half of each tensor (rounded up)
