"""The `grpo:` block: the plugin's pydantic schema (pure pydantic, nothing outside `grpo:`).

Everything the plugin reads lives under ONE top-level key, `grpo:`; the settings model forbids unknown keys, so a
typo is an error instead of a silently dropped setting (axolotl's own models ignore unknown keys). axolotl merges
`grpo_plugin.args.GRPOPluginArgs` (this schema, then the cross-key checks, the sync mode's rules and
preflight) into its config model (`get_input_args`).
"""

from __future__ import annotations

import difflib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from grpo_plugin.config.modes import DEFAULT_SYNC, MODES, OWNERS, SYNC_MODES
from grpo_plugin.config.runtime import config_value, is_server_url


def _refuse_unknown_keys(model: type[BaseModel], data: Any, prefix: str) -> Any:
    """A typo is an error naming the key and the closest known one (axolotl's models drop unknown keys)."""
    if isinstance(data, dict):
        unknown = sorted(set(data) - set(model.model_fields))
        if unknown:
            hints = []
            for key in unknown:
                close = difflib.get_close_matches(str(key), list(model.model_fields), n=1)
                hints.append(f"{prefix}.{key}" + (f" (did you mean {prefix}.{close[0]}?)" if close else ""))
            raise ValueError(
                f"unknown key(s) in the {prefix}: block: {', '.join(hints)}. Known keys: "
                f"{', '.join(model.model_fields)} (see docs/config.md)."
            )
    return data


class AtroposEnvSpec(BaseModel):
    """One environment process `python -m grpo_plugin.atropos.launch` starts (the trainer ignores these)."""

    model_config = ConfigDict(extra="forbid")

    module: str = Field(min_length=1, description="Module run as `python -m <module> serve ...` (a BaseEnv).")
    args: list[str] = Field(default_factory=list, description="Extra CLI arguments, e.g. --env.group_size 8.")


