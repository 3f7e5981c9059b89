"""Benchmarks that print figures (never timed tests), one module each, every one against the real alternative in
ONE run on the same machine:

    python -m grpo_plugin.bench sync --mode lora_sync [--model DIR] [--repeats 30] [--json]     (bench/lora.py)
    python -m grpo_plugin.bench sync --mode restart [--sizes tiny,100m] [--repeats 20] [--json] (bench/restart.py)
    python -m grpo_plugin.bench sync --transport [both|shared|network] [--sizes tiny,100m,0.5b] [--repeats 5]
                                     [--link loopback|veth] [--delta-lrs 1e-6,1e-5] [--delta-only]
                                                                               (bench/transport.py)
    python -m grpo_plugin.bench ipc [--sizes tiny,100m] [--repeats 20] [--eager-only] [--json]  (bench/ipc.py)
    python -m grpo_plugin.bench ipc --cuda [--shape 1.5b|7b] [--steps 3] [--json]           (bench/ipc_cuda.py)
    python -m grpo_plugin.bench atropos [--shapes quickstart,gsm8k,long] [--spool DIR] [--json] (bench/atropos.py)
    python -m grpo_plugin.bench e2e [--size 100m] [--steps 20] [--prompts 2] [--modes lora_sync,restart,ipc]
                                    [--seed N] [--no-stock] [--json]
                                                                                               (bench/e2e.py)
    python -m grpo_plugin.bench code [--problems 16] [--group 8] [--json]                       (bench/code.py)
    python -m grpo_plugin.bench qlora [--size 100m] [--steps 3] [--json]                        (bench/qlora.py)
    python -m grpo_plugin.bench servers [--size 100m] [--repeats 10] [--json]                   (bench/servers.py)
    python -m grpo_plugin.bench zero3 [--size 100m] [--repeats 10] [--json]                     (bench/zero3.py)
    python -m grpo_plugin.bench zero3 --cuda [--size 100m] [--json]                         (bench/zero3_cuda.py)
    python -m grpo_plugin.bench async [--size 100m] [--steps 20] [--prompts 8] [--mode restart] [--seeds 42]
                                      [--median 16] [--max-len 256] [--json]                  (bench/async_tail.py)
    python -m grpo_plugin.bench agent [--size tiny] [--prompts 4] [--group 8] [--turn-tokens 16]
                                      [--prompt-tokens 0] [--block-size N] [--rounds 7] [--json]
                                                                                               (bench/agent.py)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys


def _count(least: int):
    """An argparse type: an int >= `least` (a median of no runs is no figure)."""
    def parse(text: str) -> int:
        value = int(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"{value}: at least {least}")
        return value
    return parse


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m grpo_plugin.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sync", help="sync pause: ours vs axolotl's built-in")
    s.add_argument("--mode", default="lora_sync", choices=["lora_sync", "restart"])
    s.add_argument("--model", default=None, help="lora_sync: model dir (default: build the tiny model)")
    s.add_argument("--sizes", default="tiny,100m", help="restart: model sizes to build (tiny, 100m)")
    s.add_argument("--process-repeats", type=_count(0), default=3,
                   help="restart: process restarts per model (0: leave them out, ~10-25 s each)")
    s.add_argument("--axolotl-repeats", type=_count(1), default=2, help="restart: axolotl HTTP syncs per model")
    s.add_argument("--repeats", type=_count(1), default=30, help="pushes per measured sync (restart: reloads)")
    s.add_argument("--lora-r", type=int, default=16)
    s.add_argument("--port", type=int, default=None)
    s.add_argument("--transport", nargs="?", const="both", default=None, choices=["both", "shared", "network"],
                   help="instead: the files of a push read from the sync directory (shared) vs sent over HTTP "
                   "(network), adapter and full weights, on --sizes (bench/transport.py)")
    s.add_argument("--link", default="loopback", choices=["loopback", "veth"],
                   help="--transport: reach the server over the loopback, or over a veth pair into a network "
                   "namespace of its own (root; bench/netns.py)")
    s.add_argument("--delta-lrs", default="1e-6,1e-5",
                   help="--transport: delta pushes of bf16 weights after real AdamW steps at these learning rates, "
                   "beside full pushes of the same weights ('': none)")
    s.add_argument("--delta-only", action="store_true", help="--transport: only the delta entry")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    i = sub.add_parser("ipc", help="ipc vs restart vs lora_sync: sync pause, memory (PSS), decode throughput")
    i.add_argument("--sizes", default="tiny,100m", help="model sizes to build (tiny, 100m)")
    i.add_argument("--repeats", type=_count(1), default=20, help="syncs per mode and model")
    i.add_argument("--eager-only", action="store_true", help="skip the torch.compile'd servers")
    i.add_argument("--cuda", action="store_true", help="ipc on CUDA: export/attach with a torch-only server process")
    i.add_argument("--shape", default="1.5b", help="--cuda: model shape (tiny, 1.5b, 7b)")
    i.add_argument("--steps", type=int, default=3, help="--cuda: AdamW steps, each checked bit for bit")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    a = sub.add_parser("atropos", help="Atropos batch -> tensors: ours vs the Atropos example trainer")
    a.add_argument("--shapes", default="quickstart,gsm8k,long", help="synthetic batch shapes")
    a.add_argument("--repeats", type=_count(1), default=5)
    a.add_argument("--spool", default=None, help="also time the batches recorded in this atropos_spool dir")
    a.add_argument("--json", action="store_true", help="print one JSON object")
    e = sub.add_parser("e2e", help="axolotl train steps/s per mode, sync vs async_prefetch, vs stock HF generation")
    e.add_argument("--size", default="100m", help="model size to build (tiny, 100m)")
    e.add_argument("--steps", type=int, default=20, help="optimizer steps per run")
    e.add_argument("--prompts", type=int, default=2, help="prompts per step (x trl.num_generations completions)")
    e.add_argument("--modes", default="lora_sync,restart,ipc")
    e.add_argument("--completion-len", type=int, default=32, help="trl.max_completion_length")
    e.add_argument("--seed", type=int, default=None, help="seed of every run (trainer and server sampling)")
    e.add_argument("--no-stock", action="store_true", help="skip axolotl's stock GRPO runs (e.g. for a seed study)")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    c = sub.add_parser("code", help="code reward: the sandbox vs a python process per completion, same batch")
    c.add_argument("--problems", type=int, default=16, help="HumanEval problems in the batch")
    c.add_argument("--group", type=int, default=8, help="completions per problem")
    c.add_argument("--rounds", type=_count(1), default=5, help="rounds per side (median, alternated)")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    q = sub.add_parser("qlora", help="quantized bases: trainer memory 16/8/4-bit; probe vs the served base")
    q.add_argument("--size", default="100m", help="model size to build (tiny, 100m)")
    q.add_argument("--steps", type=int, default=3, help="AdamW steps per memory run")
    q.add_argument("--json", action="store_true", help="print one JSON object")
    v = sub.add_parser("servers", help="2 vLLM servers vs 1: sync pause per mode; ipc memory with one shared file")
    v.add_argument("--size", default="100m", help="model size to build (tiny, 100m)")
    v.add_argument("--repeats", type=_count(1), default=10, help="pushes per sync")
    v.add_argument("--json", action="store_true", help="print one JSON object")
    z = sub.add_parser("zero3", help="restart push under DeepSpeed ZeRO-3 (2 CPU ranks: gather + push) vs unsharded")
    z.add_argument("--size", default="100m", help="model size to build (tiny, 100m)")
    z.add_argument("--repeats", type=_count(1), default=10, help="pushes per trainer layout")
    z.add_argument("--cuda", action="store_true", help="one CUDA rank: gather exactness and time (no server)")
    z.add_argument("--json", action="store_true", help="print one JSON object")
    a = sub.add_parser("async", help="long-tailed rollouts: sync vs async_prefetch vs streaming + in-flight updates")
    a.add_argument("--size", default="100m", help="model size to build (tiny, 100m)")
    a.add_argument("--steps", type=_count(2), default=20)
    a.add_argument("--prompts", type=_count(1), default=8, help="prompts per step (x 8 completions)")
    a.add_argument("--mode", default="restart", choices=["lora_sync", "restart", "ipc"])
    a.add_argument("--seeds", default="42", help="comma-separated: one run of each variant per seed")
    a.add_argument("--median", type=_count(1), default=16, help="median completion length (tokens)")
    a.add_argument("--max-len", type=_count(2), default=256, help="trl.max_completion_length (the tail's cap)")
    a.add_argument("--json", action="store_true", help="print one JSON object")
    g = sub.add_parser("agent", help="trl.rollout_func's two-turn path vs single-turn generation, per model token")
    g.add_argument("--size", default="tiny", help="model size to build (tiny, 100m)")
    g.add_argument("--prompts", type=_count(1), default=4, help="prompts per batch (at most 8)")
    g.add_argument("--group", type=_count(1), default=8, help="completions per prompt")
    g.add_argument("--turn-tokens", type=_count(1), default=16, help="model tokens per turn")
    g.add_argument("--prompt-tokens", type=_count(0), default=0, help="lead each prompt with a shared preamble")
    g.add_argument("--block-size", type=_count(1), default=None, help="the server's KV block size (vLLM's default)")
    g.add_argument("--rounds", type=_count(1), default=7, help="rounds per side (median, alternated)")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    bench = _module(args)
    # libraries print banners on stdout when imported (deepspeed's accelerator line): stdout is the report's
    with contextlib.redirect_stdout(sys.stderr):
        out = _run(bench, args)
    if args.json:
        print(json.dumps(out))
    else:
        bench.report(out)
    sys.stdout.flush()


def _module(args):
    name = args.cmd if args.cmd != "sync" else ("restart" if args.mode == "restart" else "lora")
    name = "async_tail" if name == "async" else name
    if args.cmd == "sync" and args.transport:
        name = "transport"
    if args.cmd in ("ipc", "zero3") and args.cuda:
        name = f"{args.cmd}_cuda"
    return importlib.import_module(f"grpo_plugin.bench.{name}")


def _run(bench, args) -> dict:
    if args.cmd == "code":
        return bench.run(args.problems, args.group, args.rounds)
    if args.cmd == "async":
        return bench.run(args.size, args.steps, args.prompts, args.mode, [int(x) for x in args.seeds.split(",") if x],
                         args.median, args.max_len)
    if args.cmd == "agent":
        return bench.run(args.size, args.prompts, args.group, args.turn_tokens, args.rounds, args.prompt_tokens,
                         args.block_size)
    if args.cmd == "qlora":
        return bench.run(args.size, args.steps)
    if args.cmd == "zero3" and args.cuda:
        return bench.run(args.size)
    if args.cmd in ("servers", "zero3"):
        return bench.run(args.size, args.repeats)
    if args.cmd == "e2e":
        return bench.run(args.size, args.steps, [x for x in args.modes.split(",") if x], args.completion_len,
                         args.prompts, args.seed, stock=not args.no_stock)
    if args.cmd == "atropos":
        return bench.run([x for x in args.shapes.split(",") if x], args.repeats, args.spool)
    if args.cmd == "ipc" and args.cuda:
        return bench.run(args.shape, args.steps)
    if args.cmd == "ipc":
        return bench.run([x for x in args.sizes.split(",") if x], args.repeats, compiled=not args.eager_only)
    if args.transport:
        sides = list(bench.SIDES) if args.transport == "both" else [args.transport]
        return bench.run([x for x in args.sizes.split(",") if x], args.repeats, sides, args.link,
                         [float(x) for x in args.delta_lrs.split(",") if x], args.delta_only)
    if args.mode == "restart":
        return bench.run([x for x in args.sizes.split(",") if x], args.repeats, args.process_repeats,
                         args.axolotl_repeats, args.port)
    return bench.run(args.mode, args.model, args.repeats, args.lora_r, args.port)


if __name__ == "__main__":
    main()
