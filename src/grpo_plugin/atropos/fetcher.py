"""The background fetcher: run-api `/batch` → spool → tensorise → a bounded queue the trainer takes from.

The trainer's main thread only ever takes a prepared batch off the queue (no HTTP while one is queued). The
thread keeps at most `capacity` prepared batches ahead, polls `/batch` with a growing pause while none is ready
or the run-api does not answer (never giving up: the trainer decides how long to wait), and while it waits it
works out why, for the trainer's progress line: the run-api is unreachable, no environment has registered, the
environments have queued nothing yet, or groups are queued but do not make a batch — and if that is because
the trainer's batch size is not a multiple of the environments' group size, that is a fatal error naming both.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from grpo_plugin.atropos.api import AtroposAPI, AtroposError, BatchReply, NotRegisteredError, parse_batch
from grpo_plugin.atropos.spool import Spool, SpoolError
from grpo_plugin.server.process import Progress

LOG = logging.getLogger("grpo_plugin")
DIAGNOSE_EVERY = 10.0  # seconds between run-api status checks while no batch comes
DIAGNOSE_AFTER = 2.0  # seconds without a batch before the first check


class AtroposTimeout(RuntimeError):
    """No batch arrived within grpo.atropos.wait_timeout."""


class BatchFetcher:
    def __init__(self, api: AtroposAPI, spool: Spool, prepare: Callable[[int, dict, BatchReply], Any], *,
                 capacity: int, batch_size: int, poll_interval: float = 0.2, max_backoff: float = 5.0,
                 meta: Callable[[], dict] | None = None, reregister: Callable[[], None] | None = None,
                 warm_up: Callable[[], None] | None = None):
        self.api, self.spool, self.prepare = api, spool, prepare
        self.batch_size, self.poll, self.max_backoff = batch_size, poll_interval, max_backoff
        self.meta, self.reregister, self.warm_up = meta, reregister, warm_up
        self._queue: queue.Queue = queue.Queue(maxsize=capacity)
        self._replay: list[int] = []
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.waiting_reason = "asking the run-api for the first batch"
        self.fetched = 0
        self.odd_groups = 0  # waits during which the latest group's size did not divide the batch

    # ---- trainer side ---------------------------------------------------------------------------
    def start(self, replay: list[int]) -> None:
        self._replay = list(replay)
        self._thread = threading.Thread(target=self._run, name="grpo-atropos-fetcher", daemon=True)
        self._thread.start()

    def get(self, wait_timeout: float = 0.0, label: str = "waiting for an Atropos batch") -> Any:
        """The next prepared batch. Blocks (with a progress line after 5 s) until one is ready."""
        t0 = time.monotonic()
        progress = None
        while True:
            if self._error is not None:
                raise self._error
            try:
                item = self._queue.get(timeout=0.25)
            except queue.Empty:
                waited = time.monotonic() - t0
                if waited > 5.0:
                    progress = progress or Progress(label, every=15.0)
                    progress.update(self.waiting_reason)
                if wait_timeout and waited > wait_timeout:
                    raise AtroposTimeout(
                        f"no Atropos batch arrived within {wait_timeout:.0f} s (grpo.atropos.wait_timeout): "
                        f"{self.waiting_reason}") from None
                continue
            if progress is not None:
                progress.done("batch received")
            return item

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # ---- the thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            if self.warm_up is not None:
                self.waiting_reason = ("compiling the batch tensorisation kernels (numba, first use on this machine; "
                                       "cached afterwards)")
                self.warm_up()
                self.waiting_reason = "asking the run-api for the first batch"
            while self._replay and not self._stop.is_set():
                seq = self._replay.pop(0)
                meta, raw = self.spool.load(seq)
                reply = parse_batch(raw, f"spooled batch {self.spool.path(seq)}")
                if reply is None:
                    raise SpoolError(f"spooled batch {self.spool.path(seq)} holds no batch. Move it away to skip it.")
                self._put(self.prepare(seq, meta, reply))
            self._poll_loop()
        except BaseException as exc:  # handed to the trainer's thread, which raises it
            self._error = exc

    def _put(self, item) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.25)
                return
            except queue.Full:
                continue

    def _poll_loop(self) -> None:
        pause = self.poll
        idle_since = time.monotonic()
        last_diagnosis = 0.0
        while not self._stop.is_set():
            if self._queue.full():
                self._stop.wait(0.05)
                idle_since = time.monotonic()
                continue
            try:
                reply = self.api.batch()
            except NotRegisteredError as exc:
                if self.reregister is None:
                    raise
                LOG.warning("grpo_plugin: atropos: %s — registering again (a restarted run-api forgets the trainer "
                            "and every environment; restart the environments too)", exc)
                self.waiting_reason = "the run-api lost the trainer's registration; registered again"
                self.reregister()
                continue
            except AtroposError as exc:
                self.waiting_reason = f"the run-api does not answer ({exc}); retrying every {pause:.1f} s"
                self._stop.wait(pause)
                pause = min(self.max_backoff, pause * 2)
                continue
            if reply is None:
                now = time.monotonic()
                if now - idle_since > DIAGNOSE_AFTER and now - last_diagnosis > DIAGNOSE_EVERY:
                    last_diagnosis = now
                    self.waiting_reason = self._diagnose()
                self._stop.wait(pause)
                pause = min(self.max_backoff, pause * 1.5)
                continue
            pause, idle_since = self.poll, time.monotonic()
            meta = dict(self.meta() if self.meta else {}, fetched_at=time.time())
            seq = self.spool.add(meta, reply.raw)  # on disk before anything else may fail or stop
            self.fetched += 1
            self._put(self.prepare(seq, meta, reply))

    def _diagnose(self) -> str:
        """Why no batch is ready, in words."""
        try:
            status = self.api.status()
            queued = int(status.get("queue_size") or 0)
            if queued == 0:
                if not self.api.env_registered(0):
                    return ("no environment has registered with the run-api yet — start one (python -m "
                            "grpo_plugin.atropos.launch does it for you)")
                return "environments are connected; none has sent a scored group yet"
            example = self.api.latest_example()
        except AtroposError as exc:
            return f"the run-api does not answer ({exc})"
        group = len(example.get("tokens") or []) if isinstance(example, dict) else 0
        waiting = f"{queued} group(s) queued at the run-api, not yet a full batch of {self.batch_size} sequences"
        if group and self.batch_size % group:
            # one odd group (an env that splits a group, 5 + 3) is not the group size: warn, count, keep waiting;
            # if every group is like it, grpo.atropos.wait_timeout ends the run with this reason in its message
            self.odd_groups += 1
            LOG.warning("grpo_plugin: atropos: the latest group at the run-api has %d sequences, which does not "
                        "divide this trainer's batch of %d sequences", group, self.batch_size)
            waiting += (f"; the latest group has {group} sequences, which does not divide the batch: the run-api "
                        "forms batches of whole groups, so if the environments keep sending groups of that size no "
                        f"batch will come. Make micro_batch_size x gradient_accumulation_steps x processes a multiple "
                        "of the group size (set grpo.atropos.group_size to have it checked when the config loads)")
        return waiting
