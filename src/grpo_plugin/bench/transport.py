"""How a push's files reach a vLLM server (`grpo.weight_transport`): handed as a path in a directory the server reads
(`shared`) vs sent over HTTP (`network`: streamed, sha256-checked, written by the server), in one run on one server
per model size, for a LoRA adapter (lora_sync) and for the full weights (restart, reloaded in place):

    python -m grpo_plugin.bench sync --transport [both|shared|network] [--sizes tiny,100m,0.5b] [--repeats 5]
                                     [--link loopback|veth] [--delta-lrs 1e-6,1e-5] [--delta-only] [--json]

The sides alternate push by push (ABBA) on the same server; every push is verified by the probe. Figure: the
trainer-visible pause per push (median), network / shared, and the bytes sent per second of the network side's
pause. `--link veth`: the server runs in a network namespace of its own, reached over a veth pair (bench/netns.py;
root), as a server on another host is; it still shares the filesystem, so the shared side can be timed on the same
server. Between real hosts the link's bandwidth bounds `network` (docs/scaling.md has the model).

Per size, a `delta` entry (`grpo.delta_anchor_every`; `--delta-lrs ''`: none; `--delta-only`: only that entry), on a
server of its own serving bf16, after REAL optimizer steps (AdamW on a fixed batch, bf16 parameters, no master
copy) at each of `--delta-lrs`: an anchor (a full push over the network the server keeps as its base), then
`--repeats` times an optimizer step and a delta push over the network; then, of the last weights, `--repeats` full
pushes alternated over the network and through the shared directory (deltas off). Every push is verified by the
probe; the server after the deltas must compute exactly what it computes after a full push of the same weights.
Figures: bytes per push (delta vs the full file), the trainer-visible pause (median) and its parts.
"""

from __future__ import annotations

import contextlib
import statistics
import time

from grpo_plugin.bench.common import free_port, perturb, probe_token_ids, scratch, stack, stack_line
from grpo_plugin.bench.netns import ServerInNamespace, VethLink, tcp_rate
from grpo_plugin.demo.tiny import MODEL_SIZES, build_model
from grpo_plugin.server.files import SentFiles, SharedFiles
from grpo_plugin.server.process import ServerSpec, launch
from grpo_plugin.sync.base import ModelHandle

SIDES = ("shared", "network")
BF16_TOLERANCE = 2e-2  # the probe's default for bf16 weights


def _order(i: int, sides: list[str]) -> list[str]:
    return sides if i % 2 == 0 else list(reversed(sides))


def _pushes(client, sync, model, verifier, sides: list[str], repeats: int, only: str) -> dict:
    """`repeats` pushes per side, alternated, after one untimed push per side; each verified."""
    ms: dict[str, list[float]] = {s: [] for s in sides}
    sent: dict[str, list[int]] = {s: [] for s in sides}
    diffs = []
    for i in range(repeats + 1):
        for side in _order(i, sides):
            client.files = SentFiles() if side == "network" else SharedFiles()
            perturb(model, 1000 * i + len(side), scale=0.01, only=only)
            t0 = time.perf_counter()
            sync.push(i)
            pause = (time.perf_counter() - t0) * 1e3
            diff, _ = verifier.measure(model, sync.generation_model)
            diffs.append(diff)
            if i > 0:
                ms[side].append(pause)
                sent[side].append(getattr(client.files, "bytes_sent", 0))
    out = {side: {"median_ms": round(statistics.median(v), 2), "n": len(v)} for side, v in ms.items()}
    if "network" in out:
        nbytes = statistics.median(sent["network"])
        out["network"]["bytes"] = int(nbytes)
        out["network"]["mb_per_s"] = round(nbytes / 2**20 / (out["network"]["median_ms"] / 1e3), 1)
    if len(out) == 2:
        out["ratio_network_to_shared"] = round(out["network"]["median_ms"] / out["shared"]["median_ms"], 3)
    out["max_logprob_diff"] = max(diffs)
    out["verified"] = all(d <= 1e-4 for d in diffs)
    return out


