"""Atropos batches → the tensors axolotl's GRPO loss reads. Pure and vectorised; validates as it goes.

An Atropos batch is a list of groups (atroposlib's ScoredDataGroup as the run-api serves it). Per sequence:
`tokens` (prompt + completion, one list), `masks` (= labels: -100 where the token is not trained, else the token
id), `inference_logprobs` (aligned 1:1 with `tokens`: the logprob the server gave token t given tokens < t; 1.0 at
masked positions), one `score`; optionally per-token `advantages`, per-sequence `overrides`
(`set_advantage_to_zero`, `temperature`), `generation_params` / `group_overrides` (`temperature`).

Mapping onto TRL's prompt/completion layout: the prompt is everything before the first trained position
(at least one token: position 0 has no context and is never trained); the completion is the rest, and
`completion_mask` is 1 exactly where `masks` is not -100 — masked stretches inside a completion (tool output,
a user turn) stay untrained. The logprob of completion token j is scored from all tokens before it, which is
the one-token shift of the labels view (`input_ids = tokens[:-1]`, `labels = masks[1:]`); `inference_logprobs`
need no shift in this layout.

Advantages: the env's per-token `advantages` when a group has them, else the group's scores normalised within
the group (TRL's `scale_rewards`: group | batch | none, with TRL's std + 1e-4); `set_advantage_to_zero` zeroes a
sequence. Temperature per sequence: `overrides[i].temperature` > `generation_params.temperature` >
`group_overrides.temperature` > the configured default. The trainer divides its logits by it, as the server did.

A group that cannot be trained on is rejected as a whole with a reason naming the field and position; the other
groups are kept. Conversion is a handful of numpy/torch passes over flat arrays (no per-token Python loop).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import torch

IGNORE = -100  # atroposlib's masked-label value
MASKED_LOGPROB = 1.0  # atroposlib's placeholder in inference_logprobs at masked positions
LOGPROB_SLACK = 1e-4  # a sampled token's logprob may round slightly above 0


@dataclass
class Rejection:
    group: int  # index of the group in the batch as received
    reason: str
    env_id: int | None = None

    def __str__(self) -> str:
        env = f" (env_id {self.env_id})" if self.env_id is not None else ""
        return f"group {self.group}{env}: {self.reason}"


@dataclass
class TensorBatch:
    prompt_ids: torch.Tensor  # (S, P) left-padded
    prompt_mask: torch.Tensor  # (S, P)
    completion_ids: torch.Tensor  # (S, C) right-padded
    completion_mask: torch.Tensor  # (S, C) 1 where trained
    completion_lengths: torch.Tensor  # (S,) tokens after the prompt (trained or not)
    sampling_logps: torch.Tensor  # (S, C) inference logprobs, 0 where not trained
    advantages: torch.Tensor  # (S,) or (S, C)
    temperatures: torch.Tensor  # (S,) float64: the exact values the server sampled with
    scores: torch.Tensor  # (S,)
    group_index: torch.Tensor  # (S,) index of each sequence's group in the batch as received
    num_groups: int  # groups kept
    rejections: list[Rejection] = field(default_factory=list)

    @property
    def num_sequences(self) -> int:
        return int(self.prompt_ids.shape[0])


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _temperature(g: dict, i: int, default: float) -> float | str:
    """The sequence's sampling temperature, or a reason string when the given one is unusable."""
    ov = (g.get("overrides") or [None] * (i + 1))[i] or {}
    for source, holder in ((f"overrides[{i}]", ov), ("generation_params", g.get("generation_params") or {}),
                           ("group_overrides", g.get("group_overrides") or {})):
        if "temperature" in holder:
            t = holder["temperature"]
            if not _number(t) or not math.isfinite(t) or t <= 0:
                return f"{source}.temperature is {t!r}; it must be a number > 0"
            return float(t)
    return default


