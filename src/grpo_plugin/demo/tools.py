"""The tool-calling demos' tiny model and data (`python -m grpo_plugin.demo --tool-warm-start`, docs/agents.md):
the tiny model taught the tool-call format by a short supervised run, and the tasks' prompts.

- lookup (rewards/toy_tools.py): "key <letters>"; the model may call `lookup()` and answer with its digit;
- code agent (rewards/code_agent.py, on the tiny scale): the task "f(x) = x + 1"; the model calls
  `run_tests(code)` with a program, reads the sandbox's verdict on the example test, and says it is done.

The warm start teaches the formats, not the tasks: half the lookup examples call the tool, half answer at once; the
code examples call `run_tests` with the right program or a wrong one, half and half. What pays is left to GRPO.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

TOOL_CALL = '<tool_call>\n{"name": "lookup", "arguments": {}}\n</tool_call>'
CODE_TASK, CODE_SYSTEM = "f(x) = x + 1", "Use run_tests."
CODE_TESTS = ["assert f(1) == 2", "assert f(2) == 3", "assert f(5) == 6"]  # the first shown, the rest hidden
# the user turn rewards.code_agent_transform makes of such a row (the first test shown)
CODE_PROMPT = f"{CODE_TASK}\n\nExample tests:\n{CODE_TESTS[0]}"
RIGHT, WRONG = "def f(x):\n    return x + 1\n", "def f(x):\n    return x - 1\n"
# what CodeAgent.run_tests answers for each (rewards/code_agent.py)
REPLIES = {RIGHT: "1 of 1 example tests passed.",
           WRONG: "0 of 1 example tests passed.\nFirst failing test: assert f(1) == 2\nResult: AssertionError"}


def run_tests_call(code: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "run_tests", "arguments": {"code": code}}) + "\n</tool_call>"


def build_tool_task(out_file: str | Path, n: int = 512, seed: int = 1) -> Path:
    """The lookup demo's prompts: chat prompts "key <letters>"."""
    rng = random.Random(seed)
    out = Path(out_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for _ in range(n):
            key = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 6)))
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"key {key}"}]}) + "\n")
    return out


def build_code_agent_task(out_file: str | Path, n: int = 64) -> Path:
    """The tiny code agent's rows, in the code dataset format (`type: rewards.code_agent_transform`)."""
    out = Path(out_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps({"instruction": CODE_TASK, "test_cases": CODE_TESTS, "system": CODE_SYSTEM})
                           + "\n" for _ in range(n)))
    return out


def _schemas():
    def lookup() -> str:
        """Look up the number to answer with.

        Returns:
            One digit.
        """
        return "0"

    def run_tests(code: str) -> str:
        """Run a Python program against the task's example tests, in a sandbox.

        Args:
            code: The complete Python program.
        """
        return ""

    return lookup, run_tests


def warm_start_tools(model_dir: str | Path, out_dir: str | Path, *, steps: int = 200, seed: int = 0) -> Path:
    """A copy of the tiny model taught the tool-call formats (deterministic). Only the model's tokens are trained
    (tool results are not)."""
    import torch  # here: `python -m grpo_plugin.demo --help` stays light
    from transformers import AutoModelForCausalLM, AutoTokenizer

    lookup, run_tests = _schemas()
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    rng = random.Random(seed)
    torch.manual_seed(seed)

    def ids(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    def prompt(messages: list[dict], tools: list) -> list[int]:
        return list(tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True,
                                            return_dict=False))

    def reply(text: str) -> list[int]:  # the tool result as the loop appends it (agents/chat_format.py)
        return ids(f"\n<|im_start|>tool\n{text}<|im_end|>\n<|im_start|>assistant\n")

    def example() -> tuple[list[int], list[int]]:
        """(tokens, labels): a lookup example or a code one; -100 on what the model does not write."""
        parts: list[tuple[list[int], bool]]  # (tokens, trained)
        if rng.random() < 0.5:
            key = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 6)))
            head = prompt([{"role": "user", "content": f"key {key}"}], [lookup])
            digit = str(rng.randrange(10))
            parts = [(head, False)]
            if rng.random() < 0.5:
                parts += [(ids(TOOL_CALL + "<|im_end|>"), True), (reply(digit), False)]
            parts.append((ids(f"{digit}<|im_end|>"), True))
        else:
            tools = [lookup, run_tests] if rng.random() < 0.5 else [run_tests]
            head = prompt([{"role": "system", "content": CODE_SYSTEM}, {"role": "user", "content": CODE_PROMPT}],
                          tools)
            code = RIGHT if rng.random() < 0.5 else WRONG
            parts = [(head, False), (ids(run_tests_call(code) + "<|im_end|>"), True), (reply(REPLIES[code]), False),
                     (ids("done<|im_end|>"), True)]
        seq = [t for p, _ in parts for t in p]
        labels = [t if trained else -100 for p, trained in parts for t in p]
        return seq, labels

    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        rows = [example() for _ in range(16)]
        width = max(len(s) for s, _ in rows)
        input_ids = torch.tensor([s + [tok.pad_token_id] * (width - len(s)) for s, _ in rows])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
        attention = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s, _ in rows])
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    out = Path(out_dir)
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    config = Path(model_dir) / "generation_config.json"
    if config.exists():
        (out / config.name).write_text(config.read_text())
    return out
