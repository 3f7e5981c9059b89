"""Streaming (`trl.streaming_partial_batch: true`): groups train in the order they finish, and a push never waits
for the rollouts in flight.

- `grpo.stream_groups` groups (default: two batches' worth) generate at once, each in a worker thread of its own
  (producers/stream.py); a batch takes the first whole groups to finish, whatever prompt order they came in, and the
  tail keeps generating into later batches.
- A push interrupts the rollouts in flight and they continue with the new weights (producers/inflight.py): every
  token carries the version that sampled it, and its own sampling logprob (TRL's importance-sampling correction,
  `vllm_importance_sampling_mode`, weighs each token by it).
- Staleness: a batch trained at step g takes only groups whose every token was sampled by version g -
  `grpo.max_policy_lag` or newer (default 4 with streaming). An older group is generated again from its prompt (at
  most twice, then dropped); both are counted in the step's metrics (`stream_regenerated`, `stream_dropped`).

Each rollout's record (producers/rollout.py) holds the oldest and newest version of its tokens and the step's
figures: token lag histogram, tokens per version, continued completions, the tail (group time and completion
length, median and max), how long the trainer waited and how long the stream had no group generating.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass

import torch

from grpo_plugin.producers.completion_tensors import rollout_tensors
from grpo_plugin.producers.inflight import Sampled, generate_group
from grpo_plugin.producers.local import LocalRolloutProducer, deferred_rollout
from grpo_plugin.producers.rollout import Rollout
from grpo_plugin.producers.stream import Failed, GroupStream, StreamStats, Work
from grpo_plugin.server.group import replicas_of


@dataclass
class StreamedGroup:
    rows: list[dict]  # the group's input rows (one prompt, num_generations times)
    prompt_ids: list[int]
    samples: list[Sampled]

    @property
    def oldest(self) -> int:
        return min(min(s.versions, default=_NEVER) for s in self.samples)

    @property
    def newest(self) -> int:
        return max(max(s.versions, default=-1) for s in self.samples)


_NEVER = 1 << 62  # a completion of no tokens has no version: it bounds nothing


def stream_fields(groups: list[StreamedGroup], step: int, stats: StreamStats, interrupts: int) -> dict:
    """The step's streaming figures (grpo_metrics.jsonl): per-token lag (step - the version that sampled it),
    tokens per version, what the staleness bound regenerated or dropped, completions continued across pushes,
    interrupts, the tail, the stream's idle time."""
    versions = Counter(v for g in groups for s in g.samples for v in s.versions)
    lags = Counter({step - v: n for v, n in versions.items()})
    tokens = sum(versions.values())
    lengths = [len(s.token_ids) for g in groups for s in g.samples]
    return {
        "token_lag_max": max(lags, default=0),
        "token_lag_mean": round(sum(lag * n for lag, n in lags.items()) / tokens, 4) if tokens else 0.0,
        "token_lag_hist": {str(k): lags[k] for k in sorted(lags)},
        "tokens_per_version": {str(k): versions[k] for k in sorted(versions)},
        "stream_regenerated": stats.regenerated,
        "stream_dropped": stats.dropped,
        "stream_continued": sum(1 for g in groups for s in g.samples if s.requests > 1),
        "stream_interrupts": interrupts,
        "stream_idle_ms": round(stats.idle_s * 1e3, 1),
        "group_s_p50": round(statistics.median(stats.group_s), 3) if stats.group_s else None,
        "group_s_max": round(max(stats.group_s), 3) if stats.group_s else None,
        "completion_tokens_p50": statistics.median(lengths) if lengths else None,
        "completion_tokens_max": max(lengths, default=None),
    }