def run(sizes: list[str], repeats: int, sides: list[str], link: str = "loopback", delta_lrs: list[float] = (),
        delta_only: bool = False) -> dict:
    out: dict = {"benchmark": "transport", "repeats": repeats, "sides": sides, "link": link, "models": {},
                 "stack": stack()}
    with scratch("grpo-bench-transport-") as tmp, (VethLink() if link == "veth" else contextlib.nullcontext()) as veth:
        # the link's own rate, plain TCP between the same two ends, in this run: what a push's rate is a share of
        host, netns = (veth.peer, veth.netns) if veth else ("127.0.0.1", None)
        out["link_rate"] = {"one_stream_mb_per_s": tcp_rate(host, netns), "four_streams_mb_per_s":
                            tcp_rate(host, netns, streams=4)}
        for size in sizes:
            model_dir = str(build_model(tmp / f"qwen2-{size}", **MODEL_SIZES[size]))
            spec_cls, where = ((ServerInNamespace, {"host": veth.peer, "netns": veth.netns}) if veth
                               else (ServerSpec, {}))
            res: dict = {} if delta_only else _full_and_adapter(model_dir, spec_cls, where, tmp, size, repeats, sides)
            if delta_lrs:
                res["delta"] = _delta_entry(model_dir, spec_cls, where, tmp / f"vllm_server-{size}-bf16.log",
                                         list(delta_lrs), repeats, probe_token_ids(model_dir))
            for what in ("adapter", "full_weights"):
                if "network" in res.get(what, {}):
                    res[what]["network"]["link_share"] = round(
                        res[what]["network"]["mb_per_s"] / out["link_rate"]["one_stream_mb_per_s"], 3)
            out["models"][size] = res
    return out


