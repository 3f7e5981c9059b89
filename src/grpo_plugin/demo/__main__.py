"""`python -m grpo_plugin.demo --out demo`: the tiny model (<out>/tiny-<family>) and the digit task
(<out>/data/digits.jsonl) for the quickstarts; `--tool-warm-start` also the tool-calling demos' model and data."""

from __future__ import annotations

import argparse
from pathlib import Path

from grpo_plugin.demo import tiny, tools


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m grpo_plugin.demo", description=tiny.__doc__)
    ap.add_argument("--out", default="demo",
                    help="output directory (model in <out>/tiny-<family>, data in <out>/data)")
    ap.add_argument("--family", choices=sorted(tiny.FAMILIES), default="qwen2",
                    help="architecture (default: qwen2); see the module docstring for what each switches on")
    ap.add_argument("--untied", action="store_true", help="untied lm_head (default: the family's)")
    ap.add_argument("--size", choices=sorted(tiny.MODEL_SIZES), default="tiny", help="model shape (default: tiny)")
    ap.add_argument("--tool-warm-start", action="store_true",
                    help="also write <out>/tiny-<family>-tools (taught the tool-call format) and "
                    "<out>/data/lookup.jsonl, code_agent.jsonl, for the tool-calling demos (docs/agents.md)")
    args = ap.parse_args(argv)
    name = f"tiny-{args.family}" if args.size == "tiny" else f"{args.family}-{args.size}"
    model_dir = tiny.build_model(Path(args.out) / name, family=args.family,
                                 tie_word_embeddings=False if args.untied else None, **tiny.MODEL_SIZES[args.size])
    data = tiny.build_digit_task(Path(args.out) / "data" / "digits.jsonl")
    print(f"tiny model: {model_dir}\ntask data:  {data}")
    if args.tool_warm_start:
        tools_dir = tools.warm_start_tools(model_dir, Path(args.out) / f"{name}-tools")
        data_dir = Path(args.out) / "data"
        print(f"tool model: {tools_dir}\ntool data:  {tools.build_tool_task(data_dir / 'lookup.jsonl')}, "
              f"{tools.build_code_agent_task(data_dir / 'code_agent.jsonl')}")


if __name__ == "__main__":
    main()
