"""The CPU demo's two-turn agent (rewards/toy_agent.py) stopping once between its two turns, so that a test can kill
the vLLM server in the middle of a rollout (tests only).

At its call number N, where `<output_dir>/pause_at_call` holds N, the function writes `<output_dir>/between_turns`
after the first turn and waits for `<output_dir>/go_on` before the second. Every call appends its number to
`<output_dir>/agent_calls`."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from rewards.toy_agent import TURN_TOKENS, rollouts

_calls = 0
_lock = threading.Lock()


def two_turns_paused_once(prompts: list, trainer) -> dict:
    global _calls
    with _lock:
        _calls += 1
        call = _calls
    out = Path(trainer.args.output_dir)
    with (out / "agent_calls").open("a") as fh:
        fh.write(f"{call}\n")
    pause = out / "pause_at_call"
    pause_here = pause.exists() and int(pause.read_text()) == call
    gen, turns = trainer.grpo_generation, []

    def turn(prompt_ids, n):
        if turns and pause_here:
            (out / "between_turns").write_text(str(call))
            deadline = time.monotonic() + 300
            while not (out / "go_on").exists():
                if time.monotonic() > deadline:
                    raise TimeoutError("the test never wrote go_on")
                time.sleep(0.05)
        turns.append(n)
        return [(c.token_ids, c.logprobs) for g in gen.generate(prompt_ids, n=n, max_tokens=TURN_TOKENS) for c in g]

    return rollouts(prompts, trainer, turn)
