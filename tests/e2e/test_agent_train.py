"""Multi-turn agents through `axolotl train`: `trl.rollout_func` (configs/agents/quickstart_rollout_func.yaml, the
two-turn agent of rewards/toy_agent.py: the model answers, the environment replies, the model answers again), on
the session servers, unmanaged (tests/conftest.py).

- lora_sync, a third-party agent (tests/e2e/third_party_agent.py): its first turn through the plugin's handle
  (`trainer.grpo_generation`), its second through the OpenAI route naming the base model as an OpenAI client finds
  it, sampled by the adapter being trained all the same (the lag-0 logprob check holds), until it samples at another
  temperature and the check stops the run; on a server that cannot read the trainer's sync directory (the adapter
  versions go over HTTP);
- restart (full weights, reloaded in place) with `trl.async_prefetch` (the function runs in axolotl's background
  thread while the step before trains), generating through the server's OpenAI completions route as NeMo Gym's
  agents do: every model token counted as of unknown origin (not generated through the handle), the reward rising
  all the same: the route samples the weights being trained, one version behind (the lag bound).

In both: every push verified, the reward rising, the environment's tokens in no loss (axolotl's `tool_mask`) and in
no token count, two model turns per rollout. ipc's agent runs need managed servers of their own and are folded
into runs that start them anyway: two trainer ranks on two servers (tests/e2e/test_scale_train.py) and the server
killed between a rollout's two turns (tests/e2e/test_server_faults.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import requests
import yaml

from grpo_plugin.reporting.metrics import report
from rewards.toy_agent import ENV_REPLY
from tests.e2e.test_axolotl_train import quickstart, sampling_gaps, train

pytestmark = pytest.mark.e2e
STEPS = 16  # the tiny task's reward takes off around steps 3-10
CONFIG = "agents/quickstart_rollout_func.yaml"


def _full_weights(path: Path, cfg: dict) -> None:
    """The config without its LoRA adapter: full fine-tuning (restart, ipc)."""
    for key in ("adapter", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"):
        cfg.pop(key)
    path.write_text(yaml.safe_dump(cfg))


def _check(cfg: dict, log: str, *, handle: bool, prefetched: bool = False) -> list[dict]:
    out = Path(cfg["output_dir"])
    recs = [json.loads(x) for x in (out / "grpo_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(1, STEPS + 1))
    assert all(r["sync_logprob_diff"] is not None and r["sync_logprob_diff"] <= 1e-4 for r in recs), recs
    lags = [r["policy_lag"] for r in recs]
    if prefetched:  # every turn of a rollout prefetched while the step before trained: one version behind
        assert lags[0] == 0 and all(lag in (0, 1) for lag in lags) and lags.count(1) >= STEPS // 2, lags
    else:  # every turn sampled by the weights the step trains
        assert lags == [0] * STEPS, lags
    for r in recs:
        assert r["agent_turns_mean"] == 2.0, r
        assert r["agent_env_tokens"] == 32 * len(ENV_REPLY.encode()), r  # the byte tokenizer: a token per byte
        assert r["agent_model_tokens"] > 0
        assert r["agent_unknown_origin_tokens"] == (0 if handle else r["agent_model_tokens"]), r
        assert r["agent_generate_calls"] == (2 if handle else 0), r
    # TRL's token count and length metrics count the model's tokens only (tool_mask): the completion length
    # logged is the model tokens' mean, not the whole completion's
    lengths = [float(x) for x in re.findall(r"'completions/mean_length': '([^']+)'", log)]
    assert len(lengths) == STEPS
    for r, length in zip(recs, lengths):
        assert abs(length - r["agent_model_tokens"] / 32) < 0.006, (length, r)  # the log rounds to 2 decimals
    # the trainer scores each model token with the context the server sampled it in, the environment's reply
    # included (it stays in the attention mask): at lag 0 in fp32 the two logprobs agree to numerics
    gaps = sampling_gaps(log)
    assert len(gaps) == STEPS
    assert max(g for g, lag in zip(gaps, lags) if lag == 0) < 1e-4, list(zip(gaps, lags))
    s = json.loads((out / "grpo_summary.json").read_text())
    assert s["all_syncs_verified"] is True, s
    assert s["reward_mean_last_20pct"] > s["reward_mean_first_20pct"] + 0.2, s
    assert s["agent"]["model_tokens"] == sum(r["agent_model_tokens"] for r in recs), s["agent"]
    assert "agent: 2.00 model turns per rollout" in report(out)  # `python -m grpo_plugin.reporting <output_dir>`
    assert not re.search(r"Traceback", log), log[-3000:]
    return recs


def test_a_third_party_agent_on_the_openai_route_learns_in_lora_sync_until_it_goes_off_policy(
        tmp_path, tiny_model_dir, tiny_data_file, cache_env, blind_server):
    """tests/e2e/third_party_agent.py: turn 1 through the handle, turn 2 through the OpenAI route naming the first
    model of /v1/models (the base model) on the server's plain address. In lora_sync that name samples the adapter
    being trained: every model token of steps 1-16 agrees with the trainer's logprobs at lag 0 and the reward rises
    (it took off as late as steps 10-12 in some runs: 16 leave it room). From step 17 the agent samples turn 2 at
    another temperature: the lag-0 check stops the run with the cause, step 16 saved first. On a server that cannot
    read the trainer's sync directory (tests/conftest.py `blind_server`, as a server on another host): every adapter
    version sent over HTTP, every push verified."""
    from tests.e2e.third_party_agent import OFF_POLICY_FROM

    path, cfg = quickstart(tmp_path, tiny_model_dir, tiny_data_file, CONFIG, server=blind_server,
                           max_steps=OFF_POLICY_FROM + 4,
                           trl={"rollout_func": "tests.e2e.third_party_agent.handle_then_openai"})
    proc = train(path)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0, log[-3000:]
    assert re.search(r"RolloutFuncError: trl\.rollout_func tests\.e2e\.third_party_agent\.handle_then_openai: \d+ "
                     rf"of 32 rows sampled at the weights this step trains \(policy version {OFF_POLICY_FROM}\) "
                     r"differ from the trainer's logprobs by more than grpo\.offpolicy_reject=0\.5 nats/token",
                     log), log[-4000:]
    assert "another temperature than trl.temperature" in log
    out = Path(cfg["output_dir"])
    assert f"was saved to {out / f'checkpoint-{OFF_POLICY_FROM}'}" in log
    recs = [json.loads(x) for x in (out / "grpo_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(1, OFF_POLICY_FROM + 1))
    assert all(r["sync_logprob_diff"] is not None and r["sync_logprob_diff"] <= 1e-4 for r in recs), recs
    assert [r["policy_lag"] for r in recs] == [0] * OFF_POLICY_FROM
    for r in recs:  # turn 2's tokens did not come through the handle, and were sampled by the policy all the same
        assert r["agent_generate_calls"] == 1 and r["agent_unknown_origin_tokens"] < r["agent_model_tokens"], r
        assert r["agent_logprob_gap_lag0"] < 1e-4 and r["agent_offpolicy_rows"] == 0, r
    # (a turn-2 stretch equal to the start of a turn 1 the handle returned counts as known: the tiny model repeats)
    assert sum(r["agent_unknown_origin_tokens"] for r in recs) > 0, recs
    gaps = sampling_gaps(log)
    assert len(gaps) == OFF_POLICY_FROM and max(gaps) < 1e-4, gaps
    rewards = [r["reward_mean"] for r in recs]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.2, rewards
    assert f"the vLLM server at {blind_server[1].base_url} cannot read the sync directory" in log
    # the run is over (stopped): the server's base name samples the base model again, for whoever uses it next
    assert requests.get(f"{blind_server[1].base_url}/grpo/policy", timeout=30).json()["model"] is None


def test_rollout_func_two_turns_through_the_openai_route_restart(tmp_path, tiny_model_dir, tiny_data_file,
                                                                cache_env, full_weight_server):
    path, cfg = quickstart(tmp_path, tiny_model_dir, tiny_data_file, CONFIG, server=full_weight_server,
                           max_steps=STEPS, grpo={"sync": "restart"}, learning_rate=1e-4,
                           trl={"rollout_func": "rewards.toy_agent.two_turns_openai", "async_prefetch": True})
    _full_weights(path, cfg)
    proc = train(path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    _check(cfg, log, handle=False, prefetched=True)

