"""The tool-calling loop (agents/): the tiny model's real tokenizer, chat template and response parser; the model's
turns scripted (a stand-in for the generation handle that answers each context with the next scripted turn), so
each way a rollout goes (a call, a raising tool, a hanging one, a malformed call, the budget, an environment) can
be set up exactly. The loop on the real server, training: tests/e2e/test_agent_train.py."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from grpo_plugin.agents.chat_format import MALFORMED, parse_turn, tool_suffix_ids
from grpo_plugin.agents.environments import EnvironmentSet, reward_function
from grpo_plugin.agents.tool_loop import ToolLoop
from grpo_plugin.demo.tiny import build_tokenizer
from grpo_plugin.demo.tools import TOOL_CALL
from grpo_plugin.producers.agent_output import (
    COMPLETIONS_KEY,
    ENVIRONMENTS_KEY,
    METRICS_KEY,
    PROMPTS_KEY,
    check_output,
)
from grpo_plugin.server.client import Completion
from rewards import toy_tools

PROMPT = [{"role": "user", "content": "key abc"}]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


class Script:
    """The model, scripted: each generate() call answers every context with the next turn of its row's script
    (rows told apart by the order of calls within a round: the loop asks for active rows in order)."""

    def __init__(self, tok, turns_per_row: list[list[str]]):
        self.tok, self.turns = tok, [list(t) for t in turns_per_row]
        self.contexts: list[list[int]] = []
        self.rows_asked: list[int] = []

    def generate(self, prompt_ids, n=1, max_tokens=None, **_):
        rows = [r for r, t in enumerate(self.turns) if t][: len(prompt_ids) * n] if n == 1 else None
        out = []
        for k, ctx in enumerate(prompt_ids):
            self.contexts.append(list(ctx))
            group = []
            for j in range(n):
                r = rows[k] if rows is not None else k * n + j
                text = self.turns[r].pop(0)
                ids = self.tok(text, add_special_tokens=False)["input_ids"][:max_tokens]
                group.append(Completion(ids, [-0.5] * len(ids), "stop"))
            out.append(group)
        return out


def trainer(tok, script):
    return SimpleNamespace(processing_class=tok, grpo_generation=script)


def loop(tools=(), environments=None, **kw):
    kw.setdefault("max_iterations", None)
    kw.setdefault("max_completion_length", 256)
    kw.setdefault("tool_timeout", 5.0)
    return ToolLoop(tools=list(tools), environments=environments, **kw)


def seven() -> str:
    """Look up the number to answer with.

    Returns:
        One digit.
    """
    return "7"


CALL = TOOL_CALL.replace("lookup", "seven") + "<|im_end|>"


def test_a_call_runs_and_its_result_is_environment_tokens_between_two_model_turns(tok):
    script = Script(tok, [[CALL, "7<|im_end|>"], ["3<|im_end|>"]])
    out = loop([seven])([PROMPT, PROMPT], trainer(tok, script))
    rows = check_output({k: v for k, v in out.items() if not k.startswith("_grpo")}, [PROMPT, PROMPT], 1, len(tok))
    ids, mask = rows.completion_ids[0], rows.env_mask[0]
    call_ids = tok(CALL, add_special_tokens=False)["input_ids"]
    suffix = tool_suffix_ids(tok, [{"role": "tool", "name": "seven", "content": "7"}])
    answer = tok("7<|im_end|>", add_special_tokens=False)["input_ids"]
    assert ids == call_ids + suffix + answer
    assert mask == [1] * len(call_ids) + [0] * len(suffix) + [1] * len(answer)
    assert rows.logprobs[0][len(call_ids):len(call_ids) + len(suffix)] == [0.0] * len(suffix)
    # the second turn was sampled after exactly the tokens the model sampled, then the tool result
    assert script.contexts[-1] == rows.prompt_ids[0] + call_ids + suffix
    assert rows.completion_ids[1] == tok("3<|im_end|>", add_special_tokens=False)["input_ids"]
    assert rows.extra["tool_calls"] == [1, 0] and rows.extra["turns"] == [2, 1]
    said = out[COMPLETIONS_KEY][0]
    assert [m["role"] for m in said] == ["assistant", "tool", "assistant"]
    assert said[0]["tool_calls"][0]["function"]["name"] == "seven" and said[1]["content"] == "7"
    assert out[METRICS_KEY]["agent_tool_calls"] == 1 and out[METRICS_KEY]["agent_tool_call_rate"] == 0.5
    assert out[METRICS_KEY]["agent_tool/seven/calls"] == 1 and out[METRICS_KEY]["agent_tool/seven/failures"] == 0


def test_the_first_turn_asks_the_server_once_per_distinct_prompt(tok):
    asked = []

    class Counting(Script):
        def generate(self, prompt_ids, n=1, **kw):
            asked.append((len(prompt_ids), n))
            return super().generate(prompt_ids, n=n, **kw)

    other = [{"role": "user", "content": "key xyz"}]
    script = Counting(tok, [["1<|im_end|>"]] * 4)
    loop([seven])([PROMPT, PROMPT, other, other], trainer(tok, script))
    assert asked == [(2, 2)]


def boom(x: int) -> str:
    """Fail.

    Args:
        x: anything.
    """
    raise RuntimeError(f"no luck with {x}")


def test_a_raising_tool_an_unknown_tool_and_bad_arguments_become_errors_the_model_reads(tok):
    calls = ('<tool_call>\n{"name": "boom", "arguments": {"x": 3}}\n</tool_call>'
             '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>'
             '<tool_call>\n{"name": "seven", "arguments": {"y": 1}}\n</tool_call><|im_end|>')
    script = Script(tok, [[calls, "0<|im_end|>"]])
    out = loop([seven, boom], max_completion_length=1024)([PROMPT], trainer(tok, script))
    tool_said = [m["content"] for m in out[COMPLETIONS_KEY][0] if m["role"] == "tool"]
    assert "RuntimeError: no luck with 3" in tool_said[0]
    assert "Tool nope not found (tools: boom, seven)" in tool_said[1]
    assert "TypeError" in tool_said[2] and "'y'" in tool_said[2]
    assert out["tool_failures"] == [3] and out["turns"] == [2]  # the model took its next turn anyway
    assert "7" not in tok.decode(script.contexts[-1][-40:])  # no result was made up
    m = out[METRICS_KEY]
    assert (m["agent_tool_calls"], m["agent_tool_failures"]) == (3, 3)
    assert m["agent_tool/boom/failures"] == 1 and m["agent_tool/(unknown)/failures"] == 1
    assert not any("nope" in k for k in m)  # a name the model made up never becomes a metric's key


def test_a_malformed_call_is_answered_with_an_error_and_counted(tok):
    script = Script(tok, [['<tool_call>\n{"name": "seven", "argu\n</tool_call><|im_end|>', "5<|im_end|>"]])
    out = loop([seven], max_completion_length=1024)([PROMPT], trainer(tok, script))
    said = out[COMPLETIONS_KEY][0]
    assert said[1]["role"] == "tool" and said[1]["name"] == MALFORMED and "malformed tool call" in said[1]["content"]
    assert out["tool_calls"] == [0] and out["tool_failures"] == [1] and out["turns"] == [2]
    assert out[METRICS_KEY][f"agent_tool/{MALFORMED}/failures"] == 1


def test_a_call_without_a_name_is_malformed(tok):
    parsed = parse_turn(tok, tok('<tool_call>\n[1, 2]\n</tool_call><|im_end|>', add_special_tokens=False)["input_ids"],
                        tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"])
    assert parsed.calls == [] and "it needs a name and an arguments object" in parsed.malformed


class Sleepy:
    """An environment whose tool hangs on its first use."""

    built = 0

    def __init__(self):
        Sleepy.built += 1
        self.release = threading.Event()

    def reset(self, **row):
        return None

    def wait(self) -> str:
        """Wait.

        Returns:
            Nothing, ever.
        """
        self.waiting = True
        self.release.wait(30)
        return "late"

    def get_reward(self) -> float:
        if getattr(self, "waiting", False):
            self.release.wait(30)  # as an environment whose state the hung call holds would
        return 1.0


def test_a_hanging_tool_times_out_and_its_environment_is_not_used_again(tok):
    Sleepy.built = 0
    envs = EnvironmentSet({None: Sleepy}, [])
    assert Sleepy.built == 1  # the probe, kept in the pool
    hang = TOOL_CALL.replace("lookup", "wait") + "<|im_end|>"
    script = Script(tok, [[hang, "1<|im_end|>"]])
    t0 = time.monotonic()
    out = loop(environments=envs, tool_timeout=0.3)([PROMPT], trainer(tok, script))
    assert time.monotonic() - t0 < 10
    said = out[COMPLETIONS_KEY][0]
    assert "did not return within 0.3 s" in said[1]["content"] and out["tool_failures"] == [1]
    assert out[METRICS_KEY]["agent_tool/wait/failures"] == 1 and out[METRICS_KEY]["agent_tool/wait/timeouts"] == 1
    assert out[METRICS_KEY]["agent_tool/wait/raised"] == 0 and out[METRICS_KEY]["agent_tool_timeouts"] == 1
    out[ENVIRONMENTS_KEY].release()  # scored
    # its get_reward() is not read (it would wait on the hung call)
    assert reward_function(Sleepy, envs)(environments=out[ENVIRONMENTS_KEY].instances) == [None]
    loop(environments=envs)([PROMPT], trainer(tok, Script(tok, [["2<|im_end|>"]])))
    assert Sleepy.built == 2  # the hung instance was dropped, a new one built


class Meeting:
    """Two rows' tools that return only when both run at once."""

    barrier = threading.Barrier(2)

    def reset(self, **row):
        return None

    def meet(self) -> str:
        """Meet.

        Returns:
            Whether the other row came.
        """
        Meeting.barrier.wait(timeout=5)
        return "met"


