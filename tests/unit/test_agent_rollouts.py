"""trl.rollout_func through the plugin (producers/agent.py, agent_output.py), without a server: what a function's
output becomes, what the host's loss makes of it, and each way a function's output is refused.

The loss check runs axolotl's own `_compute_loss` (TRL's formulas) on the tensors the agent producer builds, with
only the model forward replaced by a leaf tensor of per-token logprobs, so each token's gradient can be read."""

from __future__ import annotations

import math
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from grpo_plugin.compat.host import host
from grpo_plugin.producers.agent import AgentRolloutProducer, TrainerView, agent_fields, call_with_timeout
from grpo_plugin.producers.agent_output import (
    RolloutFuncError,
    check_output,
    model_turns,
    unknown_model_tokens,
)
from tests.unit.test_ppo_clip_signs import plugin_trainer

VOCAB, PAD, EOS = 50, 0, 1
PROMPTS = ["abc = ", "abc = ", "xyz = ", "xyz = "]  # 2 prompts x num_generations 2


def two_turn_output() -> dict:
    """Two model turns with a 3-token environment reply between them, as rewards/toy_agent.py builds them."""
    reply = [40, 41, 42]
    turns = [([5, 6], [7, EOS]), ([8], [9, 10, EOS]), ([11, 12, 13], [EOS]), ([14], [15])]  # the last: truncated
    out = {"prompt_ids": [[20, 21]] * 2 + [[22, 23, 24]] * 2, "completion_ids": [], "logprobs": [], "env_mask": [],
           "turns": [2, 2, 2, 2]}
    for a, b in turns:
        out["completion_ids"].append(a + reply + b)
        out["logprobs"].append([-0.5] * len(a) + [0.0] * len(reply) + [-0.25] * len(b))
        out["env_mask"].append([1] * len(a) + [0] * len(reply) + [1] * len(b))
    return out


def producer() -> AgentRolloutProducer:
    p = object.__new__(AgentRolloutProducer)  # the tensorisation reads its spec only
    decode = SimpleNamespace(batch_decode=lambda ids, **k: ["".join(map(chr, x)) for x in ids])
    p.spec = SimpleNamespace(pad_token_id=PAD, stop_token_ids=(EOS,), mask_truncated=False, device="cpu",
                             tokenizer=decode)
    return p


def test_a_two_turn_rollout_func_trains_only_the_models_tokens():
    rows = check_output(two_turn_output(), PROMPTS, 2, VOCAB)
    inputs = [{"prompt": p} for p in PROMPTS]
    data = producer()._tensors(rows, inputs)
    model = data["completion_mask"] * data["tool_mask"]
    env = data["completion_mask"] * (1 - data["tool_mask"])
    n_model = sum(sum(m) for m in rows.env_mask)
    assert int(env.sum()) == 4 * 3 and int(model.sum()) == n_model
    assert int(data["num_items_in_batch"]) == n_model  # the loss's token normalisation: model tokens only
    assert [x["turns"] for x in inputs] == [2, 2, 2, 2]  # extra fields reach the reward functions with their row
    assert (data["sampling_per_token_logps"][env.bool()] == 0).all()  # env positions: what the function sent

    # the host's loss on these tensors: each model token pushed by its advantage, no env token touched
    logps = torch.full(data["completion_ids"].shape, -1.0, requires_grad=True)
    tr = plugin_trainer("dapo")
    tr._get_per_token_logps_and_entropies = lambda *a, **k: host().logps_result(logps, torch.zeros_like(logps))
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    inputs = {**{k: v for k, v in data.items() if isinstance(v, torch.Tensor)}, "advantages": advantages,
              "old_per_token_logps": logps.detach().clone(), "importance_sampling_ratio": torch.ones_like(logps)}
    loss = tr._compute_loss(None, inputs)
    loss.backward()
    grad = logps.grad
    assert (grad[env.bool()] == 0).all(), "an environment token got gradient"
    assert (grad[model.bool()] != 0).all(), "a model token got none"
    # dapo: -sum(A_i * ratio) over trained tokens / num_items_in_batch (ratio 1 here): the model tokens' count only
    expected = -sum(float(a) * float(m.sum()) for a, m in zip(advantages, model)) / n_model
    assert float(loss) == pytest.approx(expected, rel=1e-5)


def test_prompt_ids_once_per_prompt_and_top_k_logprobs_are_accepted():
    out = two_turn_output()
    out["prompt_ids"] = out["prompt_ids"][::2]  # NeMo Gym's rollout function: once per distinct prompt
    out["logprobs"] = [[[x] for x in lp] for lp in out["logprobs"]]  # vLLM's top-k shape
    out["logprobs"][0][0] = [None]  # vLLM's NaN
    rows = check_output(out, PROMPTS, 2, VOCAB)
    assert rows.prompt_ids == [[20, 21]] * 2 + [[22, 23, 24]] * 2
    assert math.isnan(rows.logprobs[0][0]) and rows.logprobs[0][1] == -0.5


