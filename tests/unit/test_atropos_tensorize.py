"""Atropos batch → GRPO tensors: the token shift, masks, advantages, temperatures and payload rejection.

Every test runs twice: from the groups as Python lists, and from the run-api's reply bytes through the
producer's decoding (api.parse_batch), which must give the same tensors and the same rejections."""

import json
import math
import random

import pytest
import torch

from grpo_plugin.atropos.api import parse_batch
from grpo_plugin.atropos.group_tensors import normalised_advantages, tensorize

VOCAB = 100
PATH = {"mode": "lists"}


@pytest.fixture(autouse=True, params=["lists", "reply"])
def input_path(request):
    PATH["mode"] = request.param
    yield request.param
    PATH["mode"] = "lists"


def group(tokens, masks, lps=None, scores=None, **extra):
    lps = lps if lps is not None else [[1.0 if m == -100 else -0.5 for m in row] for row in masks]
    scores = scores if scores is not None else [0.0] * len(tokens)
    return {"tokens": tokens, "masks": masks, "inference_logprobs": lps, "scores": scores, **extra}


def run(groups, **kw):
    kw = {"pad_token_id": 0, "vocab_size": VOCAB, "max_len": 64, **kw}
    if PATH["mode"] == "lists":
        return tensorize(groups, **kw)
    return tensorize(parse_batch(json.dumps({"batch": groups}).encode()).groups, **kw)


def test_prompt_is_everything_before_the_first_trained_token_and_logprobs_need_no_shift():
    g = group([[10, 11, 12, 13]], [[-100, -100, 12, 13]], [[1.0, 1.0, -0.25, -0.75]])
    out = run([g])
    assert out.prompt_ids.tolist() == [[10, 11]]
    assert out.completion_ids.tolist() == [[12, 13]]
    assert out.completion_mask.tolist() == [[1, 1]]
    torch.testing.assert_close(out.sampling_logps, torch.tensor([[-0.25, -0.75]]))
    assert out.completion_lengths.tolist() == [2]


def test_masked_stretch_inside_the_completion_stays_untrained():
    # multi-turn: assistant token, a tool/user token (masked), assistant token
    g = group([[10, 11, 12, 13, 14]], [[-100, -100, 12, -100, 14]], [[1.0, 1.0, -0.1, 1.0, -0.3]])
    out = run([g])
    assert out.completion_ids.tolist() == [[12, 13, 14]]
    assert out.train_mask.tolist() == [[1, 0, 1]]  # trained: the model's tokens
    assert out.completion_mask.tolist() == [[1, 1, 1]]  # attended to: the masked turn too, as the server did
    torch.testing.assert_close(out.sampling_logps, torch.tensor([[-0.1, 0.0, -0.3]]))


def test_position_zero_is_always_prompt_even_if_its_mask_says_trained():
    g = group([[10, 11, 12]], [[10, 11, 12]], [[-0.1, -0.2, -0.3]])
    out = run([g])
    assert out.prompt_ids.tolist() == [[10]]
    assert out.completion_ids.tolist() == [[11, 12]]
    torch.testing.assert_close(out.sampling_logps, torch.tensor([[-0.2, -0.3]]))


def test_prompts_are_left_padded_and_completions_right_padded():
    g = group([[10, 11, 12, 13], [20, 21, 22, 23, 24, 25]],
              [[-100, -100, -100, 13], [-100, -100, 22, 23, 24, 25]])
    out = run([g], pad_token_id=7)
    assert out.prompt_ids.tolist() == [[10, 11, 12], [7, 20, 21]]
    assert out.prompt_mask.tolist() == [[1, 1, 1], [0, 1, 1]]
    assert out.completion_ids.tolist() == [[13, 7, 7, 7], [22, 23, 24, 25]]
    assert out.completion_mask.tolist() == [[1, 0, 0, 0], [1, 1, 1, 1]]
    assert out.completion_lengths.tolist() == [1, 4]


