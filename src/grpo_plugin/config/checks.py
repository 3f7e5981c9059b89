"""Cross-key checks: the rules that need keys outside `grpo:` (trl:, vllm:, the sharding backend, Atropos) and hold
whatever the sync mode (each mode's own rules: config/modes.py). Each raises ValueError naming the key and the fix.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from urllib.parse import urlparse

from grpo_plugin.config.options import (
    GENERATE_FIELDS,
    GENERATION_KWARGS_INSTEAD,
    LOSS_TYPES,
    NOT_AXOLOTL_KEYS_INSTEAD,
    OPTIONS,
    REFUSED_WHEN_SET,
)
from grpo_plugin.config.runtime import SERVER_HOST, SERVER_PORT, config_value, is_local, world_size


def check_cross_keys(data: dict) -> None:
    """Checks that need keys outside `grpo:`. Raises ValueError naming the key and the fix."""
    grpo = data.get("grpo")
    if grpo is None:
        return
    rl = getattr(data.get("rl"), "value", data.get("rl"))
    if str(rl).lower() != "grpo":
        raise ValueError(f"grpo: the grpo_plugin needs `rl: grpo` in the config (got rl: {rl!r}).")
    if config_value(grpo, "atropos") is not None:
        _check_atropos(data, config_value(grpo, "atropos"))
    _check_launcher(data)
    _check_sharded(data)
    _check_plugins(data)
    _check_agents(data, grpo)
    if config_value(grpo, "seeded_sampling"):
        _check_seeded(data, grpo)
    if config_value(data.get("trl") or {}, "streaming_partial_batch"):
        _check_streaming(data, grpo)
    elif config_value(grpo, "stream_groups") is not None:
        raise ValueError("grpo.stream_groups applies to trl.streaming_partial_batch: true only, which this config does "
                         "not set. Remove grpo.stream_groups, or turn streaming on.")
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
        ranks = world_size()
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
    from axolotl.utils.schemas.trl import TRLConfig  # here: ~0.3 s of axolotl's schemas, for the trl: check only

    known = list(TRLConfig.model_fields)
    problems = []
    for key in sorted(set(trl) - set(known), key=str):
        close = difflib.get_close_matches(str(key), known, n=1)
        # a TRL setting axolotl does not carry is no typo: a "did you mean" would name an unrelated key
        hint = (f" Instead: {NOT_AXOLOTL_KEYS_INSTEAD[key]}." if key in NOT_AXOLOTL_KEYS_INSTEAD
                else " A TRL setting axolotl does not pass on; nothing in axolotl's config replaces it."
                if key in OPTIONS else f" Did you mean trl.{close[0]}?" if close else "")
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


# The reward function the plugin names for Atropos runs: it hands the environments' scores to axolotl's reward
# path (metrics, logs); the advantages come from the producer (producers/atropos.py).
ENV_SCORE_REWARD = "grpo_plugin.producers.atropos.env_score"
# axolotl requires `datasets:`; for Atropos runs the plugin fills in this marker (prompts come from the envs).
ATROPOS_DATASET_MARKER = "grpo_plugin: rollouts come from Atropos environments"


def evaluates(data) -> bool:
    """The config asks for evaluation during training on a local eval set."""
    strategy = str(config_value(data, "eval_strategy") or "no")
    return bool(data.get("val_set_size") or data.get("test_datasets")) and strategy not in ("no", "IntervalStrategy.NO")


def atropos_batch_size(data) -> int:
    """Sequences per optimizer step and trainer process: micro_batch_size x gradient_accumulation_steps."""
    micro, accumulation = config_value(data, "micro_batch_size"), config_value(data, "gradient_accumulation_steps")
    return int(micro or 1) * int(accumulation or 1)


def _check_launcher(data: dict) -> None:
    """axolotl's Ray launcher (`use_ray: true`): refused, saying why and which launchers run several ranks."""
    ray = data.get("use_ray")
    if ray in (None, False) or str(ray).lower() in ("false", "0", "no", "off"):
        return
    workers = data.get("ray_num_workers") or 1
    n = "N" if str(workers) == "1" else workers
    ranks = "one trainer rank with plain `axolotl train config.yaml`, or several" if n == "N" else f"{n} trainer ranks"
    launch = (f"{ranks} with accelerate or torchrun: `axolotl train config.yaml --launcher accelerate -- --multi_gpu "
              f"--num_processes {n}` (or `--launcher torchrun -- --nproc_per_node {n}`)")
    raise ValueError(
        f"use_ray: true (axolotl's Ray Train launcher, ray_num_workers: {workers}) is not supported by the "
        "grpo_plugin. axolotl asks Ray for one GPU per worker whatever resources_per_worker says (so no worker is "
        "ever placed on a CPU-only Ray cluster); each worker runs the training in a thread of a Ray actor, not its "
        "main thread, where starting a managed vLLM server fails (signal handlers are main-thread only) and the "
        "plugin's recovery of a lost server and its token count over the ranks do not run; and the Ray driver "
        "validates the config as one process, so the workers receive axolotl's one-process defaults written out "
        "(trl.skip_zero_advantage_batches: true), which several ranks refuse. Remove use_ray and ray_num_workers, "
        f"and launch {launch} (docs/scaling.md#several-trainer-ranks).")


