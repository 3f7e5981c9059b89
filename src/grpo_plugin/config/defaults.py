"""The defaults the plugin fills into the raw axolotl config before it is validated (the plugin's `register`
hook; also for `axolotl vllm-serve`): the trainer class, TRL's server mode and data producer, the server module and
address (runtime.py: SERVER_HOST, SERVER_PORT), and what an Atropos run needs. Only defaults: an explicit conflicting
value is left for validation to reject."""

from __future__ import annotations

import logging

from grpo_plugin.config.checks import ATROPOS_DATASET_MARKER, ENV_SCORE_REWARD, atropos_batch_size
from grpo_plugin.config.runtime import SERVER_HOST, SERVER_PORT, world_size

LOG = logging.getLogger("grpo_plugin")

TRAINER_CLS = "grpo_plugin.trainer.GRPOPluginTrainer"
SERVE_MODULE = "grpo_plugin.vllm_serve"


def fill_defaults(cfg) -> None:
    """Fill the plugin's defaults into `cfg` (axolotl's raw config, changed in place)."""
    if cfg.get("grpo") is None:
        cfg["grpo"] = {}
    if cfg.get("trainer_cls") not in (None, TRAINER_CLS):
        LOG.warning("grpo_plugin: replacing trainer_cls %r with %s", cfg.get("trainer_cls"), TRAINER_CLS)
    cfg["trainer_cls"] = TRAINER_CLS
    trl = cfg.get("trl")
    if trl is None:
        trl = cfg["trl"] = {}
    vllm = cfg.get("vllm")
    if vllm is None:
        vllm = cfg["vllm"] = {}
    trl.setdefault("use_vllm", True)
    trl.setdefault("vllm_mode", "server")
    trl.setdefault("use_data_producer", True)
    if world_size() > 1:
        # several ranks: a rank skipping its zero-advantage micro-batch skips the loss's collectives while the
        # others wait in them (a deadlock; config/checks.py refuses an explicit true)
        trl.setdefault("skip_zero_advantage_batches", False)
    _keep_the_kl(trl)
    note = truncation_note(trl)
    if note:
        LOG.warning("grpo_plugin: %s", note)
    vllm.setdefault("serve_module", SERVE_MODULE)
    vllm.setdefault("host", SERVER_HOST)
    vllm.setdefault("port", SERVER_PORT)
    trl.setdefault("vllm_server_host", vllm["host"])
    trl.setdefault("vllm_server_port", vllm["port"])
    atropos = cfg["grpo"].get("atropos")
    if atropos is not None:
        _fill_atropos(cfg, trl, atropos if isinstance(atropos, dict) else {})


def _keep_the_kl(trl: dict) -> None:
    """With `trl.beta > 0` the loss holds the KL term to the reference model; axolotl's zero-advantage skip
    (`skip_zero_advantage_batches`, default true) skips the whole loss of a micro-batch whose advantages are all
    zero, the KL term with it. The plugin turns the skip off then (the KL applies on every step), and says so when a
    config asks for the skip explicitly."""
    try:
        beta = float(trl.get("beta") or 0.0)
    except (TypeError, ValueError):
        return  # validation reports it
    if beta <= 0:
        return
    if trl.get("skip_zero_advantage_batches") is True:
        LOG.warning("grpo_plugin: trl.skip_zero_advantage_batches: true with trl.beta=%g: on a micro-batch whose "
                    "advantages are all zero axolotl skips the whole loss, the KL term included (the policy may "
                    "drift from the reference on those steps; the log counts them as skipped_zero_adv_batches). "
                    "Remove the key to apply the KL on every step.", beta)
    trl.setdefault("skip_zero_advantage_batches", False)


_TRUNCATES = {"top_k": lambda v: v > 0, "top_p": lambda v: v < 1.0, "min_p": lambda v: v > 0.0}


def truncated_by(trl: dict) -> list[str]:
    """The `trl:` sampling settings that truncate the distribution vLLM samples from (top-k, top-p, min-p)."""
    found = []
    for key, truncates in _TRUNCATES.items():
        try:
            if trl.get(key) is not None and truncates(float(trl[key])):
                found.append(f"trl.{key}={trl[key]}")
        except (TypeError, ValueError):
            pass  # not a number: validation reports it
    return found


def truncation_note(trl: dict) -> str | None:
    """What truncated sampling does to the importance-sampling ratio, for the start of a run that uses it (None
    without truncation). vLLM samples from the truncated, renormalised distribution and reports its logprobs
    (`--logprobs-mode processed_logprobs`); the trainer scores the full one at the same temperature, as TRL does.
    A sampled token's ratio pi/pi_sampler is then the probability mass the truncation kept at that position: below
    1 on every step, also right after a verified sync. The plugin keeps TRL's choice (the trained policy is the
    untruncated one; axolotl's correction caps ratios above, not below); the sync probe reads prompt logprobs at
    the temperature only, so its verdict and tolerance do not move."""
    found = truncated_by(trl)
    if not found:
        return None
    return (f"{', '.join(found)} truncates the distribution vLLM samples from, while the trainer scores the full "
            "one (as TRL does): the importance-sampling ratio (sampling/importance_sampling_ratio/mean) sits below "
            "1 by the probability mass the truncation drops, on every step, also right after a verified sync. "
            "That is the truncation, not stale weights: the sync probe does not use it (docs/modes.md, Truncated "
            "sampling).")


def _fill_atropos(cfg, trl, atropos: dict) -> None:
    """Rollouts come from Atropos: the environments' scores are the reward, and axolotl's required
    `datasets:` gets a marker (the plugin's load_datasets hook supplies the placeholder prompt rows)."""
    if not trl.get("reward_funcs"):
        trl["reward_funcs"] = [ENV_SCORE_REWARD]
    if not cfg.get("datasets"):
        cfg["datasets"] = [{"path": ATROPOS_DATASET_MARKER}]
    if trl.get("num_generations") is None:
        # axolotl's reward path groups rows by num_generations; the real groups come from the envs
        trl["num_generations"] = int(atropos.get("group_size") or atropos_batch_size(cfg))