def _structure(g, max_len: int, default_temperature: float) -> str | list[float]:
    """Per-sequence temperatures, or the first reason the group's shape cannot be trained on."""
    if not isinstance(g, dict):
        return f"is a {type(g).__name__}, not a ScoredDataGroup object"
    tokens = g.get("tokens")
    if not isinstance(tokens, list) or not tokens:
        return "`tokens` is missing or empty"
    n_seq = len(tokens)
    for key in ("masks", "scores", "inference_logprobs"):
        val = g.get(key)
        if val is None:
            hint = (" (the trainer corrects for stale rollouts with them: generate through atroposlib's "
                    "ManagedServer with `server_type: vllm` against the grpo_plugin server)"
                    if key == "inference_logprobs" else "")
            return f"`{key}` is missing{hint}"
        if not isinstance(val, list) or len(val) != n_seq:
            return f"`{key}` has {len(val) if isinstance(val, list) else type(val).__name__} entries for " \
                   f"{n_seq} sequences"
    for key in ("advantages", "overrides"):
        val = g.get(key)
        if val is not None and (not isinstance(val, list) or len(val) != n_seq):
            return f"`{key}` has {len(val) if isinstance(val, list) else type(val).__name__} entries for " \
                   f"{n_seq} sequences"
    for i, ov in enumerate(g.get("overrides") or []):
        if ov is not None and not isinstance(ov, dict):
            return f"overrides[{i}] is a {type(ov).__name__}, not an object"
    for key in ("generation_params", "group_overrides"):
        if g.get(key) is not None and not isinstance(g[key], dict):
            return f"`{key}` is a {type(g[key]).__name__}, not an object"
    for i, s in enumerate(g["scores"]):
        if not _number(s) or not math.isfinite(s):
            return f"scores[{i}] is {s!r}; scores must be finite numbers"
    adv = g.get("advantages")
    for i, seq in enumerate(tokens):
        if not isinstance(seq, list):
            return f"tokens[{i}] is not a list"
        n = len(seq)
        if n < 2:
            return f"sequence {i} has {n} token(s); at least 2 are needed (a prompt token and a trained one)"
        if n > max_len:
            return f"sequence {i} has {n} tokens, more than max_token_len {max_len} (grpo.atropos.max_token_len)"
        for key, rows in (("masks", g["masks"]), ("inference_logprobs", g["inference_logprobs"]),
                          ("advantages", adv)):
            if rows is not None and (not isinstance(rows[i], list) or len(rows[i]) != n):
                got = len(rows[i]) if isinstance(rows[i], list) else type(rows[i]).__name__
                return f"{key}[{i}] has {got} entries but tokens[{i}] has {n} (ragged sequence)"
    temps = []
    for i in range(n_seq):
        t = _temperature(g, i, default_temperature)
        if isinstance(t, str):
            return t
        temps.append(t)
    return temps


def _flat(rows_per_group: list[list[list]], count: int, dtype) -> np.ndarray:
    return np.fromiter(chain.from_iterable(chain.from_iterable(rows_per_group)), dtype=dtype, count=count)


