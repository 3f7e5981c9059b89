"""TRL 1.14's contract for environments and tools, as a user written against TRL's docs meets it through the plugin:
the reward functions are called by TRL's own `_calculate_rewards` on what the plugin's tool loop and producer make
(the model's turns scripted, no server): `environments=` is the rollout's instances in row order, alive until
scored, and no private key of the plugin reaches a reward; faults in an environment's own code name the class, the
method and the row; tool faults are said per batch and counted apart; evaluation hands the loop its rows and the
rewards the loop's messages. On the real server, training: tests/e2e/test_tool_train.py."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from trl import GRPOTrainer

from grpo_plugin.agents.environments import AgentFault, EnvironmentSet, lent, reward_function
from grpo_plugin.agents.evaluation import AgentEvaluation
from grpo_plugin.agents.tool_loop import ToolLoop
from grpo_plugin.demo.tiny import build_tokenizer
from grpo_plugin.demo.tools import TOOL_CALL
from grpo_plugin.producers.agent import AgentRolloutProducer, rollout_name
from grpo_plugin.producers.agent_onpolicy import RowCheck
from grpo_plugin.producers.agent_output import (
    COMPLETIONS_KEY,
    ENVIRONMENTS_KEY,
    PRIVATE_KEYS,
    RolloutFuncError,
    check_output,
)
from tests.unit.test_tool_loop import PROMPT, Script, seven

CALL = TOOL_CALL.replace("lookup", "get") + "<|im_end|>"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"))
TRL_KWARGS = {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric"}


class KeyValueStore:
    """Written from TRL's docs alone: reset(**row) needs the row's own columns; get() reads the store."""

    def reset(self, key, value, prompt=None, **row):
        self.store, self.read = {key: value}, []

    def get(self, key: str) -> str:
        """Read a key.

        Args:
            key: The key.

        Returns:
            The value.
        """
        self.read.append(key)
        return self.store.get(key, "missing")


def read_reward(environments, **kwargs):
    """TRL's usual environment reward: the rollout's own instance."""
    return [1.0 if env.read else 0.0 for env in environments]


def host_rewards(reward_funcs, inputs, prompts, completions, environments):
    """TRL's own reward computation (GRPOTrainer._calculate_rewards) with the trainer's state around it."""
    seen = []

    def spy(**kwargs):
        seen.append(kwargs)
        return [0.0] * len(kwargs["prompts"])

    funcs = [*reward_funcs, spy]
    trainer = SimpleNamespace(
        accelerator=SimpleNamespace(device="cpu", is_main_process=True), reward_funcs=funcs,
        reward_processing_classes=[None] * len(funcs),
        reward_func_names=[getattr(f, "__name__", "f") for f in funcs], state=SimpleNamespace(global_step=0),
        _log_completion_extra=lambda *a: None, _log_metric=lambda *a: None, environments=None,
        args=SimpleNamespace(report_to=[]), _profiling=False)
    with lent(trainer, environments):
        out = GRPOTrainer._calculate_rewards(trainer, inputs, prompts, completions, [[1]] * len(prompts))
    assert trainer.environments is None
    return out, seen[0]


def kv_rows():
    return [{"prompt": PROMPT, "key": "k1", "value": "v1", "task": "a"},
            {"prompt": PROMPT, "key": "k2", "value": "v2", "task": "b"}]


def test_environments_reach_trl_rewards_in_row_order_and_no_private_key_does(tok):
    envs = EnvironmentSet({None: KeyValueStore}, [])
    rows = kv_rows()
    call = CALL.replace("{}", '{"key": "k1"}')
    script = Script(tok, [[call, "v1<|im_end|>"], ["no<|im_end|>"]])
    out = ToolLoop(tools=[], environments=envs, max_iterations=None, max_completion_length=256, tool_timeout=5)(
        [PROMPT, PROMPT], SimpleNamespace(processing_class=tok, grpo_generation=script), rows)
    own = {k: out.pop(k) for k in PRIVATE_KEYS if k in out}  # as the producer does
    checked = check_output(out, [PROMPT, PROMPT], 1, len(tok))
    inputs = [dict(r) for r in rows]
    producer = object.__new__(AgentRolloutProducer)
    producer.spec = SimpleNamespace(pad_token_id=0, stop_token_ids=(tok.eos_token_id,), mask_truncated=False,
                                    device="cpu")
    producer._tensors(checked, inputs)  # extra fields join their rows
    held = own[ENVIRONMENTS_KEY]
    rewards, kwargs = host_rewards([read_reward], inputs, [PROMPT, PROMPT],
                                   own[COMPLETIONS_KEY], held)
    assert rewards[:, 0].tolist() == [1.0, 0.0]  # row 0's instance read the store, row 1's did not
    assert [e.store for e in kwargs["environments"]] == [{"k1": "v1"}, {"k2": "v2"}]  # reset(**row), in row order
    private = [k for k in kwargs if k.startswith("_") or k == "environment_reward"]
    assert not private, private
    assert set(kwargs) == TRL_KWARGS | {"environments", "key", "value", "task", "tool_calls", "tool_failures",
                                        "turns"}
    assert [m["role"] for m in kwargs["completions"][0]] == ["assistant", "tool", "assistant"]
    assert held._released and len(envs._free[None]) == 2  # back in the pool once scored


def test_a_reset_that_raises_names_the_class_the_method_and_the_row(tok):
    class Flaky(KeyValueStore):
        def reset(self, key, value, **row):
            if key == "k2":
                raise ConnectionError("store down")
            super().reset(key, value)

    envs = EnvironmentSet({None: Flaky}, [])
    loop = ToolLoop(tools=[], environments=envs, max_iterations=None, max_completion_length=64, tool_timeout=5)
    with pytest.raises(AgentFault, match=r"grpo\.environment_factory: Flaky\.reset\(\) raised ConnectionError: store "
                                         r"down on row 1 \(prompt 'key abc'\) \(its columns: \['key', 'prompt', "
                                         r"'task', 'value'\]\)"):
        loop([PROMPT, PROMPT], SimpleNamespace(processing_class=tok, grpo_generation=Script(tok, [["1"], ["2"]])),
             kv_rows())
    assert len(envs._free[None]) == 2  # the instances taken went back


def test_a_get_reward_that_raises_names_the_class_the_method_and_the_row():
    class Judge(KeyValueStore):
        def get_reward(self):
            raise KeyError("verdict")

    envs = EnvironmentSet({None: Judge}, [])
    held = envs.take([None, None])
    for env, row in zip(held.instances, kv_rows()):
        env.reset(**row)
    with pytest.raises(AgentFault, match=r"Judge\.get_reward\(\) raised KeyError: 'verdict' on row 0 \(prompt "
                                         r"'key abc'\)"):
        reward_function(Judge, envs)(environments=held.instances, prompts=[PROMPT, PROMPT])


def test_errors_name_the_tool_loop_by_its_config_key_and_a_users_function_by_its_path():
    loop = ToolLoop(tools=[seven], environments=None, max_iterations=None, max_completion_length=8, tool_timeout=1)
    assert rollout_name(loop) == "grpo.tools"
    envs = EnvironmentSet({None: KeyValueStore}, [])
    assert rollout_name(ToolLoop(tools=[], environments=envs, max_iterations=None, max_completion_length=8,
                                 tool_timeout=1)) == "grpo.environment_factory"
    assert rollout_name(read_reward) == f"trl.rollout_func {__name__}.read_reward"


def boom(x: int) -> str:
    """Fails.

    Args:
        x: Anything.

    Returns:
        Nothing.
    """
    raise ValueError(f"bad x {x}")


def test_tool_faults_are_said_per_batch_counted_apart_and_dropped_results_counted(tok, capsys):
    call = TOOL_CALL.replace("lookup", "boom").replace("{}", '{"x": 3}') + "<|im_end|>"
    loop = ToolLoop(tools=[boom], environments=None, max_iterations=None, max_completion_length=256, tool_timeout=5)
    script = Script(tok, [[call, "1<|im_end|>"], [call, "2<|im_end|>"]])
    out = loop([PROMPT, PROMPT], SimpleNamespace(processing_class=tok, grpo_generation=script))
    m = out["_grpo_agent_metrics"]
    assert m["agent_tool/boom/raised"] == 2 and m["agent_tool/boom/timeouts"] == 0 and m["agent_tool_raised"] == 2
    err = capsys.readouterr().err
    assert "tool boom: 2 call(s) raised (first: ValueError: bad x 3)" in err
    # a result that does not fit the budget: the row ends, counted, and said once
    call_len = len(tok(call, add_special_tokens=False)["input_ids"])
    small = ToolLoop(tools=[seven], environments=None, max_iterations=None, max_completion_length=call_len + 3,
                     tool_timeout=5)
    seven_call = TOOL_CALL.replace("lookup", "seven") + "<|im_end|>"
    for _ in range(2):
        out = small([PROMPT], SimpleNamespace(processing_class=tok, grpo_generation=Script(tok, [[seven_call]])))
        assert out["_grpo_agent_metrics"]["agent_tool_results_dropped"] == 1
    assert capsys.readouterr().err.count("did not fit trl.max_completion_length") == 1


def test_evaluation_hands_the_loop_its_rows_and_the_rewards_its_messages(tok):
    envs = EnvironmentSet({"kv": KeyValueStore}, [])
    loop = ToolLoop(tools=[], environments=envs, max_iterations=None, max_completion_length=256, tool_timeout=5)
    call = CALL.replace("{}", '{"key": "k1"}')
    trainer = SimpleNamespace(processing_class=tok, model=SimpleNamespace(training=False), rollout_func=loop,
                              environments=None, _metrics={"eval": defaultdict(list)},
                              grpo_generation=Script(tok, [[call, "v1<|im_end|>"], ["x<|im_end|>"]]))
    evaluation = AgentEvaluation(loop)
    rows = [{**r, "environment": "kv"} for r in kv_rows()]
    prompts = [PROMPT, PROMPT]
    with evaluation.batch(trainer, rows):
        out = trainer.rollout_func(prompts, trainer)  # as TRL's _generate calls it: prompts and the trainer
        assert not [k for k in out if k.startswith("_")]
        assert [e.store for e in trainer.environments] == [{"k1": "v1"}, {"k2": "v2"}]  # reset got the row
        decoded = ("ids", "cids", None, ["one assistant message"] * 2, "lps", {}, None, None)
        result = evaluation.generated(prompts, decoded)
        assert [m["role"] for m in result[3][0]] == ["assistant", "tool", "assistant"]
        assert result[:3] == decoded[:3] and result[4:] == decoded[4:]
    assert trainer.rollout_func is loop and trainer.environments is None
    assert trainer._metrics["eval"]["agent_tool/get/calls"] == [1.0]
    assert len(envs._free["kv"]) == 2


def scored(sampling_shift: list[float]) -> dict:
    """A scored rollout of 4 rows x 3 model tokens: the trainer's logprobs, and the sampler's shifted per row."""
    old = torch.full((4, 3), -1.0)
    sampling = old + torch.tensor(sampling_shift).unsqueeze(1)
    return {"old_per_token_logps": old, "sampling_per_token_logps": sampling,
            "completion_mask": torch.ones(4, 3), "tool_mask": torch.tensor([[1, 0, 1]] * 4)}


def check(action="stop", step=7, reject=0.5):
    return RowCheck("trl.rollout_func my.agent", reject, action, step=lambda: step,
                    prompts=["abc = ", "abc = ", "xyz = ", "xyz = "])


def test_a_rollout_sampled_by_the_policy_passes_the_lag0_check():
    adv = torch.ones(4)
    fields = check().apply(scored([1e-7, 0.0, 2e-7, 0.0]), adv, 7)
    assert fields["agent_logprob_gap_lag0"] < 1e-6 and fields["agent_offpolicy_rows"] == 0 and adv.tolist() == [1] * 4


def test_a_lag0_row_sampled_by_another_model_stops_the_run_naming_the_cause():
    with pytest.raises(RolloutFuncError, match=r"trl\.rollout_func my\.agent: 1 of 4 rows sampled at the weights "
                                               r"this step trains \(policy version 7\) differ .* grpo\.offpolicy_reject"
                                               r"=0\.5 nats/token \(row 2 \(prompt 'xyz ='\): 3\).* another model "
                                               r"sampled it .* another temperature"):
        check().apply(scored([0.0, 0.0, 3.0, 0.1]), torch.ones(4), 7)


def test_drop_zeroes_the_rows_over_the_threshold_and_an_older_version_is_not_compared(capsys):
    adv = torch.ones(4)
    fields = check("drop").apply(scored([0.0, 0.9, 3.0, 0.1]), adv, 7)
    assert adv.tolist() == [1, 0, 0, 1] and fields["agent_offpolicy_rows"] == 2
    assert "Their advantages are zeroed" in capsys.readouterr().err
    assert check().apply(scored([9.0] * 4), torch.ones(4), 6) == {}  # lag 1: the policy's own change
    assert check(reject=None).apply(scored([9.0] * 4), torch.ones(4), 7) == {}  # never checked


def test_the_lag0_check_compares_every_ranks_rows():
    """Rank 1 of 2 (rows 4..7 of the batch): a row of rank 0 over the threshold stops rank 1 too."""
    c = RowCheck("grpo.tools", 0.5, "stop", step=lambda: 3, prompts=["p"] * 4, first_row=4)
    with pytest.raises(RolloutFuncError, match=r"row 1: 5"):
        c.apply(scored([0.0] * 4), torch.ones(4), 3, gather=lambda mine: [0.0, 5.0, 0.0, 0.0] + list(mine))