class AtroposSettings(BaseModel):
    """`grpo.atropos:` — rollouts come from Atropos environments through the run-api. See docs/atropos.md."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(default="http://127.0.0.1:8000", description="The Atropos run-api (`run-api --port N`).")
    group_size: int | None = Field(
        default=None, ge=1,
        description="The environments' group size, when known: the batch size must be a multiple of it "
        "(checked here; otherwise when the first group arrives).")
    prefetch: int = Field(
        default=1, ge=1, le=64,
        description="Batches fetched ahead in the background (each one may add a step of policy lag).")
    max_token_len: int | None = Field(
        default=None, ge=2, description="Longest sequence accepted (default: sequence_len); longer groups are "
        "rejected.")
    reset_on_start: bool = Field(
        default=True, description="A fresh (not resumed) run calls the run-api's /reset_data before /register.")
    spool_dir: str | None = Field(
        default=None, description="Where fetched batches are kept until a checkpoint covers them "
        "(default <output_dir>/atropos_spool).")
    poll_interval: float = Field(default=0.2, gt=0, description="Seconds between /batch polls when none is "
                                 "ready (grows up to max_backoff while idle or failing).")
    max_backoff: float = Field(default=5.0, gt=0, description="Longest pause between /batch polls.")
    request_timeout: float = Field(default=60.0, gt=0, description="Seconds one run-api request may take.")
    wait_timeout: float = Field(
        default=1800.0, ge=0, description="Seconds the trainer waits for a batch before stopping with an error "
        "(0: wait forever). Progress is printed while it waits.")
    envs: list[AtroposEnvSpec] = Field(
        default_factory=list, description="Environments `python -m grpo_plugin.atropos.launch` starts.")
    eval_reward_funcs: list[str] = Field(
        default_factory=list, description="Import paths of TRL-style reward functions that score a local eval set "
        "(test_datasets, with eval_strategy) during training; the environments score the training rollouts.")
    offpolicy_warn: float = Field(
        default=0.05, gt=0, description="Nats per token: an environment whose sequences generated at the weights "
        "being trained (policy lag 0) differ from the trainer's logprobs by more on average is reported "
        "(atropos/onpolicy.py).")
    offpolicy_reject: float | None = Field(
        default=0.5, gt=0, description="Nats per token: a group of lag-0 sequences that differs by more trains "
        "nothing (null: never).")

    @model_validator(mode="before")
    @classmethod
    def _unknown_keys(cls, data: Any) -> Any:
        return _refuse_unknown_keys(cls, data, "grpo.atropos")

    @model_validator(mode="after")
    def _check(self) -> AtroposSettings:
        if not is_server_url(self.url):
            raise ValueError(f"grpo.atropos.url: {self.url!r} must look like http://HOST:PORT (the run-api)")
        self.url = self.url.rstrip("/")
        return self


class GRPOSettings(BaseModel):
    """Settings of the grpo_plugin (`grpo:` in the axolotl YAML). See docs/config.md."""

    model_config = ConfigDict(extra="forbid")

    sync: Literal[SYNC_MODES] = Field(
        default=DEFAULT_SYNC,
        description="How trained weights reach the vLLM server: ipc | lora_sync | restart.",
    )
    sync_interval: int = Field(
        default=1, ge=1, description="Push weights to the server every N optimizer steps."
    )
    max_policy_lag: int | None = Field(
        default=None, ge=0,
        description="Most optimizer steps the weights that sampled a rollout may lag behind the weights it trains; "
        "the producer waits for a newer version rather than exceed it (trl.async_prefetch). Default 1, or "
        "sync_interval - 1 when that is larger (the server holds each push for sync_interval steps). With "
        "trl.streaming_partial_batch it bounds every token (default 4 there, at least 1): an older group is "
        "generated again.",
    )
    stream_groups: int | None = Field(
        default=None, ge=1,
        description="trl.streaming_partial_batch: groups generating (or finished, not yet trained) at once. Default: "
        "two batches' worth.",
    )
    restart_strategy: Literal["reload", "process"] | None = Field(
        default=None,
        description="sync: restart only. reload (default): vLLM reloads the written weights in place; "
        "process: the managed server is restarted on them (needs managed_server: true).",
    )
    verify_sync: bool = Field(
        default=True,
        description="After every push, compare the server's logprobs of a fixed probe with the trainer's.",
    )
    verify_tolerance: float | None = Field(
        default=None,
        gt=0,
        description="Max mean |logprob diff| of the probe; default 1e-4 (fp32), 2e-2 (bf16), 1e-2 (fp16).",
    )
    probe_text: str = Field(
        default="The quick brown fox jumps over the lazy dog. 0123456789 9876543210",
        min_length=2,
        description="Text whose token logprobs are compared after each sync.",
    )
    managed_server: bool = Field(
        default=False,
        description="`axolotl train` starts the vLLM server itself (same config) and stops it at exit.",
    )
    num_servers: int = Field(
        default=1, ge=1, le=64,
        description="vLLM servers on consecutive ports from vllm.port (all started by `axolotl vllm-serve`, or "
        "by `axolotl train` with managed_server): rollouts are split across them by prompt group, every push goes "
        "to all and is verified on each. See docs/scaling.md.",
    )
    server_urls: list[str] | None = Field(
        default=None, min_length=1,
        description="The vLLM servers' base URLs, e.g. one per node started with `axolotl vllm-serve` (instead "
        "of vllm.host/vllm.port and num_servers; not with managed_server).",
    )
    server_timeout: float = Field(
        default=600.0, gt=0, description="Seconds to wait for the vLLM server to become healthy (at start, and "
        "for an unmanaged server to come back after it was lost)."
    )
    server_restarts: int = Field(
        default=3, ge=0, description="Managed server: how many times a lost (crashed or hung) server is restarted "
        "within server_restart_window before the run saves a checkpoint and stops. 0: never."
    )
    server_restart_window: float = Field(
        default=1800.0, gt=0, description="Seconds over which server_restarts is counted."
    )
    server_hang_timeout: float = Field(
        default=60.0, gt=0, description="A server that leaves /health unanswered this many seconds while a "
        "request is in flight counts as hung (lost) and is recovered like a crashed one."
    )
    server_log: str | None = Field(
        default=None,
        description="Managed server: file for the server's output (default <output_dir>/vllm_server.log).",
    )
    request_timeout: float = Field(
        default=300.0, gt=0, description="Seconds one generation/sync request may take."
    )
    sync_dir: str | None = Field(
        default=None,
        description="Where synced weights are written; default a fresh dir in /dev/shm (else the temp dir).",
    )
    weight_transport: Literal["auto", "shared", "network"] = Field(
        default="auto",
        description="lora_sync / restart: how a push's files reach each vLLM server. auto: each server that reads "
        "the trainer's sync_dir (checked before the first push) is handed the path, the others are sent the files "
        "over HTTP; shared: every server must read sync_dir (refused before the first push otherwise); network: "
        "always sent over HTTP.",
    )
    delta_anchor_every: int | None = Field(
        default=None, ge=0,
        description="sync: restart (reload) with bf16/fp16 weights: a full push every N pushes, and between them "
        "only the elements that changed (exact; refused by a server without the base, then a full push). "
        "Default: 10 when a server is sent the weights over the network, else off; 0: off. See docs/modes.md.",
    )
    ipc_fence: Literal["trainer", "server"] | None = Field(
        default=None,
        description="sync: ipc only. How generation is kept off the weights while the optimizer writes them: "
        "trainer (default; the trainer is the server's only client) or server (vLLM /pause + /resume around "
        "each step, for servers other clients also use).",
    )
    ipc_gemm: Literal["onednn", "linear"] | None = Field(
        default=None,
        description="sync: ipc only, vLLM-CPU. GEMM the server computes with on the shared weights: onednn "
        "(default; oneDNN on the plain weight) or linear (torch.nn.functional.linear).",
    )
    adapter_name: str = Field(
        default="grpo-policy", min_length=1, description="Name the trained LoRA adapter has on the server."
    )
    rollout_timeout: float = Field(
        default=1800.0, gt=0, description="trl.rollout_func: seconds one call (a batch's rollouts, every turn) may "
        "take before the run stops with an error naming it."
    )
    offpolicy_reject: float | None = Field(
        default=0.5, gt=0, description="trl.rollout_func / grpo.tools / environment_factory: nats per token. A row "
        "sampled at the weights its step trains (policy lag 0) whose sampling logprobs differ from the trainer's by "
        "more on average was not sampled by the policy (another model, truncated sampling, another temperature): "
        "see offpolicy_action. null: never checked (docs/agents.md).")
    offpolicy_action: Literal["stop", "drop"] = Field(
        default="stop", description="What a row over offpolicy_reject does: stop (the run stops with the cause, a "
        "checkpoint saved first) or drop (the row trains nothing; counted as agent_offpolicy_rows).")
    tools: list[str] = Field(
        default_factory=list, description="Tools the model may call (import paths of functions with type hints and "
        "an Args docstring, as TRL's `tools`): the plugin runs TRL's tool-calling loop (docs/agents.md).")
    environment_factory: str | dict[str, str] | None = Field(
        default=None, description="An environment class (import path), or {name: path} picked per row by the "
        "dataset's `environment` column (TRL's `environment_factory`): one instance per rollout, its public methods "
        "the rollout's tools, reset(**row) before it, an optional get_reward() (docs/agents.md).")
    max_tool_calling_iterations: int | None = Field(
        default=None, ge=0, description="grpo.tools / environment_factory: rounds of tool calls per rollout at most "
        "(TRL's max_tool_calling_iterations; default: until the completion budget is spent).")
    tool_timeout: float = Field(
        default=60.0, gt=0, description="grpo.tools / environment_factory: seconds one tool call may take before "
        "the model reads a timeout error instead of its result.")
    seeded_sampling: bool = Field(
        default=False, description="Every prompt's generation request carries a seed of its own (from `seed`, the "
        "step and the prompt), so what the server samples does not depend on how it batched the requests: two runs "
        "of one config without trl.async_prefetch sample the same rollouts. The plugin's vLLM-CPU servers then run "
        "without chunked prefill (needs vllm.max_model_len). See docs/config.md.")
    metrics: bool = Field(
        default=True, description="Write grpo_metrics.jsonl, grpo_summary.json and grpo_curves.png."
    )
    atropos: AtroposSettings | None = Field(
        default=None,
        description="Train on pre-scored rollouts from Atropos environments (docs/atropos.md) instead of "
        "generating from `datasets:` with `trl.reward_funcs`.",
    )

    @model_validator(mode="before")
    @classmethod
    def _unknown_keys(cls, data: Any) -> Any:
        return _refuse_unknown_keys(cls, data, "grpo")

    @property
    def policy_lag_bound(self) -> int:
        return self.max_policy_lag if self.max_policy_lag is not None else max(1, self.sync_interval - 1)

    @property
    def stream_lag_bound(self) -> int:
        """grpo.max_policy_lag with streaming: every token's bound (4 unless set; never below the push interval)."""
        return self.max_policy_lag if self.max_policy_lag is not None else max(4, self.sync_interval - 1)

    @model_validator(mode="after")
    def _strategy(self) -> GRPOSettings:
        if self.max_policy_lag is not None and self.max_policy_lag < self.sync_interval - 1:
            raise ValueError(
                f"grpo.max_policy_lag: {self.max_policy_lag} is below grpo.sync_interval - 1 = "
                f"{self.sync_interval - 1}: with a push every {self.sync_interval} steps the server's weights are "
                f"up to {self.sync_interval - 1} steps old, so rollouts would wait forever. Raise max_policy_lag "
                "or lower sync_interval.")
        mode = MODES[self.sync]
        for key in type(self).model_fields:  # a key of one mode set under another (in the schema's order)
            owner = OWNERS.get(key)
            if owner not in (None, mode) and getattr(self, key) is not None:
                raise ValueError(f"grpo.{key} only applies to `grpo.sync: {owner.name}` (sync is {self.sync!r}). "
                                 f"Remove grpo.{key}.")
        if self.atropos is not None:
            if self.ipc_fence == "trainer":
                raise ValueError(
                    "grpo.ipc_fence: trainer assumes the trainer is the server's only client, but with "
                    "grpo.atropos the environments generate on it too. Remove grpo.ipc_fence (with atropos it "
                    "defaults to server: vLLM pauses generation around each optimizer step).")
            if self.restart_strategy == "process":
                raise ValueError(
                    "grpo.restart_strategy: process restarts the vLLM server on every sync, which breaks the "
                    "Atropos environments generating on it (their requests fail while it is down). Use "
                    "`grpo.restart_strategy: reload` (the default).")
        mode.settle(self)  # the mode's own rules, and its keys' defaults (config/modes.py)
        self._check_servers()
        if self.restart_strategy == "process" and not self.managed_server:
            raise ValueError(
                "grpo.restart_strategy: process restarts the vLLM server on every sync, and the trainer only "
                "restarts a server it started itself. Set `grpo.managed_server: true`, or use "
                "`grpo.restart_strategy: reload` (the default) with a server started by `axolotl vllm-serve`."
            )
        return self


    def _check_servers(self) -> None:
        if self.server_urls is not None:
            bad = [u for u in self.server_urls if not is_server_url(u)]
            if bad:
                raise ValueError(f"grpo.server_urls: {bad} must look like http://HOST:PORT (a vLLM server)")
            if len(set(u.rstrip("/") for u in self.server_urls)) != len(self.server_urls):
                raise ValueError(f"grpo.server_urls lists a server twice: {self.server_urls}")
            if self.num_servers != 1:
                raise ValueError("grpo.server_urls and grpo.num_servers both say which servers to use: keep one "
                                 "(server_urls for servers started elsewhere; num_servers for servers on "
                                 "consecutive ports of this machine).")
            if self.managed_server:
                raise ValueError("grpo.server_urls names servers started elsewhere, but grpo.managed_server: true "
                                 "starts them itself. Use grpo.num_servers with managed_server, or remove "
                                 "managed_server.")
            MODES[self.sync].check_server_urls(self.server_urls)
        if self.servers > 1 and self.atropos is not None:
            raise ValueError(
                f"grpo.atropos with {self.servers} vLLM servers: the Atropos environments generate on one server "
                "(their own server URL), so the others would sit idle and the policy-version ledger would be split. "
                "Use one server with grpo.atropos.")

    @property
    def servers(self) -> int:
        """How many vLLM servers the trainer uses."""
        return server_count(self)


def server_count(grpo: Any) -> int:
    """How many vLLM servers a `grpo:` block (dict or settings) names: its server_urls, else num_servers."""
    urls = config_value(grpo, "server_urls")
    return len(urls) if urls else int(config_value(grpo, "num_servers") or 1)
