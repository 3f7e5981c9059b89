"""Atropos batches → the tensors axolotl's GRPO loss reads. Pure and vectorised; validates as it goes.

An Atropos batch is a list of groups (atroposlib's ScoredDataGroup as the run-api serves it). Per sequence:
`tokens` (prompt + completion, one list), `masks` (= labels: -100 where the token is not trained, else the token
id), `inference_logprobs` (aligned 1:1 with `tokens`: the logprob the server gave token t given tokens < t; 1.0 at
masked positions), one `score`; optionally per-token `advantages`, per-sequence `overrides`
(`set_advantage_to_zero`, `temperature`), `generation_params` / `group_overrides` (`temperature`).

Mapping onto TRL's prompt/completion layout: the prompt is everything before the first trained position
(at least one token: position 0 has no context and is never trained); the completion is the rest.
`train_mask` is 1 exactly where `masks` is not -100 — masked stretches inside a completion (tool output, a user
turn) stay untrained (it becomes axolotl's `tool_mask`) — while `completion_mask` is 1 at every token of the
sequence: the trainer attends to the masked stretches, as the server did when it sampled what follows them. The
logprob of completion token j is scored from all tokens before it, which is
the one-token shift of the labels view (`input_ids = tokens[:-1]`, `labels = masks[1:]`); `inference_logprobs`
need no shift in this layout.

Advantages: the env's per-token `advantages` when a group has them, else the group's scores normalised within
the group (TRL's `scale_rewards`: group | batch | none, with TRL's std + 1e-4); `set_advantage_to_zero` zeroes a
sequence. Temperature per sequence: `overrides[i].temperature` > `generation_params.temperature` >
`group_overrides.temperature` > the configured default. The trainer divides its logits by it, as the server did.

A group that cannot be trained on is rejected as a whole with a reason naming the field and position; the other
groups are kept. Input: the groups as Python lists (the run-api's reply decoded by orjson, in the fetcher's
thread). Per-group checks work on sequence lengths; per-token checks and the prompt/completion layout are two
compiled passes (numba) over flat arrays.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace
from itertools import chain

import numpy as np
import torch
from numba import njit

IGNORE = -100  # atroposlib's masked-label value
FIELDS = ("tokens", "masks", "inference_logprobs", "advantages")  # the per-token fields of a group
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
    completion_mask: torch.Tensor  # (S, C) 1 at the sequence's tokens (attended to), 0 at padding
    train_mask: torch.Tensor  # (S, C) 1 where trained (masks not -100): axolotl's tool_mask
    completion_lengths: torch.Tensor  # (S,) tokens after the prompt (trained or not)
    sampling_logps: torch.Tensor  # (S, C) inference logprobs, 0 where not trained
    advantages: torch.Tensor  # (S,) or (S, C)
    temperatures: torch.Tensor  # (S,) float64: the exact values the server sampled with
    scores: torch.Tensor  # (S,)
    group_index: torch.Tensor  # (S,) index of each sequence's group in the batch as received
    num_groups: int  # groups kept
    rejections: list[Rejection] = field(default_factory=list)
    tokens: np.ndarray | None = None  # the kept sequences' tokens, concatenated (as received)
    lengths: np.ndarray | None = None  # their lengths

    def fingerprints(self) -> list[str]:
        """in_vllm/ledger.py's fingerprint of each kept sequence's tokens (what the server recorded)."""
        if self.tokens is None:
            return []
        offsets = np.cumsum(self.lengths) - self.lengths
        return [hashlib.blake2b(self.tokens[o:o + n].tobytes(), digest_size=12).hexdigest()
                for o, n in zip(offsets.tolist(), self.lengths.tolist())]

    @property
    def num_sequences(self) -> int:
        return int(self.prompt_ids.shape[0])


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_temperature(t, source: str) -> float | str:
    if not _number(t) or not math.isfinite(t) or t <= 0:
        return f"{source}.temperature is {t!r}; it must be a number > 0"
    return float(t)


def _temperatures(g: dict, n_seq: int, default: float) -> list[float] | str:
    """Per sequence: overrides[i].temperature > generation_params > group_overrides > default (or a reason)."""
    group_t: float | str = default
    for source in ("group_overrides", "generation_params"):  # the later one wins
        holder = g.get(source) or {}
        if "temperature" in holder:
            group_t = _check_temperature(holder["temperature"], source)
    overrides = g.get("overrides") or []
    if not any(ov and "temperature" in ov for ov in overrides):
        return group_t if isinstance(group_t, str) else [group_t] * n_seq
    out = []
    for i in range(n_seq):
        ov = overrides[i] or {}
        t = _check_temperature(ov["temperature"], f"overrides[{i}]") if "temperature" in ov else group_t
        if isinstance(t, str):
            return t
        out.append(t)
    return out


Shape = dict  # field -> None (absent / null) | np.ndarray of per-sequence lengths | str (why it is unusable)


def _shape_from_lists(g) -> Shape:
    shape: Shape = {}
    for key in FIELDS:
        rows = g.get(key) if isinstance(g, dict) else None
        if rows is None:
            shape[key] = None
        elif not isinstance(rows, list):
            shape[key] = f"`{key}` is a {type(rows).__name__}, not a list of sequences"
        else:
            bad = next((i for i, r in enumerate(rows) if not isinstance(r, list)), None)
            shape[key] = (f"{key}[{bad}] is a {type(rows[bad]).__name__}, not a list" if bad is not None
                          else np.fromiter(map(len, rows), dtype=np.int64, count=len(rows)))
    return shape


def _structure(g, shape: Shape, max_len: int, default_temperature: float) -> str | list[float]:
    """Per-sequence temperatures, or the first reason the group's shape cannot be trained on."""
    if not isinstance(g, dict):
        return f"is a {type(g).__name__}, not a ScoredDataGroup object"
    tl = shape["tokens"]
    if isinstance(tl, str):
        return tl
    if tl is None or len(tl) == 0:
        return "`tokens` is missing or empty"
    n_seq = len(tl)
    for key in ("masks", "inference_logprobs", "advantages"):
        sh = shape[key]
        if sh is None:
            if key == "advantages":
                continue
            hint = (" (the trainer corrects for stale rollouts with them: generate through atroposlib's "
                    "ManagedServer with `server_type: vllm` against the grpo_plugin server)"
                    if key == "inference_logprobs" else "")
            return f"`{key}` is missing{hint}"
        if isinstance(sh, str):
            return sh
        if len(sh) != n_seq:
            return f"`{key}` has {len(sh)} entries for {n_seq} sequences"
    for key in ("scores", "overrides"):
        val = g.get(key)
        if val is None:
            if key == "scores":
                return "`scores` is missing"
            continue
        if not isinstance(val, list) or len(val) != n_seq:
            return f"`{key}` has {len(val) if isinstance(val, list) else type(val).__name__} entries for " \
                   f"{n_seq} sequences"
    for i, ov in enumerate(g.get("overrides") or []):
        if ov is not None and not isinstance(ov, dict):
            return f"overrides[{i}] is a {type(ov).__name__}, not an object"
    for key in ("generation_params", "group_overrides"):
        if g.get(key) is not None and not isinstance(g[key], dict):
            return f"`{key}` is a {type(g[key]).__name__}, not an object"
    for i, sc in enumerate(g["scores"]):
        if not _number(sc) or not math.isfinite(sc):
            return f"scores[{i}] is {sc!r}; scores must be finite numbers"
    short = np.flatnonzero(tl < 2)
    if short.size:
        i = int(short[0])
        return f"sequence {i} has {int(tl[i])} token(s); at least 2 are needed (a prompt token and a trained one)"
    long_ = np.flatnonzero(tl > max_len)
    if long_.size:
        i = int(long_[0])
        return (f"sequence {i} has {int(tl[i])} tokens, more than max_token_len {max_len} "
                "(grpo.atropos.max_token_len)")
    for key in ("masks", "inference_logprobs", "advantages"):
        sh = shape[key]
        if sh is not None:
            ragged = np.flatnonzero(sh != tl)
            if ragged.size:
                i = int(ragged[0])
                return f"{key}[{i}] has {int(sh[i])} entries but tokens[{i}] has {int(tl[i])} (ragged sequence)"
    return _temperatures(g, n_seq, default_temperature)


