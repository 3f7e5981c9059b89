"""Which weights the server generates with, and who may change them while it does.

One `PolicyGate` per trainer, shared by the producer (generation, possibly in axolotl's background prefetch thread)
and the trainer's writes (main thread):

- `publish(version, model)`: the server now computes with the weights of optimizer step `version`, served under
  the name `model` (a new adapter name per lora_sync version; the base model's name otherwise).
- `lease(min_version)`: a rollout holds a lease for its whole generation. It waits until `min_version` is published
  (the producer's `grpo.max_policy_lag` bound), and pins the version and name it samples with: every completion
  knows which weights produced it. The post-push probe holds one too, from its thread (`acquire`/`release`):
  the version it measures is neither overwritten nor unloaded before the server answered.
- `writing()`: a write to weights the server computes with in place (a restart reload, an ipc optimizer step, a
  process restart). It waits until every lease has ended and admits no new one until it is done, so no write ever
  overlaps a generation. lora_sync never writes in place (a push loads a new name): it asks `in_use(name)` before
  it unloads an old version instead.

Streaming (`trl.streaming_partial_batch`, producers/streaming.py): rollouts take INTERRUPTIBLE leases, one per
request, and the gate is given an `interrupt` (abort every request on the server(s)). A write then does not wait
for them to finish: once the plain leases (the probe's) have ended, it interrupts the server; each interrupted
request returns what it sampled so far, its lease ends, and the rollout continues from there under a new lease,
with the new weights (producers/inflight.py). A publish that loads new weights next to the old ones (lora_sync)
interrupts the rollouts still sampling an older version, so they continue with the new one.

Without prefetch or streaming all of this is uncontended (one thread): nothing waits.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass


class PolicyLagTimeout(RuntimeError):
    """A rollout waited too long for the policy version `grpo.max_policy_lag` requires."""


class GateClosed(RuntimeError):
    """The run is over: no new generation starts (a prefetched rollout waiting for a version gives up)."""


@dataclass(frozen=True)
class Lease:
    version: int
    model: str
    interruptible: bool = False


INTERRUPT_AGAIN_S = 0.5  # a request sent just after an interrupt is caught by the next one


class PolicyGate:
    def __init__(self, interrupt: Callable[[], None] | None = None):
        """`interrupt`: ends every generation request on the server(s) now, each returning what it sampled so far
        (streaming only; None: writes wait for every lease to end)."""
        self._interrupt = interrupt
        self._interruptible: Counter[int] = Counter()  # version -> interruptible leases held now
        self.interrupts = 0  # how often a write or a publish interrupted rollouts
        self._cond = threading.Condition()
        self._version: int | None = None
        self._model: str | None = None
        self._leases: Counter[str] = Counter()  # model name -> rollouts generating with it now
        self._writing = False
        self._writers_waiting = 0
        self._closed = False

    @property
    def version(self) -> int | None:
        return self._version

    def publish(self, version: int, model: str) -> None:
        with self._cond:
            self._version, self._model = version, model
            self._cond.notify_all()
            # new weights served beside the old (a lora_sync push): rollouts still on an older version move on
            # (not while a probe's request runs: the interrupt would end it too; those rollouts finish as they are)
            stale = (self._interrupt is not None and not self._writing and self._only_rollouts()
                     and any(v < version for v in self._interruptible))
        if stale:
            self._interrupt_now()

    def _only_rollouts(self) -> bool:
        """Under the lock: interruptible leases are held, and no plain one (a probe's)."""
        held = sum(self._interruptible.values())
        return held > 0 and held == sum(self._leases.values())

    def _interrupt_now(self) -> None:
        self.interrupts += 1
        self._interrupt()

    def acquire(self, min_version: int | None = None, timeout: float | None = None, *,
                interruptible: bool = False) -> Lease:
        """Pin the published version for one generation (or one probe); `release()` it when done, from any
        thread. Waits until `min_version` is published; writers waiting go first (a push is never starved by a
        stream of rollouts). `interruptible`: a write may interrupt the generation (streaming)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while (self._version is None or self._writing or self._writers_waiting
                   or (min_version is not None and self._version < min_version)):
                if self._closed:
                    raise GateClosed("the run is over; no new rollout is generated")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise PolicyLagTimeout(
                        f"a rollout waited {timeout:.0f} s for policy version {min_version} (grpo.max_policy_lag); "
                        f"the server holds version {self._version}")
                self._cond.wait(left)
            lease = Lease(self._version, self._model, interruptible and self._interrupt is not None)
            self._leases[lease.model] += 1
            if lease.interruptible:
                self._interruptible[lease.version] += 1
            return lease

    def release(self, lease: Lease) -> None:
        with self._cond:
            self._leases[lease.model] -= 1
            if lease.interruptible:
                self._interruptible[lease.version] -= 1
                if self._interruptible[lease.version] <= 0:
                    del self._interruptible[lease.version]
            if self._leases[lease.model] <= 0:
                del self._leases[lease.model]
            self._cond.notify_all()

    @contextmanager
    def lease(self, min_version: int | None = None, timeout: float | None = None, *, interruptible: bool = False):
        """`acquire()` for the duration of a `with` block."""
        lease = self.acquire(min_version, timeout, interruptible=interruptible)
        try:
            yield lease
        finally:
            self.release(lease)

    def close(self) -> None:
        """The run ends: wake every rollout still waiting for a version (the prefetch thread's last one may wait
        for a push that never comes: with sync_interval > 1, or after the last step) so it ends instead of
        holding the process at exit."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def in_use(self, model: str) -> bool:
        with self._cond:
            return self._leases[model] > 0

    def begin_write(self) -> None:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writing or self._leases:
                    # no new lease starts now; the probe's (plain) leases end first (an interrupt would end its
                    # request too), then the rollouts' requests are interrupted, again while any is still held
                    if self._interrupt is None or not self._only_rollouts():
                        self._cond.wait()
                        continue
                    self._cond.release()
                    try:
                        self._interrupt_now()
                    finally:
                        self._cond.acquire()
                    self._cond.wait_for(lambda: not self._leases, INTERRUPT_AGAIN_S)
            finally:
                self._writers_waiting -= 1
            self._writing = True

    def end_write(self) -> None:
        with self._cond:
            self._writing = False
            self._cond.notify_all()

    @contextmanager
    def writing(self, exclusive: bool = True):
        """Exclusive of every generation (`exclusive=False`: a no-op, for writes that never touch served weights)."""
        if not exclusive:
            yield
            return
        self.begin_write()
        try:
            yield
        finally:
            self.end_write()