@pytest.mark.parametrize("change, message", [
    (lambda o: o.pop("logprobs"), r"returned no \['logprobs'\]"),
    (lambda o: o["completion_ids"].pop(), r"completion_ids has 3 completions for 4 prompt rows"),
    (lambda o: o["prompt_ids"].pop(), r"prompt_ids has 3 entries for 4 prompt rows"),
    (lambda o: o["logprobs"][1].pop(), r"row 1 \(prompt 'abc ='\): logprobs has 6 values for 7 completion tokens"),
    (lambda o: o["env_mask"][2].append(1), r"row 2 \(prompt 'xyz ='\): env_mask has 8 values for 7 completion"),
    (lambda o: o["env_mask"][3].__setitem__(0, 2), r"row 3 .*env_mask holds 2"),
    (lambda o: o["completion_ids"][0].__setitem__(1, VOCAB), rf"row 0 .*completion_ids\[1\] = {VOCAB} is not a "
                                                            rf"token id \(the model has {VOCAB}\)"),
    (lambda o: o["completion_ids"][0].__setitem__(1, "x"), r"completion_ids\[1\] = 'x' is not a token id"),
    (lambda o: o["logprobs"][0].__setitem__(0, 0.5), r"row 0 .*logprobs\[0\] = 0.5 is not a log-probability"),
    (lambda o: o["turns"].pop(), r"extra field 'turns' has 3 values for 4 rows"),
    (lambda o: o["prompt_ids"].__setitem__(1, []), r"row 1 .*prompt_ids is empty"),
])
def test_an_output_that_cannot_train_is_refused_naming_the_row_and_field(change, message):
    out = two_turn_output()
    change(out)
    with pytest.raises(RolloutFuncError, match=message):
        check_output(out, PROMPTS, 2, VOCAB)


def test_not_a_dict_is_refused():
    with pytest.raises(RolloutFuncError, match="returned a list; it must return a dict"):
        check_output([], PROMPTS, 2, VOCAB)


def test_turns_and_tokens_of_unknown_origin_are_counted():
    rows = check_output(two_turn_output(), PROMPTS, 2, VOCAB)
    assert [model_turns(rows.model_mask(i)) for i in range(4)] == [2, 2, 2, 2]
    assert model_turns([0, 1, 1, 0, 0, 1, 0, 1]) == 3 and model_turns([0, 0]) == 0
    # the handle returned row 0's turns (the second cut short, as at a stop string) and row 1's first turn
    generated = [(5, 6), (7, EOS, 3), (8,)]
    assert unknown_model_tokens(rows, generated) == 3 + 4 + 2  # row 1's 2nd turn, rows 2 and 3
    handle = SimpleNamespace(generated=generated, calls=2)
    fields = agent_fields(rows, handle, (EOS,))
    assert fields == {"agent_turns_mean": 2.0, "agent_model_tokens": 14, "agent_env_tokens": 12,
                      "agent_truncated": 1, "agent_unknown_origin_tokens": 9, "agent_generate_calls": 2}


def test_the_handle_counts_what_each_server_sampled():
    """Several servers: the handle's calls are split across them; the rollout records how many completions each one
    sampled (the step's `server_rows`), as a single-turn rollout does."""
    from grpo_plugin.producers.agent import AgentGeneration
    from grpo_plugin.server.client import Completion

    class TwoServers:  # the group's interface the handle uses: its replicas, and generate
        replicas = [object(), object()]

        def generate(self, prompts, model, n, **settings):
            return [[Completion(token_ids=[5, i], logprobs=[-0.1, -0.2], finish_reason="length", server=i % 2)
                     for _ in range(n)] for i, _ in enumerate(prompts)]

    lease = SimpleNamespace(model="v3")
    gen = AgentGeneration(TwoServers(), {"max_tokens": 2}, lease=lease)
    gen.generate([[1], [2], [3]], n=2)  # 3 prompts: servers 0, 1, 0
    gen.generate([[4, 5]])
    assert gen.server_rows == [2 + 2 + 1, 2] and gen.calls == 2
    assert len(gen.generated) == 7


def test_a_hung_function_is_an_error_naming_the_timeout_and_its_thread_is_left_behind():
    release = threading.Event()

    def hangs(prompts, trainer):
        release.wait(30)
        return {}

    t0 = time.monotonic()
    with pytest.raises(RolloutFuncError, match=r"my\.agent did not return within grpo\.rollout_timeout=0\.2 s "
                                               r"\(4 prompt rows\)"):
        call_with_timeout(hangs, (PROMPTS, None), 0.2, "my.agent")
    assert time.monotonic() - t0 < 5
    release.set()
    assert call_with_timeout(lambda p, t: {"n": len(p)}, (PROMPTS, None), 5, "x") == {"n": 4}