def _flat(rows_per_group: list[list[list]], count: int, dtype) -> np.ndarray:
    return np.fromiter(chain.from_iterable(chain.from_iterable(rows_per_group)), dtype=dtype, count=count)


def _from_lists(groups: list, kept: list[int], total: int):
    gs = [groups[i] for i in kept]
    tok = _flat([g["tokens"] for g in gs], total, np.int64)
    msk = _flat([g["masks"] for g in gs], total, np.int64)
    lps = _flat([g["inference_logprobs"] for g in gs], total, np.float64)
    adv = None
    if any(g.get("advantages") is not None for g in gs):
        adv = _flat([g.get("advantages") or [[0.0] * len(t) for t in g["tokens"]] for g in gs], total, np.float64)
    return tok, msk, lps, adv


@njit(cache=True, nogil=True)
def _token_checks(tok, msk, lps, adv, has_adv, lens, vocab, slack):
    """Per sequence, the position of the first token failing each check (-1: none) — 0 token id outside the
    vocabulary, 1 mask neither -100 nor the token, 2 logprob not finite or > 0 at a trained position, 3
    advantage not finite at a trained position — and of the first trained token (-1: none)."""
    S = lens.shape[0]
    first = np.full((4, S), -1, np.int64)
    first_trained = np.full(S, -1, np.int64)
    off = 0
    for s in range(S):
        for p in range(lens[s]):
            k = off + p
            t = tok[k]
            m = msk[k]
            if first[0, s] < 0 and (t < 0 or t >= vocab):
                first[0, s] = p
            if m != -100:
                if first[1, s] < 0 and m != t:
                    first[1, s] = p
                if p > 0:  # position 0 has nothing before it: prompt whatever its mask says
                    if first_trained[s] < 0:
                        first_trained[s] = p
                    lp = lps[k]
                    if first[2, s] < 0 and not (np.isfinite(lp) and lp <= slack):
                        first[2, s] = p
                    if has_adv and first[3, s] < 0 and not np.isfinite(adv[k]):
                        first[3, s] = p
        off += lens[s]
    return first, first_trained


