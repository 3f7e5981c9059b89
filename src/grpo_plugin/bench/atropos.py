"""Atropos batch → training tensors: ours (atropos/group_tensors.py, validating) vs Atropos' example trainer
(`example_trainer.data.pad_data_to_good_offset`), on the same batches.

    python -m grpo_plugin.bench atropos [--shapes quickstart,gsm8k,long] [--repeats 5] [--spool DIR] [--json]

Two comparisons, both ending with every tensor the loss needs: from the Python lists `/batch` decodes to, and
from the reply's bytes (what each trainer really receives: ours decodes with orjson in the fetcher's thread,
atropos/api.py; the example trainer calls requests' `.json()`). The example trainer mutates its
input, so each of its runs gets a fresh deep copy, made outside the timed region. Shapes:
synthetic batches with the token/mask/logprob layout the environments send (prompt then completion, masks -100
on the prompt, inference_logprobs 1.0 there), sized like the CPU quickstart, a GSM8K run and a long-reasoning
run; `--spool DIR` adds batches recorded by a real run (an `atropos_spool` directory).
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

# name: (groups, group size, prompt tokens, completion tokens (max; lengths vary down to a quarter))
SHAPES = {
    "quickstart": (4, 8, 6, 16),
    "gsm8k": (16, 16, 200, 512),
    "long": (32, 16, 512, 4096),
}
VOCAB = 32000


def synthetic_batch(groups: int, size: int, prompt: int, completion: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(groups):
        p = rng.integers(0, VOCAB, prompt).tolist()
        toks, masks, lps = [], [], []
        for _ in range(size):
            n = int(rng.integers(max(1, completion // 4), completion + 1))
            c = rng.integers(0, VOCAB, n).tolist()
            toks.append(p + c)
            masks.append([-100] * prompt + c)
            lps.append([1.0] * prompt + (-rng.random(n) * 3).tolist())
        out.append({"tokens": toks, "masks": masks, "inference_logprobs": lps,
                    "scores": rng.random(size).tolist(), "overrides": None,
                    "generation_params": {"temperature": 1.0}})
    return out


def recorded_batches(spool: Path) -> list[list[dict]]:
    """The batches a real run left in its spool (pending/ and consumed/): the run-api's reply bytes as received."""
    from grpo_plugin.atropos.api import parse_batch  # optional (orjson: the atropos extra)

    found = []
    for path in sorted(Path(spool).rglob("*.batch")):
        body = path.read_bytes().partition(b"\n")[2]
        reply = parse_batch(body) if body else None
        if reply is not None and reply.groups:
            found.append(reply.groups)
    return found


def _time(fn, repeats: int, setup=None) -> list[float]:
    times = []
    for _ in range(repeats):
        arg = setup() if setup else None
        t0 = time.perf_counter()
        fn(arg)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def bench_one(batch: list[dict], repeats: int) -> dict:
    # optional (the atropos extra: atroposlib, numba, orjson)
    from example_trainer.data import pad_data_to_good_offset

    from grpo_plugin.atropos.api import parse_batch
    from grpo_plugin.atropos.group_tensors import tensorize, warm_up

    warm_up()

    n_seq = sum(len(g["tokens"]) for g in batch)
    n_tok = sum(len(t) for g in batch for t in g["tokens"])
    ours = _time(lambda _: tensorize(batch, pad_token_id=0, vocab_size=VOCAB + 1, max_len=10 ** 6), repeats)
    out = tensorize(batch, pad_token_id=0, vocab_size=VOCAB + 1, max_len=10 ** 6)
    assert not out.rejections and out.num_sequences == n_seq
    theirs = _time(lambda data: pad_data_to_good_offset(data, n_seq), repeats,
                   setup=lambda: {"batch": copy.deepcopy(batch)})
    # from the /batch reply's bytes, as the run-api sends them (starlette: compact JSON): ours as the fetcher
    # does it (api.parse_batch: orjson, then the validating tensorisation), the example trainer with requests'
    # `.json()` (the standard json module) and pad_data_to_good_offset
    raw = json.dumps({"batch": batch}, separators=(",", ":")).encode()

    def ours_from_reply(_):
        return tensorize(parse_batch(raw).groups, pad_token_id=0, vocab_size=VOCAB + 1, max_len=10 ** 6)

    check = ours_from_reply(None)
    assert not check.rejections and torch.equal(check.completion_ids, out.completion_ids)
    ours_raw = _time(ours_from_reply, repeats)
    decode_only = _time(lambda _: parse_batch(raw), repeats)
    theirs_raw = _time(lambda _: pad_data_to_good_offset(json.loads(raw), n_seq), repeats)
    o, t = statistics.median(ours), statistics.median(theirs)
    orr, tr = statistics.median(ours_raw), statistics.median(theirs_raw)
    return {"sequences": n_seq, "tokens": n_tok, "reply_mb": round(len(raw) / 1e6, 2),
            "ours_ms": round(o, 3), "example_trainer_ms": round(t, 3), "speedup": round(t / o, 1),
            "ours_from_reply_ms": round(orr, 3), "example_trainer_from_reply_ms": round(tr, 3),
            "speedup_from_reply": round(tr / orr, 1), "decode_ms": round(statistics.median(decode_only), 3)}


def run(shapes: list[str], repeats: int, spool: str | None = None) -> dict:
    results = {}
    for name in shapes:
        if name not in SHAPES:
            raise SystemExit(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")
        results[name] = bench_one(synthetic_batch(*SHAPES[name]), repeats)
    if spool:
        batches = recorded_batches(Path(spool))
        if not batches:
            raise SystemExit(f"no spooled batches (*.batch) under {spool}")
        rows = [bench_one(b, repeats) for b in batches]
        results[f"recorded ({len(rows)} batches)"] = {
            k: (round(statistics.median(r[k] for r in rows), 3) if k != "sequences" else rows[0][k])
            for k in rows[0]}
    return {"repeats": repeats, "results": results}


def report(out: dict) -> None:
    print(f"Atropos batch -> tensors · median of {out['repeats']} runs · ours (validating, "
          "atropos/group_tensors.py) vs example_trainer.data.pad_data_to_good_offset")
    print(f"  {'batch':26s} {'seqs':>5s} {'tokens':>8s} | {'lists -> tensors (ms)':^28s} | "
          f"{'reply bytes -> tensors (ms)':^28s}")
    cols = f"{'ours':>8s} {'example':>9s} {'x':>8s}"
    print(f"  {'':26s} {'':5s} {'':8s} | {cols} | {cols}")
    for name, r in out["results"].items():
        lists = f"{r['ours_ms']:8.2f} {r['example_trainer_ms']:9.2f} {r['speedup']:7.1f}x"
        reply = (f"{r['ours_from_reply_ms']:8.2f} {r['example_trainer_from_reply_ms']:9.2f} "
                 f"{r['speedup_from_reply']:7.1f}x")
        print(f"  {name:26s} {r['sequences']:5d} {r['tokens']:8.0f} | {lists} | {reply}  "
              f"(decoding {r['decode_ms']:.2f} ms)")