def test_rows_run_their_calls_at_once(tok):
    Meeting.barrier.reset()
    call = TOOL_CALL.replace("lookup", "meet") + "<|im_end|>"
    script = Script(tok, [[call, "1<|im_end|>"], [call, "2<|im_end|>"]])
    other = [{"role": "user", "content": "key q"}]
    out = loop(environments=EnvironmentSet({None: Meeting}, []), tool_timeout=10)([PROMPT, other],
                                                                                  trainer(tok, script))
    assert [m[1]["content"] for m in out[COMPLETIONS_KEY]] == ["met", "met"]


def test_max_tool_calling_iterations_and_the_budget_end_a_row(tok):
    script = Script(tok, [[CALL, CALL, CALL]])
    out = loop([seven], max_iterations=2)([PROMPT], trainer(tok, script))
    assert out["tool_calls"] == [2] and out["turns"] == [3]  # two rounds ran; the third call was not
    call_len = len(tok(CALL, add_special_tokens=False)["input_ids"])
    script = Script(tok, [[CALL, "7<|im_end|>"]])
    out = loop([seven], max_completion_length=call_len + 5)([PROMPT], trainer(tok, script))
    assert len(out["completion_ids"][0]) == call_len and out["turns"] == [1]  # the result did not fit
    script = Script(tok, [[CALL]])
    out = loop([seven], max_completion_length=10)([PROMPT], trainer(tok, script))
    assert len(out["completion_ids"][0]) == 10 and out["tool_calls"] == [0]  # a cut turn calls nothing