class StreamingProducer(LocalRolloutProducer):
    """The local producer's prompts, spec and tensors; its groups from a GroupStream."""

    def __init__(self, *args, capacity: int | None = None, **kwargs):
        """`capacity`: groups under way at once (None: two batches' worth, known at the first batch)."""
        super().__init__(*args, **kwargs)
        self.capacity = capacity
        self.stream: GroupStream | None = None
        self._tokenize = threading.Lock()  # the tokenizer is not used from two threads at once
        self._interrupts = 0

    def _make_group(self, work: Work) -> StreamedGroup:
        spec = self.spec
        with self._tokenize:
            prompt_ids, images, _ = spec.tokenize_prompts([work.rows[0]["prompt"]])
        if images is not None:
            raise ValueError("grpo_plugin: multimodal prompts are not supported by the local producer")
        prompt = list(prompt_ids[0])
        seed = spec.seeds("stream", work.seq, [prompt])[0] if spec.seeds is not None else None
        samples = generate_group(spec.client, spec.gate, prompt, spec.num_generations, spec.sampling, seed)
        return StreamedGroup(work.rows, prompt, samples)

    def _start(self) -> None:
        rows = self._next_inputs()
        n_groups = len(rows) // self.spec.num_generations
        self.stream = GroupStream(self._make_group, self._next_inputs, self.spec.num_generations,
                                  self.capacity or 2 * n_groups)
        self.stream.feed(rows)
        self._groups_per_batch = n_groups

    def produce(self, model, global_step, *, skip_policy_logps=False, processing_class=None,
                accelerator=None, args=None, _rank0_only=False, **kwargs):
        spec = self.spec
        if self.stream is None:
            self._start()
        t0 = time.perf_counter()
        min_version = global_step - self.max_policy_lag
        groups, stats = self._take(min_version)
        wait_ms = (time.perf_counter() - t0) * 1e3
        interrupts, self._interrupts = spec.gate.interrupts - self._interrupts, spec.gate.interrupts

        g = spec.num_generations
        inputs = [row for grp in groups for row in grp.rows]
        prompts = [x["prompt"] for x in inputs]
        samples = [s for grp in groups for s in grp.samples]
        completion_ids = [s.token_ids for s in samples]
        server_rows = [0] * len(replicas_of(spec.client))
        for s in samples:
            server_rows[s.server] += 1
        tensors = rollout_tensors(
            [grp.prompt_ids for grp in groups for _ in range(g)], completion_ids, [s.logprobs for s in samples],
            pad_token_id=spec.pad_token_id, stop_token_ids=list(spec.stop_token_ids),
            mask_truncated=spec.mask_truncated, device=spec.device)
        n_tokens = torch.tensor(sum(len(c) for c in completion_ids), device=spec.device)
        record = Rollout(wait_ms=wait_ms, generate_ms=max(stats.group_s, default=0.0) * 1e3,
                         policy_version=min(grp.oldest for grp in groups),
                         newest_version=max(grp.newest for grp in groups), server_rows=server_rows,
                         stream=stream_fields(groups, global_step, stats, interrupts),
                         completion_tokens=int(n_tokens))
        return deferred_rollout(spec, tensors, n_tokens, inputs, prompts, completion_ids, record)

    def _take(self, min_version: int) -> tuple[list[StreamedGroup], StreamStats]:
        """This batch's groups; a lost server is recovered here (main thread) and the stream starts over."""
        while True:
            groups, stats = self.stream.take(self._groups_per_batch, lambda grp: grp.oldest >= min_version)
            if not (groups and isinstance(groups[0], Failed)):
                return groups, stats
            error = groups[0].error
            why = self.spec.guard.is_lost(error) if self.spec.guard.enabled else None
            if why is None:
                raise error
            self.stream.reset()  # what the lost server sampled is not trained
            self.spec.guard.recover("rollout", why, redo=False)

    def drop_queue(self) -> None:
        """A lost server may have sampled what the stream holds (trainer.py hands this to the sync session)."""
        if self.stream is not None:
            self.stream.reset()

    def shutdown(self) -> None:
        if self.stream is not None:
            self.stream.close()