def test_a_raising_function_is_an_error_naming_it_and_a_lost_server_is_the_guards():
    from grpo_plugin.server.client import ServerError, ServerLost

    p = producer()
    p.name, p.rollout_timeout, p._trainer = "trl.rollout_func my.agent", 5, SimpleNamespace(num_generations=2)
    p.spec.client = SimpleNamespace(healthy=lambda: True)

    def raises(prompts, trainer):
        raise KeyError("tool")

    p.rollout_func = raises
    with pytest.raises(RolloutFuncError, match=r"trl\.rollout_func my\.agent raised KeyError: 'tool' \(rollout of "
                                               r"4 prompt rows\)"):
        p._call(PROMPTS, None)

    def server_fails(prompts, trainer):
        raise ServerError("POST /v1/completions: connection refused")

    p.rollout_func = server_fails  # the guard asks the server whether it is lost
    with pytest.raises(ServerError, match="connection refused"):
        p._call(PROMPTS, None)
    p.spec.client = SimpleNamespace(healthy=lambda: False)
    p.rollout_func = raises  # its own requests failed, and the server no longer answers: lost
    with pytest.raises(ServerLost, match="stopped answering during trl.rollout_func my.agent: KeyError"):
        p._call(PROMPTS, None)


def test_the_function_sees_the_trainer_with_this_rollouts_handle():
    trainer = SimpleNamespace(num_generations=8, temperature=0.7)
    view = TrainerView(trainer, generation="pinned")
    assert view.num_generations == 8 and view.temperature == 0.7 and view.grpo_generation == "pinned"
    view.custom = 1  # writes reach the trainer
    assert trainer.custom == 1


def test_rollout_func_is_accepted_and_refused_beside_atropos_or_nemo_gym():
    from grpo_plugin.config.checks import check_cross_keys

    base = {"rl": "grpo", "grpo": {"sync": "lora_sync"}, "adapter": "lora",
            "trl": {"rollout_func": "rewards.toy_agent.two_turns"}}
    check_cross_keys(base)  # accepted
    with pytest.raises(ValueError, match=r"trl\.rollout_func: rewards\.toy_agent\.two_turns` with grpo\.atropos: "
                                         r"the rollouts come from the Atropos environments"):
        check_cross_keys({**base, "grpo": {"sync": "lora_sync", "atropos": {"envs": []}}, "max_steps": 4})
    with pytest.raises(ValueError, match=r"plugins: axolotl\.integrations\.nemo_gym\.NemoGymPlugin with "
                                         r"grpo_plugin\.GRPOPlugin: NeMo Gym's plugin sets its own rollout function"):
        check_cross_keys({**base, "plugins": ["grpo_plugin.GRPOPlugin", "axolotl.integrations.nemo_gym.NemoGymPlugin"]})


def test_length_token_and_sampling_metrics_count_the_models_tokens_only():
    from grpo_plugin.producers.model_tokens import recount

    rows = check_output(two_turn_output(), PROMPTS, 2, VOCAB)
    data = producer()._tensors(rows, [{"prompt": p} for p in PROMPTS])
    trained = data["completion_mask"] * data["tool_mask"]
    old = torch.full(trained.shape, -1.0)
    data["sampling_per_token_logps"] = torch.where(trained.bool(), old - 0.01, torch.zeros_like(old))
    data["old_per_token_logps"] = old
    data["importance_sampling_ratio"] = torch.where(trained.bool(), torch.full_like(old, 0.99), torch.ones_like(old))
    # what axolotl logged, over every completion token
    metrics = {f"completions/{k}": [0.0, 7.0] for k in ("mean_length", "min_length", "max_length",
                                                         "mean_terminated_length", "min_terminated_length",
                                                         "max_terminated_length")}
    metrics.update({"sampling/sampling_logp_difference/mean": [0.5], "sampling/sampling_logp_difference/max": [1.0],
                    "sampling/importance_sampling_ratio/mean": [0.999],
                    "sampling/importance_sampling_ratio/min": [0.99], "sampling/importance_sampling_ratio/max": [1.0]})
    state = SimpleNamespace(num_input_tokens_seen=1000)
    recount(metrics, state, data, lambda t: t.reshape(-1), [EOS, PAD])
    lengths = [4, 4, 4, 2]  # the model's tokens of each row; rows 0-2 end with EOS, row 3 is cut
    assert metrics["completions/mean_length"] == [0.0, pytest.approx(3.5)]
    assert metrics["completions/min_length"][-1] == 2 and metrics["completions/max_length"][-1] == 4
    assert metrics["completions/mean_terminated_length"][-1] == pytest.approx(sum(lengths[:3]) / 3)
    assert state.num_input_tokens_seen == 1000 - 12 and metrics["num_tokens"] == [988]  # 4 replies of 3 tokens
    assert metrics["sampling/sampling_logp_difference/mean"] == [pytest.approx(0.01)]
    assert metrics["sampling/sampling_logp_difference/max"] == [pytest.approx(0.01)]
    assert metrics["sampling/importance_sampling_ratio/max"] == [pytest.approx(0.99)]
