"""The code agent (rewards/code_agent.py) in the tool-calling loop, on the real sandbox: the model's turns scripted
(tests/unit/test_tool_loop.py's stand-in), every `run_tests` call executed in the sandbox. What the model reads
holds the example tests' verdicts only: a program that looks for the hidden tests everywhere it can (its own
process, the environment, the dataset file, the parent's memory) finds none of them, and the reward is the hidden
tests' verdict on the last program the model ran."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from grpo_plugin.agents.environments import EnvironmentSet, reward_function
from grpo_plugin.demo.tiny import build_tokenizer
from grpo_plugin.producers.agent_output import COMPLETIONS_KEY, ENVIRONMENTS_KEY
from rewards import code_agent_transform
from rewards.code_agent import CodeAgent
from tests.unit.test_tool_loop import Script, loop, trainer

HIDDEN = ["assert add(123456789, 1) == 123456790", "assert add(-7, 7) == 0"]
VISIBLE = ["assert add(1, 2) == 3"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def call(code: str) -> str:
    return ("<tool_call>\n" + json.dumps({"name": "run_tests", "arguments": {"code": code}}) + "\n</tool_call>"
            "<|im_end|>")


@pytest.fixture()
def row(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"instruction": "Write add(a, b).", "test_cases": VISIBLE + HIDDEN}) + "\n")
    transform, _ = code_agent_transform()
    out = transform(json.loads(data.read_text()))
    return {**out, "_file": str(data)}


def test_the_transform_shows_the_examples_and_keeps_the_rest_hidden(row):
    assert json.loads(row["visible_tests"]) == VISIBLE and json.loads(row["hidden_tests"]) == HIDDEN
    shown = json.dumps(row["prompt"])
    assert VISIBLE[0] in shown and not any(h in shown for h in HIDDEN)


def test_the_model_runs_a_wrong_program_reads_why_fixes_it_and_is_rewarded_on_the_hidden_tests(tok, row):
    wrong, right = "def add(a, b):\n    return a - b\n", "def add(a, b):\n    return a + b\n"
    script = Script(tok, [[call(wrong), call(right), "```python\n" + right + "```<|im_end|>"]])
    row = {k: v for k, v in row.items() if k != "_file"}
    out = loop(environments=EnvironmentSet({None: CodeAgent}, []), max_completion_length=2048, tool_timeout=60)(
        [row["prompt"]], trainer(tok, script), [row])
    replies = [m["content"] for m in out[COMPLETIONS_KEY][0] if m["role"] == "tool"]
    assert replies[0].startswith("0 of 1 example tests passed.") and VISIBLE[0] in replies[0]
    assert "AssertionError" in replies[0]
    assert replies[1] == "1 of 1 example tests passed."
    assert out["tool_calls"] == [2] and out["turns"] == [3]
    # the last program run, on the hidden tests, when the rollout is scored (its own instance, held until then)
    assert reward_function(CodeAgent)(environments=out[ENVIRONMENTS_KEY].instances) == [1.0]


def test_a_program_that_looks_for_the_hidden_tests_finds_none(tok, row):
    snoop = f"""
import gc, os, sys
found, tried = [], 0
def look(what, f):
    global tried
    tried += 1
    try:
        text = f()
    except BaseException:
        return
    text = text.decode('latin-1') if isinstance(text, bytes) else str(text)
    if '1234' + '56789' in text or 'add(' + '-7' in text:
        found.append(what)
look('globals', lambda: globals())
look('environ', lambda: dict(os.environ))
look('argv', lambda: sys.argv)
look('objects', lambda: [o for o in gc.get_objects() if isinstance(o, str)])
look('dataset', lambda: open({row['_file']!r}).read())
look('parent cmdline', lambda: open('/proc/%d/cmdline' % os.getppid(), 'rb').read())
look('parent environ', lambda: open('/proc/%d/environ' % os.getppid(), 'rb').read())
look('parent memory', lambda: open('/proc/%d/mem' % os.getppid(), 'rb').read())
look('cwd', lambda: [open(n, 'rb').read() for n in os.listdir('.')])
look('tmp', lambda: [open('/tmp/' + n, 'rb').read() for n in os.listdir('/tmp')])
sys.stderr.write('FOUND in ' + ', '.join(found) if found else 'searched %d places' % tried)
def add(a, b):
    return a + b
"""
    script = Script(tok, [[call(snoop), "done<|im_end|>"]])
    row = {k: v for k, v in row.items() if k != "_file"}
    out = loop(environments=EnvironmentSet({None: CodeAgent}, []), max_completion_length=4096, tool_timeout=60)(
        [row["prompt"]], trainer(tok, script), [row])
    reply = [m["content"] for m in out[COMPLETIONS_KEY][0] if m["role"] == "tool"][0]
    assert reply.startswith("1 of 1 example tests passed.") and "searched 10 places" in reply, reply
    tools_said = json.dumps([m for m in out[COMPLETIONS_KEY][0] if m["role"] == "tool"])
    for hidden in HIDDEN:  # not in anything a tool said (the program's own text is the model's)
        assert hidden not in tools_said and "123456789" not in tools_said
    assert reward_function(CodeAgent)(environments=out[ENVIRONMENTS_KEY].instances) == [1.0]
    # the search itself works: run outside the sandbox, the same program finds the dataset's hidden tests
    plain = subprocess.run([sys.executable, "-c", snoop], capture_output=True, text=True, timeout=60)
    assert "FOUND in " in plain.stderr and "dataset" in plain.stderr, plain.stderr[-2000:]


def test_no_program_no_reward_and_unparsable_code_is_said(tok):
    agent = CodeAgent()
    agent.reset(visible_tests=json.dumps(VISIBLE), hidden_tests=json.dumps(HIDDEN))
    assert agent.get_reward() == 0.0
    assert agent.run_tests("def add(a, b) return") == "The program is not valid Python (it does not parse)."
    assert agent.get_reward() == 0.0


def test_the_tiny_code_tasks_prompt_and_replies_are_what_the_transform_and_the_tool_make(tmp_path):
    """The warm start (grpo_plugin/demo/tools.py) teaches the format on the prompt and tool replies the CPU code
    agent will meet: the transform's prompt for its rows, the sandbox's replies to its two programs."""
    from grpo_plugin.demo import tools

    transform, _ = code_agent_transform()
    rows = tools.build_code_agent_task(tmp_path / "code_agent.jsonl", n=1).read_text().splitlines()
    row = transform(json.loads(rows[0]))
    assert row["prompt"] == [{"role": "system", "content": tools.CODE_SYSTEM},
                             {"role": "user", "content": tools.CODE_PROMPT}]
    agent = CodeAgent()
    agent.reset(**{k: v for k, v in row.items() if k != "prompt"})
    for code, said in tools.REPLIES.items():
        assert agent.run_tests(code) == said
    assert agent.get_reward() == 0.0  # the last program run was the wrong one
