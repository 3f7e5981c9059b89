"""Long-tailed rollouts: `axolotl train` synchronous vs `trl.async_prefetch` vs streaming with in-flight updates
(`trl.streaming_partial_batch`), one command, one machine, one run:

    python -m grpo_plugin.bench async [--size 100m] [--steps 20] [--prompts 8] [--mode restart] [--seeds 42]
                                      [--median 16] [--max-len 256] [--json]

The workload: completion lengths heavy-tailed as an agent's are — drawn per completion by the server
(bench/tail_lengths.py: Lomax, median `--median` tokens, ~5% past 10x the median, capped at `--max-len`), the
same law for every variant; the model learns the digit task (rewards.toy.digit_reward) in whatever length it is
given. Topology as in `bench e2e`: the vLLM server pinned to core 0, `axolotl train` to core 1 (the CPU stand-in for
vLLM and the trainer on a device each). Every variant runs the same steps, batch, model and seed.

Figures per variant: trained model tokens per second (completion tokens of the trained batches / HF Trainer's
train_runtime), steps/s, the reward of the last 20% of steps and its gain per minute, the lag histogram (per token
with streaming; per rollout otherwise), the streaming counts (continued completions, interrupts, regenerated and
dropped groups), and whether every push was verified. `speedup_vs_prefetch` / `speedup_vs_sync`: streaming's trained
tokens per second over theirs. With several `--seeds`: the reward each run had reached once it had trained as many
tokens as the run that trained fewest (learning per trained token), mean and spread over the seeds.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections import Counter
from pathlib import Path

from grpo_plugin.bench import runs as train_runs
from grpo_plugin.bench.common import free_port, scratch, stack, stack_line
from grpo_plugin.bench.tail_lengths import ENV
from grpo_plugin.demo.tiny import MODEL_SIZES, build_digit_task, build_model

VARIANTS = {"sync": {}, "prefetch": {"async_prefetch": True},
            "streaming": {"async_prefetch": False, "streaming_partial_batch": True}}


def prompt_marker(model_dir: Path, data: Path) -> list[int]:
    """The token ids every prompt of the task ends with (where a completion starts)."""
    from transformers import AutoTokenizer  # heavy: loaded only when this benchmark runs

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    rows = [json.loads(x)["prompt"] for x in data.read_text().splitlines()[:16]]
    ids = [tok(r, add_special_tokens=False)["input_ids"] for r in rows]
    k = 0
    while all(len(i) > k for i in ids) and len({i[-1 - k] for i in ids}) == 1:
        k += 1
    if k == 0:
        raise RuntimeError("the task's prompts share no ending: nothing marks where a completion starts")
    return ids[0][-k:]


def _variant_config(mode, model, data, out, steps, max_len, port, prompts, seed, variant) -> dict:
    cfg = train_runs.config(mode, model, data, out, steps, max_len, port, False, prompts, seed)
    cfg["trl"].update(VARIANTS[variant])
    cfg["grpo"]["adapter_name"] = f"bench-{variant}"
    return cfg


def _figures(cfg: dict, trained: dict) -> dict:
    out = Path(cfg["output_dir"])
    recs = [json.loads(x) for x in (out / "grpo_metrics.jsonl").read_text().splitlines()]
    tokens = [r.get("completion_tokens") or 0 for r in recs]
    runtime = trained["steps"] / trained["steps_per_s"]
    lag: Counter = Counter()
    for r in recs:
        if "token_lag_hist" in r:
            lag.update({int(k): v for k, v in r["token_lag_hist"].items()})
        elif r.get("policy_lag") is not None:
            lag[r["policy_lag"]] += 1
    rewards = [r["reward_mean"] for r in recs if r.get("reward_mean") is not None]
    k = max(1, len(rewards) // 5)
    first, last = statistics.mean(rewards[:k]), statistics.mean(rewards[-k:])
    summed = {key: sum(r.get(key) or 0 for r in recs)
              for key in ("stream_continued", "stream_interrupts", "stream_regenerated", "stream_dropped")}
    # the trainer's idle time (waiting for its batch) and, streaming, the server's (no group of the run generating)
    summed["trainer_wait_s"] = round(sum(r.get("rollout_ms") or 0 for r in recs) / 1e3, 1)
    summed["server_idle_s"] = round(sum(r.get("stream_idle_ms") or 0 for r in recs) / 1e3, 1) \
        if "stream_idle_ms" in recs[-1] else None
    return {"trained_tokens": sum(tokens), "train_runtime_s": round(runtime, 1),
            "tokens_per_s": round(sum(tokens) / runtime, 2), "steps_per_s": trained["steps_per_s"],
            "reward_last20pct": round(last, 4), "reward_gain_per_min": round((last - first) / runtime * 60, 4),
            "lag_hist": {str(k): lag[k] for k in sorted(lag)}, "lag_unit": "token" if "token_lag_hist" in recs[-1]
            else "rollout", "all_syncs_verified": trained.get("all_syncs_verified"), **summed,
            "curve": [(t, r.get("reward_mean")) for t, r in zip(tokens, recs)]}


def reward_at(curve: list[tuple[int, float | None]], budget: int) -> float | None:
    """The mean reward of the steps a run had trained once its trained tokens reached `budget` (pure)."""
    seen, total = [], 0
    for tokens, reward in curve:
        if total >= budget:
            break
        total += tokens
        if reward is not None:
            seen.append(reward)
    tail = seen[-max(1, len(seen) // 5):]
    return round(statistics.mean(tail), 4) if tail else None


def run(size: str = "100m", steps: int = 20, prompts: int = 8, mode: str = "restart", seeds: list[int] | None = None,
        median: int = 16, max_len: int = 256) -> dict:
    seeds = seeds or [42]
    res: dict = {"stack": stack(), "size": size, "steps": steps, "prompts": prompts, "mode": mode, "seeds": seeds,
                 "median": median, "max_len": max_len, "runs": {v: [] for v in VARIANTS},
                 "topology": f"vLLM server on core {train_runs.SERVER_CORE}, trainer on core {train_runs.TRAINER_CORE}"}
    with scratch("grpo-bench-async-") as tmp:
        model = build_model(tmp / f"qwen2-{size}", **MODEL_SIZES[size])
        data = build_digit_task(tmp / "digits.jsonl")
        os.environ[ENV] = json.dumps({"marker": prompt_marker(model, data), "eos": _eos(model), "median": median,
                                      "alpha": 1.5})
        server_args = ["--logits-processors", "grpo_plugin.bench.tail_lengths:TailLengths",
                       "--logprobs-mode", "raw_logprobs"]
        for seed in seeds:
            port = free_port()
            cfg0 = _variant_config(mode, model, data, tmp / f"server-{seed}", steps, max_len, port, prompts, seed,
                                   "sync")
            with train_runs.pinned_server(cfg0, tmp / f"vllm-{seed}.log", extra_args=server_args):
                for variant in VARIANTS:
                    cfg = _variant_config(mode, model, data, tmp / f"{variant}-{seed}", steps, max_len, port,
                                          prompts, seed, variant)
                    print(f"[bench async] seed {seed} {variant} ...", file=sys.stderr, flush=True)
                    trained = train_runs.train(cfg, {train_runs.TRAINER_CORE}, 1, tmp / f"{variant}-{seed}.log")
                    trained["steps"] = steps
                    res["runs"][variant].append(_figures(cfg, trained))
    per = {v: statistics.median(r["tokens_per_s"] for r in runs) for v, runs in res["runs"].items()}
    res["tokens_per_s"] = per
    res["speedup_vs_prefetch"] = round(per["streaming"] / per["prefetch"], 3)
    res["speedup_vs_sync"] = round(per["streaming"] / per["sync"], 3)
    budget = min(r["trained_tokens"] for runs in res["runs"].values() for r in runs)
    res["reward_at_equal_tokens"] = {"tokens": budget, **{
        v: _spread([reward_at(r["curve"], budget) for r in runs]) for v, runs in res["runs"].items()}}
    res["all_verified"] = all(r["all_syncs_verified"] for runs in res["runs"].values() for r in runs)
    for runs in res["runs"].values():
        for r in runs:
            r.pop("curve")
    return res


def _eos(model_dir: Path) -> int:
    return json.loads((model_dir / "config.json").read_text())["eos_token_id"]


def _spread(values: list[float | None]) -> dict:
    got = [v for v in values if v is not None]
    return {"mean": round(statistics.mean(got), 4) if got else None,
            "stdev": round(statistics.stdev(got), 4) if len(got) > 1 else None, "runs": got}


def report(res: dict) -> None:
    lines = [f"async: {res['steps']} steps of `axolotl train` per run, {res['mode']}, model {res['size']}, "
             f"{res['prompts']} prompts x 8 completions, lengths Lomax median {res['median']} (cap {res['max_len']}), "
             f"seeds {res['seeds']}; {res['topology']}", stack_line(res["stack"]),
             f"  {'variant':<10} {'tokens/s':>9} {'steps/s':>8} {'reward last 20%':>16} {'gain/min':>9} "
             f"{'continued':>10} {'regen/drop':>11} {'waited':>7} {'verified':>9}  lag histogram"]
    for v, runs in res["runs"].items():
        for r in runs:
            lines.append(f"  {v:<10} {r['tokens_per_s']:>9.1f} {r['steps_per_s']:>8.3f} {r['reward_last20pct']:>16.3f} "
                         f"{r['reward_gain_per_min']:>9.3f} {r['stream_continued']:>10} "
                         f"{r['stream_regenerated']:>5}/{r['stream_dropped']:<5} {r['trainer_wait_s']:>6.1f}s "
                         f"{r['all_syncs_verified']!s:>9}  "
                         f"{r['lag_unit']}: {r['lag_hist']}")
    lines.append(f"  speedup_vs_prefetch {res['speedup_vs_prefetch']:.2f}x (goal >= 1.5), speedup_vs_sync "
                 f"{res['speedup_vs_sync']:.2f}x (goal >= 2), trained tokens per second; every push verified: "
                 f"{res['all_verified']}")
    eq = res["reward_at_equal_tokens"]
    lines.append(f"  reward once {eq['tokens']} tokens were trained: " + ", ".join(
        f"{v} {eq[v]['mean']}" + (f" ± {eq[v]['stdev']}" if eq[v]["stdev"] is not None else "") for v in VARIANTS))
    print("\n".join(lines))