def _check_plugins(data: dict) -> None:
    """Plugins whose trainer or data producer would replace the grpo_plugin's."""
    nemo = [p for p in data.get("plugins") or [] if str(p).startswith("axolotl.integrations.nemo_gym")]
    if nemo:
        raise ValueError(
            f"plugins: {nemo[0]} with grpo_plugin.GRPOPlugin: NeMo Gym's plugin sets its own rollout function and "
            "data producer, which would replace the grpo_plugin's (its weight sync, verification and server "
            "recovery). Use one of the two. To train a NeMo Gym agent with the grpo_plugin, call its agents from a "
            "trl.rollout_func that generates through the server's OpenAI routes (docs/agents.md).")


def _check_agents(data: dict, grpo) -> None:
    """grpo.tools / grpo.environment_factory: the plugin runs TRL's tool-calling loop as the run's rollout function,
    so nothing else may make the rollouts."""
    tools, factory = config_value(grpo, "tools"), config_value(grpo, "environment_factory")
    if not tools and not factory:
        return
    keys = " and ".join(k for k, v in (("grpo.tools", tools), ("grpo.environment_factory", factory)) if v)
    trl = data.get("trl") or {}
    if config_value(trl, "rollout_func"):
        raise ValueError(f"{keys} with `trl.rollout_func: {config_value(trl, 'rollout_func')}`: the tool-calling "
                         "loop is the run's rollout function, so one of the two would never run. Remove one (a "
                         "rollout_func runs its own tools: docs/agents.md).")
    if config_value(grpo, "atropos") is not None:
        raise ValueError(f"{keys} with grpo.atropos: the rollouts come from the Atropos environments, so the tools "
                         "would never be called. Remove one of the two.")


def rollout_makers(data: dict, grpo) -> list[str]:
    """The keys set that make the run's rollouts in code other than the plugin's own generation requests."""
    trl = data.get("trl") or {}
    return [k for k, v in (("grpo.atropos", config_value(grpo, "atropos")),
                           ("trl.rollout_func", config_value(trl, "rollout_func")),
                           ("grpo.tools", config_value(grpo, "tools")),
                           ("grpo.environment_factory", config_value(grpo, "environment_factory"))) if v]


def _check_seeded(data: dict, grpo) -> None:
    """grpo.seeded_sampling seeds the requests the plugin makes itself, on servers without chunked prefill."""
    others = rollout_makers(data, grpo)
    if others:
        raise ValueError(f"grpo.seeded_sampling with {' and '.join(others)}: the rollouts' requests are made by the "
                         "environment or agent code, which the plugin does not seed. Remove grpo.seeded_sampling (or "
                         "send a per-request `seed` from that code).")
    if not config_value(data.get("vllm") or {}, "max_model_len"):
        raise ValueError("grpo.seeded_sampling needs vllm.max_model_len: the plugin's vLLM-CPU servers run without "
                         "chunked prefill (vLLM-CPU cannot resume a seeded request across a split prefill), and "
                         "vLLM then needs each step's token budget to hold a whole prompt of max_model_len tokens.")


def _check_streaming(data: dict, grpo) -> None:
    """trl.streaming_partial_batch streams the plugin's own single-turn rollouts, on one trainer rank."""
    others = rollout_makers(data, grpo)
    if others:
        raise ValueError(f"trl.streaming_partial_batch with {' and '.join(others)}: the plugin streams its own "
                         "single-turn rollouts only (agent and Atropos rollouts are not interrupted and continued "
                         "across pushes). Remove trl.streaming_partial_batch; trl.async_prefetch overlaps their "
                         "generation with training.")
    if world_size() > 1:
        raise ValueError(f"trl.streaming_partial_batch with {world_size()} trainer ranks: streaming runs on one rank "
                         "for now. Remove it (trl.async_prefetch works with several ranks).")
    if config_value(grpo, "max_policy_lag") == 0:
        raise ValueError("trl.streaming_partial_batch with grpo.max_policy_lag: 0: a rollout that runs across a push "
                         "would never be trained (its first tokens are a version old). Set max_policy_lag to 1 or "
                         "more (default 4 with streaming).")