def tensorize(groups: list, *, pad_token_id: int, vocab_size: int, max_len: int, scale_rewards: str = "group",
              default_temperature: float = 1.0) -> TensorBatch:
    """Validate and convert one Atropos batch. Rejected groups are listed in `.rejections`; the result holds
    the others (possibly none: `num_sequences == 0`)."""
    if scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards must be group, batch or none, got {scale_rewards!r}")
    rejections: list[Rejection] = []

    def reject(gi: int, reason: str) -> None:
        g = groups[gi]
        rejections.append(Rejection(gi, reason, g.get("env_id") if isinstance(g, dict) else None))

    # 1. shapes, lengths, scores, temperatures: a few Python operations per SEQUENCE
    kept: list[int] = []
    temps: list[float] = []
    for gi, g in enumerate(groups):
        res = _structure(g, max_len, default_temperature)
        if isinstance(res, str):
            reject(gi, res)
        else:
            kept.append(gi)
            temps.extend(res)

    # 2. flatten every per-token field once (numpy's C loop); a group with non-numeric entries is found and dropped
    def flatten(idx: list[int]):
        gs = [groups[i] for i in idx]
        lengths = [len(s) for g in gs for s in g["tokens"]]
        total = sum(lengths)
        tok = _flat([g["tokens"] for g in gs], total, np.int64)
        msk = _flat([g["masks"] for g in gs], total, np.int64)
        lps = _flat([g["inference_logprobs"] for g in gs], total, np.float64)
        per_token_adv = any(g.get("advantages") is not None for g in gs)
        adv = (_flat([g.get("advantages") or [[0.0] * n for n in map(len, g["tokens"])] for g in gs], total,
                     np.float64) if per_token_adv else None)
        return lengths, tok, msk, lps, adv

    try:
        lengths, tok, msk, lps, adv = flatten(kept)
    except (TypeError, ValueError):
        good = []
        for gi in kept:
            try:
                flatten([gi])
                good.append(gi)
            except (TypeError, ValueError) as exc:
                reject(gi, f"non-numeric entries in tokens/masks/inference_logprobs/advantages ({exc})")
        temps = [t for gi in good for t in _structure(groups[gi], max_len, default_temperature)]
        kept = good
        lengths, tok, msk, lps, adv = flatten(kept)

    # 3. value checks on the flat arrays (numpy passes: no per-token Python, no thread-pool start-up per op)
    n_seq = len(lengths)
    if n_seq == 0:
        return _empty(rejections)
    lengths_a = np.asarray(lengths, dtype=np.int64)
    offsets = np.cumsum(lengths_a) - lengths_a
    seq_of = np.repeat(np.arange(n_seq), lengths_a)
    pos = np.arange(len(tok)) - offsets[seq_of]
    trained = (msk != IGNORE) & (pos > 0)  # position 0 has nothing before it: prompt whatever its mask says
    # group index of each kept sequence, and the sequence's index inside its group
    seq_group = np.fromiter((gi for gi in kept for _ in groups[gi]["tokens"]), np.int64, n_seq)
    seq_in_group = np.fromiter((i for gi in kept for i in range(len(groups[gi]["tokens"]))), np.int64, n_seq)
    bad_group = np.zeros(len(groups), dtype=bool)

    def flag(flags: np.ndarray, message) -> None:
        """Reject the group of every sequence with a flagged token, naming its first such token."""
        if not flags.any():
            return
        idx = np.flatnonzero(flags)
        seqs = seq_of[idx]
        first = np.r_[True, seqs[1:] != seqs[:-1]]
        for i, sq in zip(idx[first].tolist(), seqs[first].tolist()):
            gi = int(seq_group[sq])
            if not bad_group[gi]:
                reject(gi, message(i).format(s=int(seq_in_group[sq]), p=int(pos[i])))
                bad_group[gi] = True

    flag((tok < 0) | (tok >= vocab_size),
         lambda i: f"tokens[{{s}}][{{p}}] = {int(tok[i])} is not a token id of this model (vocabulary size "
                   f"{vocab_size})")
    flag((msk != IGNORE) & (msk != tok),
         lambda i: f"masks[{{s}}][{{p}}] = {int(msk[i])}: a mask must be -100 or the token id ({int(tok[i])})")
    flag(trained & ~(np.isfinite(lps) & (lps <= LOGPROB_SLACK)),
         lambda i: f"inference_logprobs[{{s}}][{{p}}] = {float(lps[i])!r} at a trained position (a logprob must "
                   f"be finite and <= 0; {MASKED_LOGPROB} marks masked positions only)")
    if adv is not None:
        flag(trained & ~np.isfinite(adv), lambda i: f"advantages[{{s}}][{{p}}] = {float(adv[i])!r} is not finite")
    for sq in np.flatnonzero(np.bincount(seq_of, weights=trained, minlength=n_seq) == 0).tolist():
        gi = int(seq_group[sq])
        if not bad_group[gi]:
            reject(gi, f"sequence {int(seq_in_group[sq])} has no trained token (every mask after position 0 is "
                       "-100)")
            bad_group[gi] = True

    # 4. keep the sequences of good groups
    keep_seq = ~bad_group[seq_group]
    temps_a = np.asarray(temps, dtype=np.float64)[keep_seq]
    if not keep_seq.all():
        if not keep_seq.any():
            return _empty(rejections)
        keep_tok = keep_seq[seq_of]
        tok, lps, trained = tok[keep_tok], lps[keep_tok], trained[keep_tok]
        adv = adv[keep_tok] if adv is not None else None
        lengths_a, seq_group, seq_in_group = lengths_a[keep_seq], seq_group[keep_seq], seq_in_group[keep_seq]
        n_seq = len(lengths_a)
        offsets = np.cumsum(lengths_a) - lengths_a
        seq_of = np.repeat(np.arange(n_seq), lengths_a)
    good_groups, group_of_seq = np.unique(seq_group, return_inverse=True)
    scores = torch.tensor([float(x) for gi in good_groups.tolist() for x in groups[gi]["scores"]],
                          dtype=torch.float32)

    # 5. prompt = tokens before the first trained position; completion = the rest
    idx = np.flatnonzero(trained)
    seqs = seq_of[idx]
    first = np.r_[True, seqs[1:] != seqs[:-1]]
    first_trained = np.empty(n_seq, dtype=np.int64)
    first_trained[seqs[first]] = idx[first]  # every kept sequence has a trained token
    prompt_len = first_trained - offsets
    comp_len = lengths_a - prompt_len
    P, C, last = int(prompt_len.max()), int(comp_len.max()), len(tok) - 1
    lead = (P - prompt_len)[:, None]
    p_valid = np.arange(P)[None, :] >= lead
    p_idx = np.clip(offsets[:, None] + np.arange(P)[None, :] - lead, 0, last)
    c_valid = np.arange(C)[None, :] < comp_len[:, None]
    c_idx = np.clip((offsets + prompt_len)[:, None] + np.arange(C)[None, :], 0, last)
    prompt_ids = np.where(p_valid, tok[p_idx], pad_token_id)
    completion_ids = np.where(c_valid, tok[c_idx], pad_token_id)
    completion_mask = c_valid & trained[c_idx]
    sampling = np.where(completion_mask, lps[c_idx], 0.0).astype(np.float32)

    # 6. advantages
    advantages = normalised_advantages(scores, torch.from_numpy(group_of_seq.reshape(-1)), scale_rewards)
    if adv is not None:
        env_given = torch.tensor([groups[gi].get("advantages") is not None for gi in seq_group.tolist()])
        per_token = torch.from_numpy(np.where(completion_mask, adv[c_idx], 0.0).astype(np.float32))
        advantages = torch.where(env_given.unsqueeze(1), per_token, advantages.unsqueeze(1).expand_as(per_token))
    zero = torch.tensor([bool(((groups[gi].get("overrides") or [None] * (k + 1))[k] or {}).get("set_advantage_to_zero"))
                         for gi, k in zip(seq_group.tolist(), seq_in_group.tolist())], dtype=torch.bool)
    if bool(zero.any()):
        advantages = advantages.masked_fill(zero.view(-1, *([1] * (advantages.dim() - 1))), 0.0)

    rejections.sort(key=lambda r: r.group)
    return TensorBatch(
        prompt_ids=torch.from_numpy(prompt_ids), prompt_mask=torch.from_numpy(p_valid.astype(np.int64)),
        completion_ids=torch.from_numpy(completion_ids),
        completion_mask=torch.from_numpy(completion_mask.astype(np.int64)),
        completion_lengths=torch.from_numpy(comp_len), sampling_logps=torch.from_numpy(sampling),
        advantages=advantages, temperatures=torch.from_numpy(temps_a), scores=scores,
        group_index=torch.from_numpy(seq_group), num_groups=len(good_groups), rejections=rejections)