@njit(cache=True, nogil=True)
def _layout(tok, msk, lps, adv, has_adv, offsets, lens, prompt_len, P, C, pad):
    """Left-padded prompts, right-padded completions with their mask, sampling logprobs and token advantages
    (every cell written once)."""
    S = lens.shape[0]
    prompt_ids = np.empty((S, P), np.int64)
    prompt_mask = np.empty((S, P), np.int64)
    completion_ids = np.empty((S, C), np.int64)
    completion_mask = np.empty((S, C), np.int64)
    train_mask = np.empty((S, C), np.int64)
    sampling = np.empty((S, C), np.float32)
    adv_tok = np.zeros((S, C) if has_adv else (0, 0), np.float32)
    for s in range(S):
        o, pl = offsets[s], prompt_len[s]
        lead = P - pl
        for p in range(lead):
            prompt_ids[s, p] = pad
            prompt_mask[s, p] = 0
        for p in range(pl):
            prompt_ids[s, lead + p] = tok[o + p]
            prompt_mask[s, lead + p] = 1
        cl = lens[s] - pl
        base = o + pl
        for c in range(cl):
            k = base + c
            completion_ids[s, c] = tok[k]
            completion_mask[s, c] = 1
            if msk[k] != -100:
                train_mask[s, c] = 1
                sampling[s, c] = lps[k]
                if has_adv:
                    adv_tok[s, c] = adv[k]
            else:
                train_mask[s, c] = 0
                sampling[s, c] = 0.0
        for c in range(cl, C):
            completion_ids[s, c] = pad
            completion_mask[s, c] = 0
            train_mask[s, c] = 0
            sampling[s, c] = 0.0
    return prompt_ids, prompt_mask, completion_ids, completion_mask, train_mask, sampling, adv_tok


_CHECK_MESSAGES = (
    lambda r: f"tokens[{r.s}][{r.p}] = {r.tok} is not a token id of this model (vocabulary size {r.vocab})",
    lambda r: f"masks[{r.s}][{r.p}] = {r.msk}: a mask must be -100 or the token id ({r.tok})",
    lambda r: (f"inference_logprobs[{r.s}][{r.p}] = {r.lp!r} at a trained position (a logprob must be finite and "
               f"<= 0; {MASKED_LOGPROB} marks masked positions only)"),
    lambda r: f"advantages[{r.s}][{r.p}] = {r.adv!r} is not finite",
)


