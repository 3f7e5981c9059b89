"""One group of a streamed rollout, generated across weight pushes (in-flight updates).

With streaming (producers/streaming.py) a push does not wait for the rollouts in flight: the policy gate interrupts
the server (sync/gate.py), and every request returns what it sampled so far (finish reason "abort"). The group's
unfinished completions are then continued under a new lease, with the weights the push published: prompt + what
each sampled so far as the new prompt, the rest of its token budget. Every token keeps the version that sampled it
and the logprob the server gave it then (its own behaviour logprob: the importance-sampling correction weighs each
token by the weights that really sampled it). The new weights recompute the prefix's KV cache (no cache of the old
weights is reused).

Continuing from a prefix is the same sampling as going on, except for what vLLM counts in the output only:
`presence_penalty` / `frequency_penalty` and `min_tokens` see the prefix as prompt (min_tokens is reduced by the
prefix's length), and a stop string split across the interruption is not matched.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from grpo_plugin.server.client import Completion, in_daemon_thread

ABORTED = "abort"  # vLLM's finish reason for an interrupted request


@dataclass
class Sampled:
    """One completion as its group finished it: tokens, their logprobs and the version that sampled each."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # per token: the policy version that sampled it
    finish_reason: str | None = None
    server: int = 0  # the server that sampled its last part
    requests: int = 0  # requests that made it (1: never interrupted)

    def extend(self, part: Completion, version: int) -> None:
        self.token_ids += part.token_ids
        self.logprobs += part.logprobs
        self.versions += [version] * len(part.token_ids)
        self.finish_reason, self.server = part.finish_reason, part.server
        self.requests += 1

    @property
    def interrupted(self) -> bool:
        return self.finish_reason == ABORTED


def rest_of(sampling: dict, done: int) -> dict | None:
    """The sampling settings of a continuation after `done` tokens: what is left of `max_tokens` (None: nothing is
    left) and of `min_tokens` (trl.generation_kwargs)."""
    left = sampling["max_tokens"] - done
    if left <= 0:
        return None
    out = {**sampling, "max_tokens": left}
    extra = sampling.get("extra")
    if extra and "min_tokens" in extra:
        out["extra"] = {**extra, "min_tokens": max(0, int(extra["min_tokens"]) - done)}
    return out


def continuation_seed(seed: int, index: int, done: int) -> int:
    """The seed of sample `index` of a group seeded `seed`, continued after `done` tokens (31 bits, like
    producers/seeds.py): fixed by the three, so a continued group samples the same in every run of the config
    given the same interruptions."""
    text = f"{seed}/{index}/{done}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "big") >> 1


def generate_group(client, gate, prompt_ids: list[int], n: int, sampling: dict,
                   seed: int | None = None) -> list[Sampled]:
    """`n` completions of `prompt_ids`, each continued after every interruption until it finishes (stop token,
    length) with the version published then. Raises GateClosed when the run ends meanwhile."""
    samples = [Sampled() for _ in range(n)]
    with gate.lease(interruptible=True) as lease:
        seeds = {} if seed is None else {"seeds": [seed]}
        for s, part in zip(samples, client.generate([prompt_ids], model=lease.model, n=n, **sampling, **seeds)[0]):
            s.extend(part, lease.version)
    while unfinished := [i for i, s in enumerate(samples) if s.interrupted]:
        with gate.lease(interruptible=True) as lease:  # waits while the push that interrupted them writes
            pending = []
            for i in unfinished:
                s = samples[i]
                rest = rest_of(sampling, len(s.token_ids))
                if rest is None:
                    s.finish_reason = "length"
                    continue
                if seed is not None:
                    rest["seeds"] = [continuation_seed(seed, i, len(s.token_ids))]
                pending.append((s, in_daemon_thread(client.generate, [prompt_ids + s.token_ids],
                                                    model=lease.model, n=1, **rest)))
            for s, future in pending:
                s.extend(future.result()[0][0], lease.version)
    return samples