def reference(groups, pad, scale="group", default_t=1.0):
    """A plain per-sequence loop: what tensorize must equal."""
    rows = []
    for g in groups:
        s = torch.tensor(g["scores"], dtype=torch.float32)
        adv = s - s.mean()
        if scale == "group":
            adv = adv / ((s.std() if len(s) > 1 else torch.tensor(0.0)) + 1e-4)
        for tok, msk, lp, a in zip(g["tokens"], g["masks"], g["inference_logprobs"], adv.tolist()):
            first = next(i for i in range(1, len(tok)) if msk[i] != -100)
            rows.append((tok[:first], tok[first:], [int(m != -100) for m in msk[first:]], [1] * (len(tok) - first),
                         [x if m != -100 else 0.0 for x, m in zip(lp[first:], msk[first:])], a))
    P = max(len(r[0]) for r in rows)
    C = max(len(r[1]) for r in rows)
    return (torch.tensor([[pad] * (P - len(r[0])) + r[0] for r in rows]),
            torch.tensor([r[1] + [pad] * (C - len(r[1])) for r in rows]),
            torch.tensor([r[2] + [0] * (C - len(r[2])) for r in rows]),
            torch.tensor([r[3] + [0] * (C - len(r[3])) for r in rows]),
            torch.tensor([r[4] + [0.0] * (C - len(r[4])) for r in rows]),
            torch.tensor([r[5] for r in rows]))


@pytest.mark.parametrize("seed", range(5))
def test_random_batches_equal_a_per_sequence_reference(seed):
    rnd = random.Random(seed)
    groups = []
    for _ in range(rnd.randint(1, 6)):
        toks, msks, lps = [], [], []
        for _ in range(rnd.randint(1, 5)):
            n = rnd.randint(2, 20)
            t = [rnd.randrange(1, VOCAB) for _ in range(n)]
            start = rnd.randint(1, n - 1)
            m = [-100] * start + [x if rnd.random() > 0.2 else -100 for x in t[start:]]
            m[start] = t[start]
            toks.append(t)
            msks.append(m)
            lps.append([1.0 if x == -100 else -rnd.random() * 5 for x in m])
        groups.append(group(toks, msks, lps, [rnd.random() for _ in toks]))
    out = run(groups, pad_token_id=0)
    p, c, tm, cm, lp, adv = reference(groups, 0)
    assert out.rejections == []
    assert torch.equal(out.prompt_ids, p)
    assert torch.equal(out.prompt_mask, (torch.arange(p.shape[1]) >= (p == 0).sum(1, keepdim=True)).long())
    assert torch.equal(out.completion_ids, c)
    assert torch.equal(out.completion_mask, cm)
    assert torch.equal(out.train_mask, tm)
    torch.testing.assert_close(out.sampling_logps, lp)
    torch.testing.assert_close(out.advantages, adv)


def test_group_advantages_are_trl_formula_and_handle_mixed_group_sizes():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 1.0, 2.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    a = normalised_advantages(scores, groups, "group")
    std0 = math.sqrt(((0.5 ** 2) * 4) / 3)
    expected = [0.5 / (std0 + 1e-4), -0.5 / (std0 + 1e-4), -0.5 / (std0 + 1e-4), 0.5 / (std0 + 1e-4),
                1 / (1 + 1e-4), -1 / (1 + 1e-4), 0.0]
    torch.testing.assert_close(a, torch.tensor(expected))
    torch.testing.assert_close(normalised_advantages(scores, groups, "none"),
                               torch.tensor([0.5, -0.5, -0.5, 0.5, 1.0, -1.0, 0.0]))
    torch.testing.assert_close(normalised_advantages(scores, groups, "batch"),
                               torch.tensor([0.5, -0.5, -0.5, 0.5, 1.0, -1.0, 0.0]) / (scores.std() + 1e-4))


def test_equal_scores_give_zero_advantage_not_nan():
    a = normalised_advantages(torch.tensor([2.0, 2.0, 2.0]), torch.tensor([0, 0, 0]), "group")
    assert a.tolist() == [0.0, 0.0, 0.0]