def _full_and_adapter(model_dir: str, spec_cls, where: dict, tmp, size: str, repeats: int, sides: list[str]) -> dict:
    """fp32 full weights (restart) and a LoRA adapter (lora_sync), each side alternated, on one fp32 server."""
    import torch  # heavy (torch, transformers, peft): loaded only when this benchmark runs
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from grpo_plugin.sync import ProbeVerifier
    from grpo_plugin.sync.lora import LoraSync
    from grpo_plugin.sync.restart import InPlaceReload, RestartSync

    spec = spec_cls(model=model_dir, port=free_port(), dtype="float32", max_model_len=512, enforce_eager=True,
                    max_lora_rank=16, **where)
    server, client = launch(spec, tmp / f"vllm_server-{size}.log", timeout=900, client_timeout=600)
    try:
        probe_ids = probe_token_ids(model_dir)
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        res: dict = {"params": sum(p.numel() for p in base.parameters())}
        full = RestartSync(client, strategy="reload", sync_dir=str(tmp))
        full.prepare(ModelHandle.of(base))
        res["full_weights"] = _pushes(client, full, base, ProbeVerifier(client, probe_ids, 1e-4, "restart"),
                                      sides, repeats, only="")
        client.files = SharedFiles()
        InPlaceReload(client, timeout=600).apply(None)  # the server's own weights again, for the adapter
        full.close()
        del base
        peft = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                              LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=[
                                  "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                  "down_proj"]))
        adapter = LoraSync(client, adapter_name="bench-transport", sync_dir=str(tmp))
        adapter.prepare(ModelHandle.of(peft))
        res["adapter"] = _pushes(client, adapter, peft, ProbeVerifier(client, probe_ids, 1e-4, "lora_sync"),
                                 sides, repeats, only="lora_B")
        adapter.close()
        return res
    finally:
        server.stop()


def _optimizer_step(model, optimizer, batch) -> None:
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _timed(client, sync, step: int, verifier, model, diffs: dict, kind: str) -> float:
    """One push: its pause (ms); the probe's mean |Δlogp| into diffs[kind], the bytes sent into last_report."""
    before = getattr(client.files, "bytes_sent", 0)
    t0 = time.perf_counter()
    result = sync.push(step)
    ms = (time.perf_counter() - t0) * 1e3
    diffs.setdefault(kind, []).append(verifier.measure(model, sync.generation_model)[0])
    sync.last_report["sent"] = getattr(client.files, "bytes_sent", 0) - before
    assert result.pushed
    return ms


def _one_lr(client, model_dir: str, probe_ids: list[int], lr: float, repeats: int) -> dict:
    """The delta entry at one learning rate (the module's docstring says what is pushed in which order)."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_plugin.sync import ProbeVerifier
    from grpo_plugin.sync.restart import RestartSync

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, foreach=False)  # no model-sized temporaries
    batch = torch.randint(3, model.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    verifier = ProbeVerifier(client, probe_ids, BF16_TOLERANCE, "restart")
    diffs: dict[str, list[float]] = {}
    client.files = SentFiles()
    delta = RestartSync(client, strategy="reload", delta_anchor_every=repeats + 1)
    delta.prepare(ModelHandle.of(model))
    anchor_ms = _timed(client, delta, 0, verifier, model, diffs, "anchor")
    full_bytes = delta.last_report["sent"]
    ms, sent, changed, kinds, parts = [], [], [], [], []
    for i in range(1, repeats + 1):
        _optimizer_step(model, optimizer, batch)
        ms.append(_timed(client, delta, i, verifier, model, diffs, "delta"))
        parts.append({k: v for k, v in delta.last_report.items() if k.endswith("_ms")})
        sent.append(delta.last_report["sent"])
        kinds.append(delta.last_report["push"])
        changed.append(delta.last_report.get("delta_bytes", 0))
    after_deltas = client.prompt_logprobs(probe_ids, model=delta.generation_model)
    delta.close()
    full = RestartSync(client, strategy="reload", delta_anchor_every=0)
    full.prepare(ModelHandle.of(model))
    full_ms: dict[str, list[float]] = {"network": [], "shared": []}
    for i in range(repeats):
        for side in (("network", "shared") if i % 2 == 0 else ("shared", "network")):
            client.files = SentFiles() if side == "network" else SharedFiles()
            full_ms[side].append(_timed(client, full, repeats + 1 + i, verifier, model, diffs, "full"))
            if i == 0 and side == "network":  # the same weights as the last delta's, pushed whole
                identical = client.prompt_logprobs(probe_ids, model=full.generation_model) == after_deltas
    full.close()
    median = statistics.median(ms)
    shared, network = statistics.median(full_ms["shared"]), statistics.median(full_ms["network"])
    return {
        "lr": lr, "pushes": kinds, "full_bytes": full_bytes, "delta_bytes": int(statistics.median(sent)),
        "delta_payload_bytes": int(statistics.median(changed)),
        "bytes_ratio_full_to_delta": round(full_bytes / max(1, statistics.median(sent)), 1),
        "anchor_ms": round(anchor_ms, 1), "delta_ms": round(median, 1),
        "delta_parts_ms": {k: round(statistics.median(p[k] for p in parts), 1) for k in parts[0]},
        "full_network_ms": round(network, 1), "full_shared_ms": round(shared, 1),
        "delta_to_full_shared": round(median / shared, 3),
        "max_logprob_diff": {kind: round(max(v), 4) for kind, v in diffs.items()},
        # the server after the deltas computes exactly what it computes after a full push of the same weights
        "identical_to_full_push": identical,
        "verified": all(d <= BF16_TOLERANCE for v in diffs.values() for d in v) and kinds == ["delta"] * repeats,
    }


def _delta_entry(model_dir: str, spec_cls, where: dict, log, lrs: list[float], repeats: int,
                 probe_ids: list[int]) -> dict:
    """The delta entry of one size: a bf16 server of its own (started and stopped here)."""
    spec = spec_cls(model=model_dir, port=free_port(), dtype="bfloat16", max_model_len=512, enforce_eager=True,
                    enable_lora=False, **where)
    server, client = launch(spec, log, timeout=900, client_timeout=600)
    try:
        return {f"lr_{lr:g}": _one_lr(client, model_dir, probe_ids, lr, repeats) for lr in lrs}
    finally:
        server.stop()


def _report_delta(size: str, entry: dict) -> None:
    for r in entry.values():
        print(f"  {size:5s} delta at lr {r['lr']:g}: {r['delta_bytes'] / 2**20:.2f} MiB per push vs "
              f"{r['full_bytes'] / 2**20:.1f} MiB full ({r['bytes_ratio_full_to_delta']}x fewer) · delta "
              f"{r['delta_ms']:.0f} ms vs full network {r['full_network_ms']:.0f} ms / shared "
              f"{r['full_shared_ms']:.0f} ms · identical to a full push {r['identical_to_full_push']} · verified "
              f"{r['verified']}")


def report(out: dict) -> None:
    print(f"weight transport: the sync directory read by the server (shared) vs sent over HTTP (network), "
          f"link {out['link']}, median of {out['repeats']} alternated pushes per side, every push verified")
    rate = out["link_rate"]
    print(f"  the link itself (plain TCP, 1 GiB): {rate['one_stream_mb_per_s']} MiB/s one stream, "
          f"{rate['four_streams_mb_per_s']} MiB/s four streams")
    for size, res in out["models"].items():
        for what in ("adapter", "full_weights"):
            if what not in res:
                continue
            r = res[what]
            parts = [f"{side} {r[side]['median_ms']:.1f} ms" for side in out["sides"]]
            if "network" in r:
                parts.append(f"{r['network']['bytes'] / 2**20:.1f} MiB sent, {r['network']['mb_per_s']} MiB/s = "
                             f"{r['network']['link_share']:.0%} of the link's one stream")
            if "ratio_network_to_shared" in r:
                parts.append(f"ratio {r['ratio_network_to_shared']:.2f}")
            print(f"  {size:5s} ({res['params'] / 1e6:.1f}M params) {what:12s} " + " · ".join(parts)
                  + f" · verified {r['verified']}")
        if "delta" in res:
            _report_delta(size, res["delta"])
    print(stack_line(out["stack"]))