class Vault(toy_tools.Vault):
    """The demo's vault, its secret from the row and an observation from reset(); looking pays 1, else 0.25."""

    def reset(self, prompt=None, secret="0", **row):
        self.secret, self.looked = secret, False
        return f" (vault {secret})"

    def get_reward(self) -> float:
        return 1.0 if self.looked else 0.25


class Plain:
    def reset(self, **row):
        return None


def test_environments_reset_by_row_serve_their_tools_and_carry_their_reward(tok):
    envs = EnvironmentSet({"vault": Vault, "plain": Plain}, [seven])
    rows = [{"prompt": PROMPT, "environment": "vault", "secret": "4"},
            {"prompt": PROMPT, "environment": "vault", "secret": "9"},
            {"prompt": PROMPT, "environment": "plain"}]
    script = Script(tok, [[TOOL_CALL + "<|im_end|>", "4<|im_end|>"], ["1<|im_end|>"], [CALL, "7<|im_end|>"]])
    out = loop(environments=envs)([PROMPT] * 3, trainer(tok, script), rows)
    assert out[PROMPTS_KEY][0][-1]["content"] == "key abc (vault 4)"  # reset's observation, appended
    assert "tools: seven lookup" in tok.decode(out["prompt_ids"][0])
    assert "tools: seven<" in tok.decode(out["prompt_ids"][2])  # a plain row sees the standalone tool only
    assert [m["content"] for m in out[COMPLETIONS_KEY][0] if m["role"] == "tool"] == ["4"]
    column = reward_function(Vault, envs)
    assert column.__name__ == "Vault"
    # TRL's contract: the rollout's own instances, in row order, as `environments=`
    held = out[ENVIRONMENTS_KEY]
    assert [type(e) for e in held.instances] == [Vault, Vault, Plain]
    assert column(environments=held.instances, prompts=[PROMPT] * 3, completions=[None] * 3) == [1.0, 0.25, None]
    # held until scored: a rollout made before this one is scored gets instances of its own, not these
    again = loop(environments=envs)([PROMPT], trainer(tok, Script(tok, [["1<|im_end|>"]])),
                                    [{"prompt": PROMPT, "environment": "vault", "secret": "2"}])
    assert not any(e is again[ENVIRONMENTS_KEY].instances[0] for e in held.instances)
    assert held.instances[0].secret == "4" and held.instances[0].looked  # not reset by the later rollout
    held.release()
    held.release()  # once
    pooled = [e for v in envs._free.values() for e in v]  # back in the pool: these three (the later one is held)
    assert len(pooled) == 3 and all(any(e is h for h in held.instances) for e in pooled)
    with pytest.raises(ValueError, match="environment 'nope' is not one of"):
        loop(environments=envs)([PROMPT], trainer(tok, Script(tok, [["1"]])), [{"prompt": PROMPT,
                                                                              "environment": "nope"}])