def test_env_per_token_advantages_win_over_scores_and_zero_untrained_positions():
    with_adv = group([[10, 11, 12, 13]], [[-100, 11, -100, 13]], scores=[5.0],
                     advantages=[[9.0, 0.5, 7.0, -0.25]])
    without = group([[20, 21, 22], [30, 31, 32]], [[-100, 21, 22], [-100, 31, 32]], scores=[1.0, 0.0])
    out = run([with_adv, without], scale_rewards="none")
    assert out.advantages.shape == (3, 3)
    torch.testing.assert_close(out.advantages[0], torch.tensor([0.5, 0.0, -0.25]))
    torch.testing.assert_close(out.advantages[1], torch.tensor([0.5, 0.5, 0.5]))
    torch.testing.assert_close(out.advantages[2], torch.tensor([-0.5, -0.5, -0.5]))


def test_set_advantage_to_zero_override():
    g = group([[10, 11], [10, 12]], [[-100, 11], [-100, 12]], scores=[1.0, 0.0],
              overrides=[{"set_advantage_to_zero": True}, None])
    out = run([g], scale_rewards="none")
    torch.testing.assert_close(out.advantages, torch.tensor([0.0, -0.5]))


def test_temperature_precedence():
    g = group([[10, 11]] * 3, [[-100, 11]] * 3, overrides=[{"temperature": 0.3}, {}, None],
              generation_params={"temperature": 0.7}, group_overrides={"temperature": 0.9})
    h = group([[10, 11]], [[-100, 11]], group_overrides={"temperature": 0.9})
    k = group([[10, 11]], [[-100, 11]])
    out = run([g, h, k], default_temperature=1.25)
    assert out.temperatures.dtype == torch.float64
    assert out.temperatures.tolist() == [0.3, 0.7, 0.7, 0.9, 1.25]


GOOD = group([[10, 11, 12]], [[-100, 11, 12]], scores=[1.0])


@pytest.mark.parametrize("bad, words", [
    ("not a group", "not a ScoredDataGroup"),
    ({k: v for k, v in GOOD.items() if k != "inference_logprobs"}, "`inference_logprobs` is missing"),
    ({**GOOD, "scores": [float("nan")]}, "scores[0] is nan"),
    ({**GOOD, "scores": [1.0, 2.0]}, "`scores` has 2 entries for 1 sequences"),
    ({**GOOD, "masks": [[-100, 11]]}, "masks[0] has 2 entries but tokens[0] has 3 (ragged"),
    ({**GOOD, "tokens": [[10, 11, 12] * 30], "masks": [[-100] + [11] * 89], "inference_logprobs": [[1.0] * 90]},
     "more than max_token_len 64"),
    ({**GOOD, "tokens": [[10, 11, VOCAB + 5]], "masks": [[-100, 11, VOCAB + 5]]},
     f"tokens[0][2] = {VOCAB + 5} is not a token id"),
    ({**GOOD, "masks": [[-100, 11, 13]]}, "masks[0][2] = 13: a mask must be -100 or the token id (12)"),
    ({**GOOD, "inference_logprobs": [[1.0, 0.5, -0.1]]}, "inference_logprobs[0][1] = 0.5 at a trained position"),
    ({**GOOD, "inference_logprobs": [[1.0, float("inf"), -0.1]]}, "inference_logprobs[0][1] = inf"),
    ({**GOOD, "masks": [[-100, -100, -100]]}, "sequence 0 has no trained token"),
    ({**GOOD, "tokens": [["a", 11, 12]]}, "non-numeric entries"),
    ({**GOOD, "tokens": [[10]], "masks": [[10]], "inference_logprobs": [[1.0]]}, "has 1 token(s)"),
    ({**GOOD, "overrides": [{"temperature": 0}]}, "overrides[0].temperature is 0"),
    ({**GOOD, "generation_params": {"temperature": "hot"}}, "generation_params.temperature is 'hot'"),
    ({**GOOD, "advantages": [[0.0, float("nan"), 1.0]]}, "advantages[0][1] = nan is not finite"),
])
def test_bad_groups_are_rejected_with_a_reason_and_the_others_kept(bad, words):
    other = group([[40, 41, 42], [50, 51]], [[-100, 41, 42], [-100, 51]], scores=[1.0, 0.0])
    out = run([other, bad, other])
    assert [r.group for r in out.rejections] == [1]
    assert words in out.rejections[0].reason, out.rejections[0].reason
    assert out.num_groups == 2 and out.num_sequences == 4
    assert out.group_index.tolist() == [0, 0, 2, 2]
    assert out.completion_ids.tolist() == [[41, 42], [51, 0], [41, 42], [51, 0]]


