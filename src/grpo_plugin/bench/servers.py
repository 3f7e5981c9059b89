"""The several-servers benchmark (prints figures; never a timed test).

    python -m grpo_plugin.bench servers [--size 100m] [--repeats 10] [--json]

In ONE run, on one model built locally (fp32, vLLM-CPU, eager):
- sync pause with 2 servers vs 1: the same pushes, alternating, to one server alone and to two servers at once
  (server/group.py sends to both in parallel) — `lora_sync` (r=16, all linear layers) and `restart` (reload);
  every push verified by the probe on every server it went to;
- `ipc` sync pause (fence trainer: the prefix-cache reset on every server) with 1 and 2 servers;
- memory (summed PSS of every server's process tree + a trainer process after 2 AdamW steps): `ipc` with one
  server, `ipc` with two servers mapping one weight file, and the alternative for two servers — `restart`, where
  each server and the trainer hold their own copy.
"""

from __future__ import annotations

import sys
import time

from grpo_plugin.bench.common import (
    load_model,
    memory,
    pause_ipc,
    pause_stats,
    perturb,
    probe_token_ids,
    scratch,
    stack,
    start_vllm_servers,
)
from grpo_plugin.demo.tiny import MODEL_SIZES, build_model
from grpo_plugin.server.group import ServerGroup
from grpo_plugin.sync.base import ModelHandle

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _alternate(syncs: dict, model, verifiers: dict, repeats: int, only: str) -> dict:
    """Push the same weights through each sync in turn (order alternating per round), each verified."""
    ms = {k: [] for k in syncs}
    diffs = {k: [] for k in syncs}
    for i in range(repeats + 1):
        perturb(model, seed=i, scale=0.01, only=only)
        for key in (list(syncs) if i % 2 == 0 else list(syncs)[::-1]):
            t0 = time.perf_counter()
            syncs[key].push(i)
            pause = (time.perf_counter() - t0) * 1e3
            diff, _ = verifiers[key].measure(model, syncs[key].generation_model)
            if i:
                ms[key].append(pause)
                diffs[key].append(diff)
    out = {k: pause_stats(ms[k], diffs[k]) for k in syncs}
    out["ratio_2_vs_1"] = round(out["2 servers"]["median_ms"] / out["1 server"]["median_ms"], 3)
    return out


def _one_vs_two(make_sync, model, clients: list, probe: list[int], repeats: int, only: str) -> dict:
    """The same pushes to the first server alone and to both (ServerGroup), alternating; each verified."""
    from grpo_plugin.sync import ProbeVerifier  # heavy (torch): loaded only when this benchmark runs

    group = ServerGroup([c.fork() for c in clients])
    targets = {"1 server": clients[0], "2 servers": group}
    syncs = {k: make_sync(c, "one" if k == "1 server" else "two") for k, c in targets.items()}
    for sync in syncs.values():
        sync.prepare(ModelHandle.of(model))
    verifiers = {k: ProbeVerifier(c, probe, 1e-4, syncs[k].mode) for k, c in targets.items()}
    try:
        return _alternate(syncs, model, verifiers, repeats, only=only)
    finally:
        for sync in syncs.values():
            sync.close()


def _pauses(model_dir: str, tmp, repeats: int) -> dict:
    # heavy (torch, transformers, peft): loaded only when this benchmark runs
    from peft import LoraConfig, get_peft_model

    from grpo_plugin.sync.lora import LoraSync
    from grpo_plugin.sync.restart import RestartSync

    probe = probe_token_ids(model_dir)
    out = {}
    print("[bench] lora_sync: 2 LoRA servers", file=sys.stderr, flush=True)
    servers, clients = start_vllm_servers(model_dir, tmp, "lora", 2, enable_lora=True, max_lora_rank=16, max_loras=4)
    try:
        model = get_peft_model(load_model(model_dir), LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                            target_modules=TARGETS))
        out["lora_sync"] = _one_vs_two(lambda c, name: LoraSync(c, adapter_name=name), model, clients, probe,
                                       repeats, only="lora_B")
    finally:
        for s in servers:
            s.stop()
    print("[bench] restart (reload): 2 full-weight servers", file=sys.stderr, flush=True)
    servers, clients = start_vllm_servers(model_dir, tmp, "full", 2)
    try:
        out["restart_reload"] = _one_vs_two(lambda c, name: RestartSync(c), load_model(model_dir), clients, probe,
                                            repeats, only="")
        print("[bench] memory: restart with 2 servers (each its own copy)", file=sys.stderr, flush=True)
        out["memory_restart_2"] = memory("restart", model_dir, ",".join(c.base_url for c in clients),
                                         ",".join(str(s.pid) for s in servers))
    finally:
        for s in servers:
            s.stop()
    return out