def test_an_environment_without_reset_and_a_string_prompt_are_refused(tok):
    with pytest.raises(ValueError, match="has no reset"):
        EnvironmentSet({None: object}, [])
    with pytest.raises(ValueError, match="conversational prompts"):
        loop([seven])(["abc = "], trainer(tok, Script(tok, [["1"]])))


def test_tools_and_environments_are_checked_before_the_model_loads():
    from grpo_plugin.config.checks import check_cross_keys
    from grpo_plugin.config.preflight import agent_problems
    from grpo_plugin.config.schema import GRPOSettings

    settings = GRPOSettings(tools=["rewards.toy_tools.lookup"], environment_factory={"v": "rewards.toy_tools.Vault"},
                            max_tool_calling_iterations=2, tool_timeout=5)
    assert settings.tools == ["rewards.toy_tools.lookup"] and settings.environment_factory == {
        "v": "rewards.toy_tools.Vault"}
    with pytest.raises(ValueError, match="tool_timeout"):
        GRPOSettings(tools=["rewards.toy_tools.lookup"], tool_timeout=0)
    base = {"rl": "grpo", "grpo": {"tools": ["rewards.toy_tools.lookup"]}}
    check_cross_keys(base)  # accepted
    with pytest.raises(ValueError, match=r"grpo\.tools with `trl\.rollout_func: rewards\.toy_agent\.two_turns`: the "
                                         r"tool-calling loop is the run's rollout function"):
        check_cross_keys({**base, "trl": {"rollout_func": "rewards.toy_agent.two_turns"}})
    with pytest.raises(ValueError, match=r"grpo\.environment_factory with grpo\.atropos"):
        check_cross_keys({"rl": "grpo", "grpo": {"environment_factory": "rewards.toy_tools.Vault",
                                                 "atropos": {"envs": [], "url": "http://127.0.0.1:9000"}},
                          "max_steps": 4})
    assert agent_problems({"tools": ["rewards.toy_tools.lookup"], "environment_factory": "rewards.toy_tools.Vault"}) \
        == [None, None]
    problems = [p for p in agent_problems({"tools": ["rewards.toy_tools.answer_matches_tool", "rewards.toy_tools.nope"],
                                           "environment_factory": {"a": "rewards.toy_tools.Nope"}}) if p]
    assert len(problems) == 3, problems
    assert "grpo.tools: 'rewards.toy_tools.answer_matches_tool' cannot be shown to the model as a tool" in problems[0]
    assert "grpo.tools: 'rewards.toy_tools.nope'" in problems[1] and "has no 'nope'" in problems[1]
    assert problems[2].startswith("grpo.environment_factory.a: 'rewards.toy_tools.Nope'")


def test_the_tokenizer_needs_a_response_parser(tok, tmp_path):
    from grpo_plugin.agents.chat_format import ensure_response_parser
    from grpo_plugin.demo.tiny import build_tokenizer

    ensure_response_parser(tok)  # the tiny tokenizer carries its own
    bare = build_tokenizer(tmp_path)
    bare.response_template = None
    with pytest.raises(ValueError, match="not one TRL can parse tool calls for, and it has no `response_template`"):
        ensure_response_parser(bare)


def test_environments_with_get_reward_are_reward_columns_before_the_host_trainer_is_built():
    """TRL refuses a run without a reward source at init: an environment's get_reward() must be a reward function
    by then (a run may have no other), weight 1 beside the configured weights."""
    from grpo_plugin.agents.attach import environment_rewards
    from grpo_plugin.config.schema import GRPOSettings

    def mine(completions, **kw):
        return [0.0] * len(completions)

    kwargs = {"args": SimpleNamespace(reward_weights=[0.5])}
    args, envs = environment_rewards(GRPOSettings(environment_factory={"v": "rewards.toy_tools.Vault",
                                                                        "d": "rewards.toy_tools.Desk"}),
                                     ("model", [mine]), kwargs)  # axolotl passes (model, reward_funcs)
    assert args == ("model",)
    assert [f.__name__ for f in kwargs["reward_funcs"]] == ["mine", "Vault"]  # Desk owns no reward
    assert kwargs["args"].reward_weights == [0.5, 1.0]
    assert set(envs.factories) == {"v", "d"} and envs.reward_types == [toy_tools.Vault]
    kwargs = {"reward_funcs": [], "args": SimpleNamespace(reward_weights=None)}
    environment_rewards(GRPOSettings(environment_factory="rewards.code_agent.CodeAgent"), ("model",), kwargs)
    assert [f.__name__ for f in kwargs["reward_funcs"]] == ["CodeAgent"] and kwargs["args"].reward_weights is None
    assert environment_rewards(GRPOSettings(tools=["rewards.toy_tools.lookup"]), ("m", []), {}) == (("m", []), None)
