"""Delta pushes (`grpo.delta_anchor_every`) vs full pushes of the same bf16 weights, on one server serving bf16, after
REAL optimizer steps (AdamW on a fixed batch, bf16 parameters, no master copy) at each learning rate asked for. Run
as part of the transport benchmark, per size (bench/transport.py):

    python -m grpo_plugin.bench sync --transport both [--sizes tiny,0.5b] [--delta-lrs 1e-6,1e-5] [--delta-only]

Per learning rate: one anchor (a full push over the network that the server keeps as its base), then `repeats`
times an optimizer step and a delta push over the network; then, of the last weights, `repeats` full pushes
alternated over the network and through the shared directory (deltas off). Every push is verified by the probe.
Figures: bytes per push (delta vs the full file) and the trainer-visible pause (median).
"""

from __future__ import annotations

import statistics
import time

from grpo_plugin.bench.common import free_port
from grpo_plugin.server.files import SentFiles, SharedFiles

TOLERANCE = 2e-2  # the probe's default for bf16 weights


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
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_plugin.sync import ProbeVerifier
    from grpo_plugin.sync.base import ModelHandle
    from grpo_plugin.sync.restart import RestartSync

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, foreach=False)  # no model-sized temporaries
    batch = torch.randint(3, model.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    verifier = ProbeVerifier(client, probe_ids, TOLERANCE, "restart")
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
        "verified": all(d <= TOLERANCE for v in diffs.values() for d in v) and kinds == ["delta"] * repeats,
    }


def run(model_dir: str, spec_cls, where: dict, log, lrs: list[float], repeats: int, probe_ids: list[int]) -> dict:
    """The delta entry of one size: a bf16 server of its own (started and stopped here)."""
    from grpo_plugin.server.process import launch

    spec = spec_cls(model=model_dir, port=free_port(), dtype="bfloat16", max_model_len=512, enforce_eager=True,
                    enable_lora=False, **where)
    server, client = launch(spec, log, timeout=900, client_timeout=600)
    try:
        return {f"lr_{lr:g}": _one_lr(client, model_dir, probe_ids, lr, repeats) for lr in lrs}
    finally:
        server.stop()


def report(size: str, entry: dict) -> None:
    for r in entry.values():
        print(f"  {size:5s} delta at lr {r['lr']:g}: {r['delta_bytes'] / 2**20:.2f} MiB per push vs "
              f"{r['full_bytes'] / 2**20:.1f} MiB full ({r['bytes_ratio_full_to_delta']}x fewer) · delta "
              f"{r['delta_ms']:.0f} ms vs full network {r['full_network_ms']:.0f} ms / shared "
              f"{r['full_shared_ms']:.0f} ms · identical to a full push {r['identical_to_full_push']} · verified "
              f"{r['verified']}")
