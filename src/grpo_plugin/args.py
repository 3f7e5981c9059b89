"""The `grpo:` block: the plugin's pydantic schema extension.

axolotl merges `preflight.GRPOPluginArgs` (this schema, then the cross-key checks below, then preflight) into its
config model (`get_input_args`). Everything the plugin reads lives under ONE top-level key, `grpo:`; the settings
model forbids unknown keys, so a typo is an error instead of a silently dropped setting (axolotl's own models
ignore unknown keys).
"""

from __future__ import annotations

import difflib
import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SYNC_MODES = ("ipc", "lora_sync", "restart")
LOCAL_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0", "::1", "")

# Tolerance of the post-sync probe: mean |logprob_vLLM - logprob_trainer| over the probe tokens.
DEFAULT_TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2, "float16": 1e-2}


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

    @model_validator(mode="before")
    @classmethod
    def _unknown_keys(cls, data: Any) -> Any:
        return _refuse_unknown_keys(cls, data, "grpo.atropos")

    @model_validator(mode="after")
    def _check(self) -> AtroposSettings:
        from urllib.parse import urlparse

        parsed = urlparse(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.port is None:
            raise ValueError(f"grpo.atropos.url: {self.url!r} must look like http://HOST:PORT (the run-api)")
        self.url = self.url.rstrip("/")
        return self


class GRPOSettings(BaseModel):
    """Settings of the grpo_plugin (`grpo:` in the axolotl YAML). See docs/config.md."""

    model_config = ConfigDict(extra="forbid")

    sync: Literal["ipc", "lora_sync", "restart"] = Field(
        default="lora_sync",
        description="How trained weights reach the vLLM server: ipc | lora_sync | restart.",
    )
    sync_interval: int = Field(
        default=1, ge=1, description="Push weights to the server every N optimizer steps."
    )
    max_policy_lag: int | None = Field(
        default=None, ge=0,
        description="Most optimizer steps the weights that sampled a rollout may lag behind the weights it trains; "
        "the producer waits for a newer version rather than exceed it (trl.async_prefetch). Default 1, or "
        "sync_interval - 1 when that is larger (the server holds each push for sync_interval steps).",
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

    @model_validator(mode="after")
    def _strategy(self) -> GRPOSettings:
        if self.max_policy_lag is not None and self.max_policy_lag < self.sync_interval - 1:
            raise ValueError(
                f"grpo.max_policy_lag: {self.max_policy_lag} is below grpo.sync_interval - 1 = "
                f"{self.sync_interval - 1}: with a push every {self.sync_interval} steps the server's weights are "
                f"up to {self.sync_interval - 1} steps old, so rollouts would wait forever. Raise max_policy_lag "
                "or lower sync_interval.")
        if self.restart_strategy is not None and self.sync != "restart":
            raise ValueError(
                f"grpo.restart_strategy only applies to `grpo.sync: restart` (sync is {self.sync!r}). "
                "Remove grpo.restart_strategy."
            )
        for key in ("ipc_fence", "ipc_gemm"):
            if getattr(self, key) is not None and self.sync != "ipc":
                raise ValueError(f"grpo.{key} only applies to `grpo.sync: ipc` (sync is {self.sync!r}). "
                                 f"Remove grpo.{key}.")
        if self.atropos is not None:
            if self.sync == "ipc" and self.ipc_fence == "trainer":
                raise ValueError(
                    "grpo.ipc_fence: trainer assumes the trainer is the server's only client, but with "
                    "grpo.atropos the environments generate on it too. Remove grpo.ipc_fence (with atropos it "
                    "defaults to server: vLLM pauses generation around each optimizer step).")
            if self.restart_strategy == "process":
                raise ValueError(
                    "grpo.restart_strategy: process restarts the vLLM server on every sync, which breaks the "
                    "Atropos environments generating on it (their requests fail while it is down). Use "
                    "`grpo.restart_strategy: reload` (the default).")
        if self.sync == "ipc":
            ranks = int(os.environ.get("WORLD_SIZE", "1"))
            if ranks > 1 and self.ipc_fence == "trainer":
                raise ValueError(
                    f"grpo.ipc_fence: trainer assumes one trainer process generates on the server, but this run has "
                    f"{ranks} ranks: one may generate while rank 0's optimizer writes the shared weights. Remove "
                    "grpo.ipc_fence (with several ranks it defaults to server: vLLM pauses generation around each "
                    "optimizer step).")
            self.ipc_fence = self.ipc_fence or ("server" if self.atropos is not None or ranks > 1 else "trainer")
            self.ipc_gemm = self.ipc_gemm or "onednn"
            if self.sync_interval != 1:
                raise ValueError(
                    f"grpo.sync_interval: {self.sync_interval} does not apply to `grpo.sync: ipc`: the server "
                    "computes with the trainer's own weights, so every optimizer step is visible at once. "
                    "Remove grpo.sync_interval."
                )
        self._check_servers()
        if self.sync == "restart" and self.restart_strategy is None:
            self.restart_strategy = "reload"
        if self.restart_strategy == "process" and not self.managed_server:
            raise ValueError(
                "grpo.restart_strategy: process restarts the vLLM server on every sync, and the trainer only "
                "restarts a server it started itself. Set `grpo.managed_server: true`, or use "
                "`grpo.restart_strategy: reload` (the default) with a server started by `axolotl vllm-serve`."
            )
        return self


    def _check_servers(self) -> None:
        from urllib.parse import urlparse

        if self.server_urls is not None:
            bad = [u for u in self.server_urls
                   if urlparse(u).scheme not in ("http", "https") or not urlparse(u).hostname
                   or urlparse(u).port is None]
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
            if self.sync == "ipc":
                remote = [u for u in self.server_urls if urlparse(u).hostname not in LOCAL_HOSTS]
                if remote:
                    raise ValueError(f"grpo.sync: ipc shares one copy of the weights on this machine; "
                                     f"grpo.server_urls {remote} are elsewhere. Use grpo.sync: restart or lora_sync.")
        if self.servers > 1 and self.atropos is not None:
            raise ValueError(
                f"grpo.atropos with {self.servers} vLLM servers: the Atropos environments generate on one server "
                "(their own server URL), so the others would sit idle and the policy-version ledger would be split. "
                "Use one server with grpo.atropos.")

    @property
    def servers(self) -> int:
        """How many vLLM servers the trainer uses."""
        return server_count(self)


def _get(data: Any, key: str) -> Any:
    if isinstance(data, dict):
        return data.get(key)
    return getattr(data, key, None)


def server_count(grpo: Any) -> int:
    """How many vLLM servers a `grpo:` block (dict or settings) names: its server_urls, else num_servers."""
    urls = _get(grpo, "server_urls")
    return len(urls) if urls else int(_get(grpo, "num_servers") or 1)


def check_cross_keys(data: dict) -> None:
    """Checks that need keys outside `grpo:`. Raises ValueError naming the key and the fix."""
    grpo = data.get("grpo")
    if grpo is None:
        return
    sync = _get(grpo, "sync") or "lora_sync"
    rl = getattr(data.get("rl"), "value", data.get("rl"))
    if str(rl).lower() != "grpo":
        raise ValueError(f"grpo: the grpo_plugin needs `rl: grpo` in the config (got rl: {rl!r}).")
    if sync == "lora_sync" and data.get("adapter") not in ("lora", "qlora"):
        raise ValueError(
            "grpo.sync: lora_sync trains a LoRA adapter and hot-swaps it into vLLM, but `adapter:` is "
            f"{data.get('adapter')!r}. Fix: add `adapter: lora` (with lora_r, lora_alpha, "
            "lora_target_modules), or choose another grpo.sync mode."
        )
    if sync == "restart" and data.get("adapter"):
        raise ValueError(
            f"grpo.sync: restart syncs full weights for full fine-tuning, but `adapter: {data.get('adapter')}` "
            "is set. Fix: use `grpo.sync: lora_sync` to train and hot-swap the adapter, or remove `adapter:`."
        )
    if sync == "ipc":
        _check_ipc(data)
    if _get(grpo, "atropos") is not None:
        _check_atropos(data, _get(grpo, "atropos"))
    _check_sharded(data, sync)
    trl = data.get("trl") or {}
    if isinstance(trl, dict):
        if trl.get("use_vllm") is False:
            raise ValueError(
                "trl.use_vllm: false, but the grpo_plugin generates on a vLLM server. Remove "
                "trl.use_vllm (the plugin sets it) or set it to true."
            )
        if trl.get("vllm_mode") not in (None, "server"):
            raise ValueError(
                f"trl.vllm_mode: {trl.get('vllm_mode')!r} (TRL's vLLM inside the trainer process) is not supported by "
                "the grpo_plugin: it generates on a vLLM server (`axolotl vllm-serve`, or grpo.managed_server: true). "
                "On one GPU, share the GPU with that server: `grpo.sync: ipc` is the plugin's colocated mode (the "
                "trainer and the server use ONE copy of the weights; its vLLM side has not run on a GPU yet, every "
                "step is verified: docs/modes.md#ipc-on-cuda), or `lora_sync` / `restart` with "
                "vllm.gpu_memory_utilization leaving room for the trainer (docs/gpu.md). Remove trl.vllm_mode (the "
                "plugin sets `server`)."
            )
        if trl.get("use_data_producer") is False:
            raise ValueError(
                "trl.use_data_producer: false, but the grpo_plugin's trainer runs on axolotl's data-producer "
                "path. Remove trl.use_data_producer (the plugin sets it)."
            )
        ranks = int(os.environ.get("WORLD_SIZE", "1"))
        if ranks > 1 and trl.get("skip_zero_advantage_batches") is True:
            raise ValueError(
                f"trl.skip_zero_advantage_batches: true with {ranks} trainer ranks deadlocks: a rank whose micro-batch "
                "has only zero advantages skips the loss (and its all-gathers) while the other ranks wait in them "
                "(axolotl's FastAsyncGRPOTrainer._compute_loss; measured: a 2-rank run hung at step 2). Remove it "
                "(with several ranks the plugin sets it to false).")
        if trl.get("vllm_lora_sync"):
            raise ValueError(
                "trl.vllm_lora_sync: true is axolotl's built-in LoRA sync; with the grpo_plugin use "
                "`grpo.sync: lora_sync` instead and remove trl.vllm_lora_sync."
            )
        problems = trl_problems(trl)
        if problems:
            raise ValueError("the grpo_plugin cannot honour these trl: keys (docs/config.md lists every one):\n  - "
                             + "\n  - ".join(problems))


def trl_problems(trl: dict) -> list[str]:
    """`trl:` keys the plugin would otherwise ignore or break on, each with why and what to use instead (the reasons
    are data: options.py)."""
    from axolotl.utils.schemas.trl import TRLConfig

    from grpo_plugin.options import (
        GENERATION_KWARGS_INSTEAD,
        LOSS_TYPES,
        NOT_AXOLOTL_KEYS_INSTEAD,
        REFUSED_WHEN_SET,
    )
    from grpo_plugin.server.client import GENERATE_FIELDS

    known = list(TRLConfig.model_fields)
    problems = []
    for key in sorted(set(trl) - set(known), key=str):
        close = difflib.get_close_matches(str(key), known, n=1)
        hint = (f" Instead: {NOT_AXOLOTL_KEYS_INSTEAD[key]}." if key in NOT_AXOLOTL_KEYS_INSTEAD
                else f" Did you mean trl.{close[0]}?" if close else "")
        problems.append(f"trl.{key}: not a key of axolotl's `trl:` block, which would drop it silently (TRL's "
                        f"default would apply).{hint}")
    for key, (off, why) in REFUSED_WHEN_SET.items():
        if key in trl and trl[key] not in off:
            problems.append(f"trl.{key}: {trl[key]!r}: {why}")
    loss = trl.get("loss_type")
    if loss is not None and loss not in LOSS_TYPES:
        problems.append(f"trl.loss_type: {loss!r} is not a loss axolotl's GRPO loss implements (AsyncGRPOTrainer."
                        f"_compute_loss, which replaces TRL's): {', '.join(LOSS_TYPES)}. The run would stop at its "
                        "first step (`Unknown loss type`). Use one of those.")
    extra = trl.get("generation_kwargs")
    for key in sorted(set(extra) & set(GENERATE_FIELDS) if isinstance(extra, dict) else ()):
        problems.append(f"trl.generation_kwargs.{key}: the plugin sets `{key}` in every generation request itself "
                        f"({GENERATION_KWARGS_INSTEAD[key]}). Remove it from trl.generation_kwargs.")
    return problems


def _check_ipc(data: dict) -> None:
    """What one shared copy of the weights cannot do, each with the reason and the way out."""
    vllm = data.get("vllm") or {}
    vllm_get = (lambda k: vllm.get(k)) if isinstance(vllm, dict) else (lambda k: getattr(vllm, k, None))
    problems = []
    if data.get("adapter"):
        problems.append(
            f"`adapter: {data.get('adapter')}`: ipc shares the full weights for full fine-tuning (sharing a frozen "
            "base under a LoRA adapter is not supported yet). Use `grpo.sync: lora_sync` for adapters, or remove "
            "`adapter:`.")
    for key in ("load_in_8bit", "load_in_4bit", "gptq"):
        if data.get(key):
            problems.append(f"`{key}: true`: quantized base weights cannot be trained in place. Remove {key}.")
    host = str(vllm_get("host") or "127.0.0.1")
    if host not in LOCAL_HOSTS:
        problems.append(f"`vllm.host: {host}`: the server must run on this machine (the weights are one "
                        "shared-memory file). Use 127.0.0.1, or grpo.sync: restart / lora_sync for a remote server.")
    for key in ("tensor_parallel_size", "data_parallel_size"):
        if int(vllm_get(key) or 1) > 1:
            problems.append(f"`vllm.{key}: {vllm_get(key)}`: ipc shares the weights of ONE vLLM worker "
                            f"(>1 splits or replicates them). Set vllm.{key}: 1, or use grpo.sync: restart.")
    from grpo_plugin.serverconfig import cuda_available, trainer_dtype

    servers = server_count(data.get("grpo"))
    if servers > 1 and cuda_available():
        problems.append(f"{servers} servers: on CUDA ipc shares one GPU's weights with one server (several servers "
                        "mapping one GPU copy is built only for vLLM-CPU). Use one server, or grpo.sync: restart / "
                        "lora_sync with several.")
    want = trainer_dtype(data)
    have = vllm_get("dtype")
    aliases = {"bfloat16": ("bfloat16", "bf16"), "float16": ("float16", "fp16", "half"), "float32": ("float32",
                                                                                                      "fp32", "float")}
    if want and have not in (None, "auto") and str(have).removeprefix("torch.") not in aliases.get(want, (want,)):
        problems.append(f"`vllm.dtype: {have}` but the trainer trains in {want}: one shared copy has one dtype. "
                        "Remove vllm.dtype (the plugin passes the trainer's dtype) or change the precision keys.")
    if data.get("deepspeed") or uses_fsdp(data):
        problems.append("`deepspeed` / `fsdp`: ipc needs the trainer's parameters to stay views of the ONE shared "
                        "copy; DeepSpeed flattens them (ZeRO-1/2) or splits them across ranks (ZeRO-3), FSDP shards "
                        "them — a gathered copy would be the second copy ipc exists to avoid. Remove them: ipc runs "
                        "one process or DDP ranks (docs/scaling.md); for ZeRO-3 use restart or lora_sync.")
    if problems:
        raise ValueError("grpo.sync: ipc cannot be used with this config:\n  - " + "\n  - ".join(problems))


# The reward function the plugin names for Atropos runs: it hands the environments' scores to axolotl's reward
# path (metrics, logs); the advantages come from the producer (producers/atropos.py).
ENV_SCORE_REWARD = "grpo_plugin.producers.atropos.env_score"
# axolotl requires `datasets:`; for Atropos runs the plugin fills in this marker (prompts come from the envs).
ATROPOS_DATASET_MARKER = "grpo_plugin: rollouts come from Atropos environments"


def atropos_batch_size(data) -> int:
    """Sequences per optimizer step and trainer process: micro_batch_size x gradient_accumulation_steps."""
    return int(_get(data, "micro_batch_size") or 1) * int(_get(data, "gradient_accumulation_steps") or 1)


def _check_atropos(data: dict, atropos) -> None:
    """What an Atropos-fed run cannot have, each with the reason and the way out (one message for all)."""
    from urllib.parse import urlparse

    problems = []
    trl = data.get("trl") or {}
    trl_get = (lambda k: trl.get(k)) if isinstance(trl, dict) else (lambda k: getattr(trl, k, None))
    funcs = trl_get("reward_funcs") or []
    if list(funcs) not in ([], [ENV_SCORE_REWARD]):
        problems.append(f"`trl.reward_funcs: {list(funcs)}`: with grpo.atropos the environments score the rollouts. "
                        "Remove trl.reward_funcs (score in the environment instead).")
    datasets = data.get("datasets") or []
    paths = [d.get("path") if isinstance(d, dict) else getattr(d, "path", None) for d in datasets]
    if any(p != ATROPOS_DATASET_MARKER for p in paths):
        problems.append("`datasets:` would be ignored: with grpo.atropos the prompts come from the environments. "
                        "Remove datasets (give the environment its data instead).")
    if not data.get("max_steps") or int(data.get("max_steps")) < 1:
        problems.append("`max_steps` is required with grpo.atropos (the data stream has no length; it is also "
                        "the run-api's num_steps).")
    group = _get(atropos, "group_size")
    batch = atropos_batch_size(data)
    if group and batch % int(group):
        problems.append(f"micro_batch_size x gradient_accumulation_steps = {batch} sequences per step is not a "
                        f"multiple of grpo.atropos.group_size {group}: the run-api only forms batches of whole "
                        "groups, so /batch would never return one. Change micro_batch_size.")
    gens = trl_get("num_generations")
    if gens and batch % int(gens):
        problems.append(f"trl.num_generations {gens} does not divide the {batch} sequences per step. Remove "
                        "trl.num_generations (with grpo.atropos the plugin sets it to the group size).")
    vllm = data.get("vllm") or {}
    vllm_get = (lambda k: vllm.get(k)) if isinstance(vllm, dict) else (lambda k: getattr(vllm, k, None))
    api = urlparse(str(_get(atropos, "url") or "http://127.0.0.1:8000"))
    local = {"127.0.0.1", "localhost", "0.0.0.0", "::1", ""}
    vhost, vport = str(vllm_get("host") or "127.0.0.1"), int(vllm_get("port") or 8000)
    if api.port == vport and (api.hostname == vhost or {api.hostname, vhost} <= local):
        problems.append(f"grpo.atropos.url {_get(atropos, 'url')} and the vLLM server (vllm.port {vport}) use the "
                        "same port. Move one of them (e.g. `vllm: {port: 8001}`).")
    if problems:
        raise ValueError("grpo.atropos cannot be used with this config:\n  - " + "\n  - ".join(problems))


def _check_sharded(data: dict, sync) -> None:
    """FSDP (2 only) and ZeRO-3: what the plugin's gathered push (sync/ranks.py) does not cover, refused saying why."""
    fsdp = uses_fsdp(data)
    zero3 = _zero_stage(data) == 3
    if not (fsdp or zero3):
        return
    if data.get("load_in_4bit") or data.get("load_in_8bit") or data.get("adapter") == "qlora":
        raise ValueError(
            f"a quantized base (QLoRA / load_in_4bit / load_in_8bit) with {'FSDP' if fsdp else 'DeepSpeed ZeRO-3'}: "
            "not supported — the server is given the trainer's dequantized base, read from a full copy the sharded "
            "trainer does not have. Use DDP or ZeRO-1/2 for QLoRA (docs/scaling.md).")
    if not fsdp:
        return
    conf = data.get("fsdp_config") if isinstance(data.get("fsdp_config"), dict) else {}
    version = data.get("fsdp_version") or conf.get("fsdp_version") or conf.get("version")
    if str(version) != "2":
        raise ValueError(f"FSDP version {version or '1 (the default)'}: the grpo_plugin gathers FSDP2's weights "
                         "(torch's full state dict) only. Set `fsdp_version: 2`.")


def _zero_stage(data: dict) -> int | None:
    """The ZeRO stage of the `deepspeed:` config (a dict or a JSON file), None without one or if unreadable."""
    ds = data.get("deepspeed")
    if not ds:
        return None
    if isinstance(ds, dict):
        conf = ds
    else:
        import json
        from pathlib import Path

        try:
            conf = json.loads(Path(str(ds)).read_text())
        except (OSError, ValueError):
            return None  # axolotl reports a missing or broken file itself
    stage = (conf.get("zero_optimization") or {}).get("stage")
    try:
        return int(stage)
    except (TypeError, ValueError):
        return None


def uses_fsdp(data) -> bool:
    """The config shards with FSDP (`fsdp`, `fsdp_config` or `fsdp_version`)."""
    return bool(data.get("fsdp") or data.get("fsdp_config") or data.get("fsdp_version"))


def loaded_cfg() -> dict:
    """The validated config axolotl loaded in this process (set by axolotl after validation)."""
    from axolotl.integrations.base import PluginManager

    return PluginManager.get_instance().cfg or {}


def current_settings() -> GRPOSettings:
    """The validated `grpo:` block of the config axolotl loaded in this process."""
    block = loaded_cfg().get("grpo")
    return GRPOSettings(**(dict(block) if block else {}))