def test_rejection_names_the_env():
    out = run([{**GOOD, "env_id": 3, "scores": [float("inf")]}])
    assert "(env_id 3)" in str(out.rejections[0])
    assert out.num_sequences == 0 and out.num_groups == 0


def test_unknown_scale_rewards_is_an_error():
    with pytest.raises(ValueError, match="scale_rewards"):
        run([GOOD], scale_rewards="max")


def test_env_score_reads_the_environments_scores_and_scores_eval_rows_with_the_eval_reward_funcs(monkeypatch):
    """Training rows carry the environment's score; rows of the local eval set (test_datasets) carry none and get
    the sum of grpo.atropos.eval_reward_funcs; without those, an eval row is an error that says what to set."""
    import grpo_plugin.config.lookups
    from grpo_plugin.config.lookups import run_config
    from grpo_plugin.producers.atropos import env_score
    from rewards.toy import digit_reward

    assert env_score(prompts=["a", "b"], completions=["x", "y"], atropos_score=[0.5, None]) == [0.5, None]
    completions = ["7 3 9", "no digits here", "12"]
    cfg = {"grpo": {"atropos": {"eval_reward_funcs": ["rewards.toy.digit_reward", "rewards.toy.digit_reward"]}}}
    monkeypatch.setattr(grpo_plugin.config.lookups, "loaded_run", lambda: run_config(cfg))
    expected = [2 * float(v) for v in digit_reward(prompts=["p"] * 3, completions=completions)]
    assert env_score(prompts=["p"] * 3, completions=completions) == expected
    assert expected[0] != expected[1]  # the toy reward tells these apart: the sum is really computed
    monkeypatch.setattr(grpo_plugin.config.lookups, "loaded_run", lambda: run_config({"grpo": {"atropos": {}}}))
    with pytest.raises(ValueError, match="needs grpo.atropos.eval_reward_funcs"):
        env_score(prompts=["p"], completions=["1"])


def test_the_producer_attends_to_a_masked_turn_and_trains_only_the_rest():
    """What the Atropos producer hands axolotl for a multi-turn sequence: the masked turn (a tool's output) is in
    completion_mask (the attention mask: later tokens are scored in the context they were sampled in) and 0 in
    tool_mask (no gradient, not in num_items_in_batch); a padding row (a rejected group's place) is in neither."""
    from types import SimpleNamespace

    from grpo_plugin.producers.atropos import AtroposProducer, PreparedBatch

    g = group([[10, 11, 12, 13, 14, 15]] * 2, [[-100, -100, 12, -100, -100, 15]] * 2,
              [[1.0, 1.0, -0.1, 1.0, 1.0, -0.3]] * 2, [1.0, 0.0])
    t = run([g])
    item = PreparedBatch(seq=0, meta={}, tensors=t, versions=None, env_ids=[None, None], prompts=["p", "p"],
                         completions=["c", "c"], completion_ids=[[12, 13, 14, 15]] * 2, groups_received=1)
    producer = AtroposProducer.__new__(AtroposProducer)
    producer.local_batch = producer.global_batch = 3  # one padding row
    producer.spec = SimpleNamespace(device="cpu", num_processes=1, process_index=0)
    data, _ = producer._rollout(item)
    assert data["completion_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]]
    assert data["tool_mask"].tolist() == [[1, 0, 0, 1]] * 3
    assert int(data["num_items_in_batch"]) == 4  # two trained tokens in each of the two real rows