def run(size: str = "100m", repeats: int = 10) -> dict:
    out: dict = {"benchmark": "servers", "size": size, "repeats": repeats, "stack": stack()}
    with scratch("grpo_bench_servers-") as tmp:
        model_dir = str(build_model(tmp / f"qwen2-{size}", **MODEL_SIZES[size]))
        out.update(_pauses(model_dir, tmp, repeats))
        for n in (1, 2):
            print(f"[bench] ipc: {n} server(s) on one weight file", file=sys.stderr, flush=True)
            servers, clients = start_vllm_servers(model_dir, tmp, f"ipc{n}", n, ipc=True)
            try:
                client = clients[0] if n == 1 else ServerGroup(clients)
                out[f"memory_ipc_{n}"] = memory("ipc", model_dir, ",".join(c.base_url for c in clients),
                                                ",".join(str(s.pid) for s in servers))
                out[f"pause_ipc_{n}"] = pause_ipc(client, model_dir, repeats, "trainer")
            finally:
                for s in servers:
                    s.stop()
    m1, m2, r2 = out["memory_ipc_1"], out["memory_ipc_2"], out["memory_restart_2"]
    out["memory_summary"] = {
        "weights_mb": m1["weights_mb"],
        "ipc_1_server_mb": m1["total_pss_mb"], "ipc_2_servers_mb": m2["total_pss_mb"],
        "restart_2_servers_mb": r2["total_pss_mb"],
        "second_ipc_server_adds_mb": round(m2["total_pss_mb"] - m1["total_pss_mb"], 1),
        "ipc_2_saves_vs_restart_2_mb": round(r2["total_pss_mb"] - m2["total_pss_mb"], 1),
    }
    out["pause_ipc_ratio_2_vs_1"] = round(out["pause_ipc_2"]["median_ms"] / out["pause_ipc_1"]["median_ms"], 3)
    return out


def report(out: dict) -> None:
    st = out["stack"]
    print(f"several-servers benchmark · model {out['size']} fp32 · vLLM-CPU eager · {out['repeats']} pushes per "
          f"sync · stack {st['name']} (axolotl {st['axolotl']}, {st['vllm']}, torch {st['torch']})")
    for key, label in (("lora_sync", "lora_sync (r=16)"), ("restart_reload", "restart (reload)")):
        r = out[key]
        for n in ("1 server", "2 servers"):
            x = r[n]
            print(f"  pause {label:18s} {n:9s} median {x['median_ms']:8.2f} ms  p90 {x['p90_ms']:8.2f} ms  "
                  f"max|Δ| {x['max_logprob_diff']:.1e}  verified {x['verified']}")
        print(f"  pause {label:18s} 2 servers / 1 server: {r['ratio_2_vs_1']:.2f}x")
    for n in (1, 2):
        x = out[f"pause_ipc_{n}"]
        print(f"  pause ipc (fence trainer) {n} server(s): median {x['median_ms']:.2f} ms  max|Δ| "
              f"{x['max_logprob_diff']:.1e}  verified {x['verified']}")
    print(f"  pause ipc 2 servers / 1 server: {out['pause_ipc_ratio_2_vs_1']:.2f}x")
    m = out["memory_summary"]
    print(f"  memory (PSS of every server + the trainer after 2 AdamW steps; weights {m['weights_mb']} MB):")
    print(f"    ipc, 1 server:                 {m['ipc_1_server_mb']:9.1f} MB")
    print(f"    ipc, 2 servers on one file:    {m['ipc_2_servers_mb']:9.1f} MB  (the second server adds "
          f"{m['second_ipc_server_adds_mb']:.1f} MB)")
    print(f"    restart, 2 servers (3 copies): {m['restart_2_servers_mb']:9.1f} MB  (ipc saves "
          f"{m['ipc_2_saves_vs_restart_2_mb']:.1f} MB)")
    sys.stdout.flush()
