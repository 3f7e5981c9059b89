"""`trl.async_prefetch: true`: axolotl's own `AsyncDataProducer` generates the next rollout(s) in a background
thread while the trainer trains on the current one (`trl.prefetch_depth` of them ahead).

What this subclass adds for the plugin:
- the time the trainer really WAITED for a rollout (its record's `wait_ms`), not the time generating it took;
- a server lost under a prefetched rollout is recovered on the main thread: the background thread never
  restarts the server nor reads the trainer's weights (the optimizer may be writing them). The queued rollouts are
  dropped (they may have been sampled by the lost server), the guard restarts the server and restores the
  trainer's current weights, this step's rollout is generated again, and prefetching starts over. With several
  ranks every rank reports here, once per rollout taken, whether it lost the server; all recover if one did (a rank
  whose rollout ended before the outage keeps it: server/rank_agreement.py).

Ordering against weight writes is the policy gate's job (sync/gate.py), not this class's.
"""

from __future__ import annotations

import contextlib
import time

from axolotl.core.trainers.grpo.async_trainer import AsyncDataProducer

from grpo_plugin.producers.local import ITEMS_LOCAL, sum_over_ranks
from grpo_plugin.producers.rollout import record_of


class PrefetchingProducer(AsyncDataProducer):
    def __init__(self, inner, *, guard, background_produce_kwargs: dict | None = None):
        """`guard`: the run's ServerGuard (server/recovery.py), which recovers a lost server on the main thread."""
        super().__init__(inner, background_produce_kwargs=background_produce_kwargs)
        self.guard = guard
        self._outages_seen = 0

    def produce(self, model, global_step: int, **kwargs):
        if self._num_processes is None:
            # every rank prefetches its own prompts on its own client, and nothing collective runs in the background
            # (axolotl's default with several ranks: rank 0 alone generates, then broadcasts). The one collective
            # of a local rollout, summing num_items_in_batch over the ranks, is done here, on the main thread.
            self._num_processes, self._is_main = 1, True
        t0 = time.perf_counter()
        failed, why, stale = None, None, False
        with self.guard.caller_agrees():  # several ranks: one agreement per rollout taken (below), on every rank
            try:
                dataset = super().produce(model, global_step, **kwargs)
            except Exception as exc:
                if not self.guard.enabled:
                    raise
                # failed on a server that was replaced meanwhile (the main thread recovered it during a push, the
                # background request's own watch saw the same outage): every server is back now, so the failure
                # is stale, not a real error nor a second outage; the queue goes, nothing to recover
                failed, stale = exc, len(self.guard.outages) > self._outages_seen and self.guard.serving()
                why = None if stale else self.guard.is_lost(exc)
            lost = self.guard.agree("rollout", why)  # several ranks: a peer's lost server is this rank's too
            if lost is not None:
                self.drop_queue()
                self.guard.recover("rollout", lost)
            if failed is not None:
                if why is None and not stale:
                    raise failed
                self.drop_queue()
                dataset = super().produce(model, global_step, **kwargs)  # this step synchronously, then prefetch
        self._outages_seen = len(self.guard.outages)
        if dataset._data.get(ITEMS_LOCAL):
            sum_over_ranks(dataset._data, self._inner.spec)
        record_of(dataset._data).wait_ms = (time.perf_counter() - t0) * 1e3
        return dataset

    def drop_queue(self) -> None:
        """Forget the queued rollouts; wait for the one being generated (its lease must end before a restore
        writes weights) — on a lost server it fails fast or is abandoned by the client's watch."""
        queued, self._queue = list(self._queue), type(self._queue)()
        for future in queued:
            future.cancel()
        for future in queued:
            with contextlib.suppress(Exception):
                future.result()
        self._initialized = False