def _empty(rejections: list[Rejection]) -> TensorBatch:
    rejections.sort(key=lambda r: r.group)
    long2, long1 = torch.zeros(0, 0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    return TensorBatch(prompt_ids=long2, prompt_mask=long2, completion_ids=long2, completion_mask=long2,
                       completion_lengths=long1, sampling_logps=torch.zeros(0, 0), advantages=torch.zeros(0),
                       temperatures=torch.zeros(0, dtype=torch.float64), scores=torch.zeros(0), group_index=long1,
                       num_groups=0, rejections=rejections)


def normalised_advantages(scores: torch.Tensor, group_of_seq: torch.Tensor, scale_rewards: str) -> torch.Tensor:
    """TRL's GRPO advantages from scores, for groups of any (mixed) size: score − group mean, divided by the
    group's (scale_rewards: group) or the batch's (batch) unbiased std + 1e-4, or not divided (none)."""
    if scores.numel() == 0:
        return scores.clone()
    n_groups = int(group_of_seq.max()) + 1
    count = torch.zeros(n_groups).index_add_(0, group_of_seq, torch.ones_like(scores))
    mean = torch.zeros(n_groups).index_add_(0, group_of_seq, scores) / count
    centered = scores - mean[group_of_seq]
    if scale_rewards == "none":
        return centered
    if scale_rewards == "batch":
        std = scores.std() if scores.numel() > 1 else torch.tensor(0.0)
        return centered / (std + 1e-4)
    sq = torch.zeros(n_groups).index_add_(0, group_of_seq, centered ** 2)
    std = torch.where(count > 1, (sq / (count - 1).clamp(min=1)).sqrt(), torch.zeros_like(sq))
    return centered / (std[group_of_seq] + 1e-4)