def _check_atropos(data: dict, atropos) -> None:
    """What an Atropos-fed run cannot have, each with the reason and the way out (one message for all)."""
    problems = []
    trl = data.get("trl") or {}
    funcs = config_value(trl, "reward_funcs") or []
    if list(funcs) not in ([], [ENV_SCORE_REWARD]):
        problems.append(f"`trl.reward_funcs: {list(funcs)}`: with grpo.atropos the environments score the rollouts. "
                        "Remove trl.reward_funcs (score in the environment instead).")
    if config_value(trl, "rollout_func"):
        problems.append(f"`trl.rollout_func: {config_value(trl, 'rollout_func')}` with grpo.atropos: the rollouts "
                        "come from the Atropos environments, so it would never be called. Remove one of the two "
                        "(a multi-turn agent is either an Atropos environment or a rollout_func).")
    datasets = data.get("datasets") or []
    paths = [config_value(d, "path") for d in datasets]
    if any(p != ATROPOS_DATASET_MARKER for p in paths):
        problems.append("`datasets:` would be ignored: with grpo.atropos the prompts come from the environments. "
                        "Remove datasets (give the environment its data instead).")
    if evaluates(data):
        if data.get("val_set_size") and not data.get("test_datasets"):
            problems.append("`val_set_size` with grpo.atropos: the training prompts come from the environments, so "
                            "there is no local train set to split. Give the eval prompts as `test_datasets` (with "
                            "grpo.atropos.eval_reward_funcs to score them), or remove val_set_size.")
        elif not config_value(atropos, "eval_reward_funcs"):
            problems.append(f"`eval_strategy: {config_value(data, 'eval_strategy')}` with `test_datasets`: with "
                            "grpo.atropos the environments score the training rollouts, and an eval set needs reward "
                            "functions of its own. Set grpo.atropos.eval_reward_funcs (import paths, like "
                            "trl.reward_funcs), or remove eval_strategy.")
    if not data.get("max_steps") or int(data.get("max_steps")) < 1:
        problems.append("`max_steps` is required with grpo.atropos (the data stream has no length; it is also "
                        "the run-api's num_steps).")
    group = config_value(atropos, "group_size")
    batch = atropos_batch_size(data)
    if group and batch % int(group):
        problems.append(f"micro_batch_size x gradient_accumulation_steps = {batch} sequences per step is not a "
                        f"multiple of grpo.atropos.group_size {group}: the run-api only forms batches of whole "
                        "groups, so /batch would never return one. Change micro_batch_size.")
    gens = config_value(trl, "num_generations")
    if gens and batch % int(gens):
        problems.append(f"trl.num_generations {gens} does not divide the {batch} sequences per step. Remove "
                        "trl.num_generations (with grpo.atropos the plugin sets it to the group size).")
    vllm = data.get("vllm") or {}
    api = urlparse(str(config_value(atropos, "url") or "http://127.0.0.1:8000"))
    vhost = str(config_value(vllm, "host") or SERVER_HOST)
    vport = int(config_value(vllm, "port") or SERVER_PORT)
    if api.port == vport and (api.hostname == vhost or (is_local(api.hostname) and is_local(vhost))):
        problems.append(f"grpo.atropos.url {config_value(atropos, 'url')} and the vLLM server (vllm.port {vport}) "
                        "use the same port. Move one of them (e.g. `vllm: {port: 8001}`).")
    if problems:
        raise ValueError("grpo.atropos cannot be used with this config:\n  - " + "\n  - ".join(problems))


def _check_sharded(data: dict) -> None:
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
        try:
            conf = json.loads(Path(str(ds)).read_text())
        except (OSError, ValueError):
            return None  # axolotl reports a missing or broken file itself
    stage = (conf.get("zero_optimization") or {}).get("stage")
    try:
        return int(stage)
    except (TypeError, ValueError):
        return None


def uses_deepspeed(data) -> bool:
    """The config trains under DeepSpeed (`deepspeed`: its JSON)."""
    return bool(data.get("deepspeed"))


def uses_fsdp(data) -> bool:
    """The config shards with FSDP (`fsdp`, `fsdp_config` or `fsdp_version`)."""
    return bool(data.get("fsdp") or data.get("fsdp_config") or data.get("fsdp_version"))
