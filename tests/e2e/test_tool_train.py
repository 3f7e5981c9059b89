"""Tool calling through `axolotl train` (configs/agents/quickstart_environment.yaml with a standalone tool and more
environments beside it): the tasks of rewards/toy_tools.py and the code agent of rewards/code_agent.py on the tiny
model taught the call formats (`python -m grpo_plugin.demo --tool-warm-start`), full fine-tuning (`restart`) on the
session's full-weight server, unmanaged (its first push loads the run's own weights). One run holds every way in:
`grpo.tools: [lookup]` and `grpo.environment_factory: {vault: Vault, desk: Desk, code: CodeAgent}`, the dataset's
`environment` column picking each prompt's — a vault row calls its own instance's `lookup()` (the method replaces
the standalone tool), a desk row the standalone one, a code row `run_tests(code)`, run in the sandbox against the
example test (the rows of configs/agents/quickstart_code_agent.yaml, as its transform makes them).

Checked: every push verified, every turn sampled by the weights the step trains, the share of rollouts that call a
tool rising, the reward rising, the tool results in no loss (axolotl's `tool_mask`) and in no length metric, the
`Vault` and `CodeAgent` reward columns (get_reward, read from each rollout's own instance) on their rows only, and
`run_tests` calls executed in the sandbox, with the hidden tests passed by some program. TRL's contract as users
write for it (tests/e2e/trl_user_env.py): a `store` environment whose reset needs its row's column, a reward
`looked(environments, **kwargs)`; and evaluation (one held-out prompt per environment, at the start and the end) on
training's rollout path: named environments reset with their rows, tool messages reaching the rewards, the eval
reward rising."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from grpo_plugin.reporting.metrics import report
from tests.e2e.test_axolotl_train import quickstart, train

pytestmark = pytest.mark.e2e
STEPS = 16
ROWS = 32  # completions per step: 4 prompts x 8 generations
# evaluation at the start and the end: 4 held-out prompts (one per environment) x 8 generations
EVAL = {"eval_strategy": "steps", "eval_steps": STEPS, "eval_batch_size": 32}


@pytest.fixture(scope="module")
def tool_model(tiny_model_dir, tmp_path_factory) -> tuple[Path, Path]:
    """The tiny model taught the tool-call formats, and the prompts: lookup rows alternating vault / desk, and
    one code row in three, as rewards.code_agent_transform makes them."""
    from grpo_plugin.demo import tools
    from rewards.code_agent import code_agent_transform

    root = tmp_path_factory.mktemp("tools")
    data = tools.build_tool_task(root / "lookup.jsonl", n=128)
    lookups = [json.loads(x) for x in data.read_text().splitlines()]
    transform, _ = code_agent_transform()
    code_rows = tools.build_code_agent_task(root / "code_agent.jsonl", n=1).read_text().splitlines()
    code = transform(json.loads(code_rows[0]))  # as configs/agents/quickstart_code_agent.yaml's rows become
    rows = []
    for i, r in enumerate(lookups):  # vault, desk, vault, store, ...: a store row carries its own `secret` column
        env = ("vault", "desk", "vault", "store")[i % 4]
        rows.append({**r, "environment": env, **({"secret": str(i % 10)} if env == "store" else {})})
        if i % 2:
            rows.append({**code, "environment": "code"})
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # the eval set: one held-out prompt per environment (keys the training rows do not have)
    evals = root / "eval.jsonl"
    held_out = [{"prompt": [{"role": "user", "content": f"key {k}"}], "environment": env,
                 **({"secret": "7"} if env == "store" else {})}
                for k, env in (("zqy", "vault"), ("yxw", "desk"), ("wvu", "store"))] + [{**code, "environment": "code"}]
    evals.write_text("".join(json.dumps(r) + "\n" for r in held_out))
    return tools.warm_start_tools(tiny_model_dir, root / "tiny-qwen2-tools"), data, evals


def test_tools_and_environments_the_model_learns_to_call_lookup(tmp_path, tool_model, cache_env,
                                                                 full_weight_server):
    model, data, evals = tool_model
    path, cfg = quickstart(tmp_path, model, data, "agents/quickstart_environment.yaml", server=full_weight_server,
                           max_steps=STEPS, learning_rate=1e-4, **EVAL,
                           test_datasets=[{"path": str(evals), "ds_type": "json", "split": "train"}],
                           trl={"max_completion_length": 224, "reward_funcs": [
                               "rewards.toy_tools.answer_matches_tool", "tests.e2e.trl_user_env.looked"]},
                           grpo={"tools": ["rewards.toy_tools.lookup"], "max_tool_calling_iterations": 2,
                                 "environment_factory": {"vault": "rewards.toy_tools.Vault",
                                                         "desk": "rewards.toy_tools.Desk",
                                                         "store": "tests.e2e.trl_user_env.Store",
                                                         "code": "rewards.code_agent.CodeAgent"}})
    proc = train(path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    assert not re.search(r"Traceback", log), log[-3000:]
    out = Path(cfg["output_dir"])
    recs = [json.loads(x) for x in (out / "grpo_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(1, STEPS + 1))
    assert all(r["sync_logprob_diff"] is not None and r["sync_logprob_diff"] <= 1e-4 for r in recs), recs
    assert [r["policy_lag"] for r in recs] == [0] * STEPS
    for r in recs:
        assert r["agent_unknown_origin_tokens"] == 0, r  # every model turn came through the plugin's handle
        assert r["agent_env_tokens"] > 0 and r["agent_tool_calls"] > 0, r
    # the length metrics count the model's tokens only: the tool results are not the model's
    lengths = [float(x) for x in re.findall(r"'completions/mean_length': '([^']+)'", log)]
    assert len(lengths) == STEPS
    for r, length in zip(recs, lengths):  # the log keeps 4 significant digits
        mean = r["agent_model_tokens"] / ROWS
        assert abs(length - mean) <= max(0.006, 0.0006 * mean), (length, r)
    # get_reward() pays a vault rollout whose own instance's lookup() ran; desk rows have no Vault column (NaN,
    # left out of the mean; a step of desk prompts only logs none). It follows the call rate up.
    logged = [ast.literal_eval(m) for m in re.findall(r"\{'loss': [^{}]*\}", log)]
    assert len(logged) == STEPS
    vault = [float(d["rewards/Vault/mean"]) for d in logged if d.get("rewards/Vault/mean") is not None]
    third = len(vault) // 3
    assert len(vault) >= STEPS // 2 and sum(vault[-third:]) > sum(vault[:third]), vault
    # the code rows: every run_tests call ran in the sandbox (a sandbox failure would be a failed call), and the
    # hidden tests, judged there when a rollout ended, passed for some program (CodeAgent's column)
    code = [float(d["rewards/CodeAgent/mean"]) for d in logged if d.get("rewards/CodeAgent/mean") is not None]
    assert code and max(code) > 0, code
    ran = sum(r.get("agent_tool/run_tests/calls", 0) - r.get("agent_tool/run_tests/failures", 0) for r in recs)
    assert ran > 0, recs  # calls that returned the sandbox's verdict
    s = json.loads((out / "grpo_summary.json").read_text())
    assert s["all_syncs_verified"] is True, s
    a = s["agent"]
    assert a["tool_call_rate_last_20pct"] > a["tool_call_rate_first_20pct"] + 0.1, a
    assert s["reward_mean_last_20pct"] > s["reward_mean_first_20pct"], s
    assert a["per_tool"]["lookup"]["calls"] == sum(r.get("agent_tool/lookup/calls", 0) for r in recs) > 0, a
    # TRL's environment contract: `looked(environments, **kwargs)` got the rows' own instances (it would have
    # stopped the run on a private key); a store row's reset(secret=...) ran on its own column
    looked = [float(d["rewards/looked/mean"]) for d in logged]
    assert max(looked) > 0, looked
    # evaluation on training's rollout path: at the start and the end, every environment reset with its row, the
    # rewards given the tool messages (answer_matches_tool pays nothing without them), rising with training
    evals = [json.loads(x) for x in (out / "grpo_eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, STEPS], evals
    rewards = [e["reward"] for e in evals]
    assert rewards[0] > 0 and rewards[-1] > rewards[0], rewards
    eval_logs = [ast.literal_eval(m) for m in re.findall(r"\{'eval_loss': [^{}]*\}", log)]
    assert len(eval_logs) == 2 and all("eval_agent_tool/lookup/calls" in d for d in eval_logs), eval_logs
    assert any(float(d["eval_rewards/answer_matches_tool/mean"]) > 0 for d in eval_logs), eval_logs
    for d in eval_logs:  # each environment evaluated on its row: a number in the Vault and CodeAgent columns
        code, vault = float(d["eval_rewards/CodeAgent/mean"]), float(d["eval_rewards/Vault/mean"])
        assert code == code and vault == vault, d  # not NaN: their rows were reset with their columns and scored
    printed = report(out)  # `python -m grpo_plugin.reporting <output_dir>`, and the end of `axolotl train`
    assert "rollouts calling a tool" in printed and "lookup" in printed
    assert "rollouts calling a tool" in log