@dataclass
class _At:
    s: int
    p: int
    tok: int
    msk: int
    lp: float
    adv: float
    vocab: int


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

    shapes = [_shape_from_lists(g) for g in groups]
    seqs = _sequences(groups, shapes, max_len, default_temperature, reject)  # 1, 2
    if seqs is None:
        return _empty(rejections)
    first_trained, bad_group = _token_problems(seqs, len(groups), vocab_size, reject)  # 3
    kept = _keep_good(seqs, first_trained, bad_group)  # 4
    if kept is None:
        return _empty(rejections)
    seqs, prompt_len = kept
    good_groups, group_of_seq = np.unique(seqs.group, return_inverse=True)
    scores = torch.tensor([float(x) for gi in good_groups.tolist() for x in groups[gi]["scores"]],
                          dtype=torch.float32)

    # 5. prompt = tokens before the first trained position; completion = the rest (one compiled pass)
    comp_len = seqs.lengths - prompt_len
    prompt_ids, prompt_mask, completion_ids, completion_mask, train_mask, sampling, adv_tok = _layout(
        seqs.tok, seqs.msk, seqs.lps, seqs.adv, seqs.has_adv, seqs.offsets(), seqs.lengths, prompt_len,
        int(prompt_len.max()), int(comp_len.max()), int(pad_token_id))
    advantages = _advantages(groups, shapes, seqs, scores, group_of_seq, adv_tok, scale_rewards)  # 6

    rejections.sort(key=lambda r: r.group)
    return TensorBatch(
        prompt_ids=torch.from_numpy(prompt_ids), prompt_mask=torch.from_numpy(prompt_mask),
        completion_ids=torch.from_numpy(completion_ids), completion_mask=torch.from_numpy(completion_mask),
        train_mask=torch.from_numpy(train_mask),
        completion_lengths=torch.from_numpy(comp_len), sampling_logps=torch.from_numpy(sampling),
        advantages=advantages, temperatures=torch.from_numpy(seqs.temps), scores=scores,
        group_index=torch.from_numpy(seqs.group), num_groups=len(good_groups), rejections=rejections,
        tokens=seqs.tok, lengths=seqs.lengths)


@dataclass
class _Sequences:
    """The kept groups' sequences, flat: their tokens' fields concatenated, and one entry per sequence."""

    tok: np.ndarray
    msk: np.ndarray
    lps: np.ndarray
    adv: np.ndarray  # the env's per-token advantages (0.0 for a group without them); empty when no group has any
    has_adv: bool
    lengths: np.ndarray
    group: np.ndarray  # the index of each sequence's group in the batch as received
    in_group: np.ndarray  # its index within its group
    temps: np.ndarray  # float64: the temperature each was sampled at

    def offsets(self) -> np.ndarray:
        """Where each sequence's tokens start."""
        return np.cumsum(self.lengths) - self.lengths


def _screen(groups: list, shapes: list[Shape], max_len: int, default_temperature: float,
            reject) -> dict[int, list[float]]:
    """1. Shapes, lengths, scores, temperatures, per group (numpy over its sequence lengths): each group that
    passes, with its sequences' temperatures."""
    temps_of: dict[int, list[float]] = {}
    for gi, g in enumerate(groups):
        res = _structure(g, shapes[gi], max_len, default_temperature)
        if isinstance(res, str):
            reject(gi, res)
        else:
            temps_of[gi] = res
    return temps_of


def _flat_fields(groups: list, shapes: list[Shape], kept: list[int], reject):
    """2. The per-token fields of the kept groups as flat arrays (tokens, masks, logprobs, advantages or None). A
    non-numeric entry somewhere: the groups are tried one by one, and those that hold one are rejected. Returns the
    groups still kept and their arrays."""

    def flat(idx: list[int]):
        total = int(sum(int(shapes[gi]["tokens"].sum()) for gi in idx))
        return _from_lists(groups, idx, total)

    try:
        return kept, flat(kept)
    except (TypeError, ValueError, OverflowError):
        good = []
        for gi in kept:
            try:
                flat([gi])
                good.append(gi)
            except (TypeError, ValueError, OverflowError) as exc:
                reject(gi, f"non-numeric entries in tokens/masks/inference_logprobs/advantages ({exc})")
        return good, flat(good)


def _sequences(groups: list, shapes: list[Shape], max_len: int, default_temperature: float,
               reject) -> _Sequences | None:
    """Steps 1 and 2: the sequences of the groups that pass the per-group checks and hold numbers only; None when
    no group is left."""
    temps_of = _screen(groups, shapes, max_len, default_temperature, reject)
    kept, (tok, msk, lps, adv) = _flat_fields(groups, shapes, list(temps_of), reject)
    if not kept:
        return None
    counts = [len(shapes[gi]["tokens"]) for gi in kept]
    return _Sequences(tok=tok, msk=msk, lps=lps, adv=adv if adv is not None else np.zeros(0), has_adv=adv is not None,
                      lengths=np.concatenate([shapes[gi]["tokens"] for gi in kept]),
                      group=np.repeat(np.asarray(kept, dtype=np.int64), counts),
                      in_group=np.concatenate([np.arange(n) for n in counts]),
                      temps=np.asarray([t for gi in kept for t in temps_of[gi]], dtype=np.float64))


