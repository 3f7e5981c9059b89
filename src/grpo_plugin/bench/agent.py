"""The multi-turn rollout path's cost per model token against single-turn generation of the same token count, in one
run on one vLLM-CPU server:

    python -m grpo_plugin.bench agent [--size tiny] [--prompts 4] [--group 8] [--turn-tokens 16] [--prompt-tokens 0]
                                      [--rounds 7] [--json]

- Single turn (what a run without an agent does: producers/local.py): `--prompts` prompts x `--group` completions
  of 2 x `--turn-tokens` tokens each, one request (`n = group`), then the rollout's tensors
  (completion_tensors.rollout_tensors).
- Two turns (the agent path: producers/agent.py, as rewards/toy_agent.py generates): the same rows, a first turn
  of `--turn-tokens` tokens through the plugin's handle (`AgentGeneration.generate`, `n = group` per prompt), an
  8-token environment reply, a second turn of `--turn-tokens` per row seeing the first and the reply; then the
  output check and the tensors with the env mask (agent_output.check_output, AgentRolloutProducer's
  tensorisation). `--prompt-tokens N` leads every prompt with a shared preamble to ~N tokens: the second turn's
  context then starts with blocks the server's prefix cache holds (vLLM caches whole KV blocks: 128 tokens by default
  on vLLM-CPU; `--block-size N` starts the server with another size).

Both sides produce the same number of model tokens (vLLM's `min_tokens` = `max_tokens`, EOS ignored). Figure: wall
time per model token, median over `--rounds` rounds each, the sides alternated (ABAB, the first of each pair
swapped every round); `ratio` = two turns / single turn (goal <= 1.2).
"""

from __future__ import annotations

import statistics
import time
from types import SimpleNamespace

from grpo_plugin.bench.common import free_port, scratch, stack, stack_line
from grpo_plugin.demo.tiny import MODEL_SIZES, build_model
from grpo_plugin.producers.agent_output import check_output
from grpo_plugin.server.process import ServerSpec, launch

REPLY = 8  # the environment's reply, tokens


def _prompts(tok, n: int, length: int) -> list[list[int]]:
    """`n` distinct prompts; with `length`, each led by a shared preamble to about that many tokens (a system prompt:
    what makes the server's prefix cache matter)."""
    words = ("qzkf", "abc", "hello", "xyzzy", "mnop", "rst", "uvw", "kl")[:n]
    preamble = ("You are a careful assistant. " * 64)[: max(0, length - 8)]
    return [tok(f"{preamble}{w} = ", add_special_tokens=False)["input_ids"] for w in words]


def _single(client, model: str, prompts, group: int, tokens: int, pad: int):
    from grpo_plugin.producers.completion_tensors import rollout_tensors  # heavy (torch, trl)

    fixed = {"max_tokens": tokens, "temperature": 1.0, "extra": {"min_tokens": tokens, "ignore_eos": True}}
    groups = client.generate(prompts, model=model, n=group, **fixed)
    rows = [c for g in groups for c in g]
    rollout_tensors([p for p in prompts for _ in range(group)], [c.token_ids for c in rows],
                    [c.logprobs for c in rows], pad_token_id=pad)
    return sum(len(c.token_ids) for c in rows)


def _two_turns(client, model: str, prompts, group: int, tokens: int, pad: int):
    from grpo_plugin.producers.agent import AgentGeneration, AgentRolloutProducer  # heavy (axolotl, vLLM)

    fixed = {"max_tokens": tokens, "temperature": 1.0, "extra": {"min_tokens": tokens, "ignore_eos": True}}
    gen = AgentGeneration(client, fixed, lease=SimpleNamespace(model=model, version=0))
    rows = [p for p in prompts for _ in range(group)]
    reply = list(range(40, 40 + REPLY))
    first = [c for g in gen.generate(prompts, n=group) for c in g]  # a group's first turns share their prompt
    second = [g[0] for g in gen.generate([p + a.token_ids + reply for p, a in zip(rows, first)], n=1)]
    out = {"prompt_ids": rows, "completion_ids": [a.token_ids + reply + b.token_ids for a, b in zip(first, second)],
           "logprobs": [a.logprobs + [0.0] * REPLY + b.logprobs for a, b in zip(first, second)],
           "env_mask": [[1] * len(a.token_ids) + [0] * REPLY + [1] * len(b.token_ids) for a, b in zip(first, second)]}
    checked = check_output(out, ["p"] * len(rows), group, 10 ** 6)
    producer = object.__new__(AgentRolloutProducer)
    producer.spec = SimpleNamespace(pad_token_id=pad, stop_token_ids=(), mask_truncated=False, device="cpu")
    producer._tensors(checked, [{} for _ in rows])
    return sum(sum(m) for m in checked.env_mask)


def run(size: str, prompts: int, group: int, turn_tokens: int, rounds: int, prompt_tokens: int = 0,
        block_size: int | None = None) -> dict:
    from transformers import AutoTokenizer  # heavy: loaded only when this benchmark runs

    with scratch("grpo-bench-agent-") as tmp:
        model_dir = build_model(tmp / f"model-{size}", **MODEL_SIZES[size])
        tok = AutoTokenizer.from_pretrained(str(model_dir))
        spec = ServerSpec(model=str(model_dir), port=free_port(), dtype="float32", max_model_len=512,
                          enforce_eager=True, enable_lora=False,
                          extra_args=["--block-size", str(block_size)] if block_size else [])
        server, client = launch(spec, tmp / "server.log")
        try:
            model, ps = client.models()[0], _prompts(tok, prompts, prompt_tokens)
            pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
            sides = {"single_turn": lambda: _single(client, model, ps, group, 2 * turn_tokens, pad),
                     "two_turns": lambda: _two_turns(client, model, ps, group, turn_tokens, pad)}
            for f in sides.values():  # warm-up (untimed)
                f()
            per_token: dict[str, list[float]] = {k: [] for k in sides}
            for r in range(rounds):
                order = list(sides) if r % 2 == 0 else list(reversed(sides))
                for name in order:
                    t0 = time.perf_counter()
                    n = sides[name]()
                    per_token[name].append((time.perf_counter() - t0) / n * 1e6)
        finally:
            server.stop()
    med = {k: statistics.median(v) for k, v in per_token.items()}
    return {"size": size, "rows": prompts * group, "model_tokens_per_row": 2 * turn_tokens, "rounds": rounds,
            "prompt_tokens": len(ps[0]), "block_size": block_size,
            "us_per_model_token": {k: round(v, 2) for k, v in med.items()},
            "runs_us_per_model_token": {k: [round(x, 2) for x in v] for k, v in per_token.items()},
            "ratio": round(med["two_turns"] / med["single_turn"], 3), "stack": stack()}


def report(out: dict) -> None:
    print(f"multi-turn rollout path vs single turn ({out['rows']} rows x {out['model_tokens_per_row']} model tokens, "
          f"prompts of {out['prompt_tokens']} tokens, model {out['size']}, KV block size "
          f"{out['block_size'] or 'vLLM default'}, median of {out['rounds']} alternated rounds)")
    for name, us in out["us_per_model_token"].items():
        print(f"  {name:12s} {us:8.1f} us per model token   runs {out['runs_us_per_model_token'][name]}")
    print(f"  ratio two turns / single turn: {out['ratio']:.3f}  (goal <= 1.2)")
    print(stack_line(out["stack"]))