def _token_problems(seqs: _Sequences, n_groups: int, vocab_size: int, reject) -> tuple[np.ndarray, np.ndarray]:
    """3. The per-token checks (one compiled pass): each sequence's first trained position, and which groups are
    rejected (each for the first problem found in it)."""
    offsets = seqs.offsets()
    first, first_trained = _token_checks(seqs.tok, seqs.msk, seqs.lps, seqs.adv, seqs.has_adv, seqs.lengths,
                                         vocab_size, LOGPROB_SLACK)
    bad_group = np.zeros(n_groups, dtype=bool)
    for kind, message in enumerate(_CHECK_MESSAGES):
        for sq in np.flatnonzero(first[kind] >= 0).tolist():
            gi = int(seqs.group[sq])
            if not bad_group[gi]:
                k = int(offsets[sq] + first[kind, sq])
                at = _At(int(seqs.in_group[sq]), int(first[kind, sq]), int(seqs.tok[k]), int(seqs.msk[k]),
                         float(seqs.lps[k]), float(seqs.adv[k]) if seqs.has_adv else 0.0, vocab_size)
                reject(gi, message(at))
                bad_group[gi] = True
    for sq in np.flatnonzero(first_trained < 0).tolist():
        gi = int(seqs.group[sq])
        if not bad_group[gi]:
            reject(gi, f"sequence {int(seqs.in_group[sq])} has no trained token (every mask after position 0 is "
                       "-100)")
            bad_group[gi] = True
    return first_trained, bad_group


def _keep_good(seqs: _Sequences, first_trained: np.ndarray,
               bad_group: np.ndarray) -> tuple[_Sequences, np.ndarray] | None:
    """4. The sequences of the groups not rejected, with their first trained positions; None when none is left."""
    keep_seq = ~bad_group[seqs.group]
    if keep_seq.all():
        return seqs, first_trained
    if not keep_seq.any():
        return None
    keep_tok = np.repeat(keep_seq, seqs.lengths)
    return replace(seqs, tok=seqs.tok[keep_tok], msk=seqs.msk[keep_tok], lps=seqs.lps[keep_tok],
                   adv=seqs.adv[keep_tok] if seqs.has_adv else seqs.adv, lengths=seqs.lengths[keep_seq],
                   group=seqs.group[keep_seq], in_group=seqs.in_group[keep_seq],
                   temps=seqs.temps[keep_seq]), first_trained[keep_seq]


def _advantages(groups: list, shapes: list[Shape], seqs: _Sequences, scores: torch.Tensor, group_of_seq: np.ndarray,
                adv_tok: np.ndarray, scale_rewards: str) -> torch.Tensor:
    """6. The scores normalised within their groups (normalised_advantages); per token where any group sent its own
    advantages (those groups' own, the others' per-sequence value on every token); 0 where a sequence's override
    says `set_advantage_to_zero`."""
    advantages = normalised_advantages(scores, torch.from_numpy(group_of_seq.reshape(-1)), scale_rewards)
    if seqs.has_adv:
        env_given = torch.tensor([shapes[gi]["advantages"] is not None for gi in seqs.group.tolist()])
        advantages = torch.where(env_given.unsqueeze(1), torch.from_numpy(adv_tok),
                                 advantages.unsqueeze(1).expand(len(seqs.lengths), adv_tok.shape[1]))
    zero = torch.tensor([bool(((groups[gi].get("overrides") or [None] * (k + 1))[k] or {}).get("set_advantage_to_zero"))
                         for gi, k in zip(seqs.group.tolist(), seqs.in_group.tolist())], dtype=torch.bool)
    if bool(zero.any()):
        advantages = advantages.masked_fill(zero.view(-1, *([1] * (advantages.dim() - 1))), 0.0)
    return advantages


def warm_up() -> None:
    """Compile (or load from numba's cache) both kernels, on a small batch."""
    group = {"tokens": [[1, 2, 3]] * 2, "masks": [[-100, 2, 3]] * 2, "inference_logprobs": [[1.0, -0.5, -1e-3]] * 2,
             "advantages": [[0.0, 1.0, -1.0]] * 2, "scores": [1.0, 0.0]}
    tensorize([group] * 8, pad_token_id=0, vocab_size=8, max_len=8)


def _empty(rejections: list[Rejection]) -> TensorBatch:
    rejections.sort(key=lambda r: r.group)
    long2, long1 = torch.zeros(0, 0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    return TensorBatch(prompt_ids=long2, prompt_mask=long2, completion_ids=long2, completion_mask=long2,
                       train_mask=long2, completion_lengths=long1, sampling_logps=torch.zeros(0, 0),
                       advantages=torch.zeros(0), temperatures=torch.zeros(0, dtype=torch.float64),
                       scores=torch.zeros(0), group_index=long1,
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
