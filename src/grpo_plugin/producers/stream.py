"""A pool of groups generating at once, handed out in the order they finish (streaming's engine).

`GroupStream` keeps `capacity` groups under way — generating, or finished and not yet taken — each in a worker
thread of its own, so the server always has work and a batch never waits for its slowest group: the tail keeps
generating into later batches. `take(n, accept)` returns the first `n` finished groups `accept` keeps; a group it
refuses (too old for the staleness bound) starts again from its prompt, first in line, at most `regenerations`
times, then is dropped. Both are counted (`taken_stats`): dropping biases training toward groups that finish fast.

Failures: a worker's exception is handed to the caller of `take` with its group (`Failed`); the caller decides
(a lost server: `reset` the stream, recover, go on).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grpo_plugin.sync.gate import GateClosed


@dataclass
class Failed:
    rows: list[dict]  # the group's input rows
    error: BaseException


@dataclass
class Work:
    rows: list[dict]
    regenerations: int = 0  # how often this group was refused as too old and started again
    started: float = 0.0
    seq: int = 0  # the order groups started in (seeds, tests)


@dataclass
class StreamStats:
    """What happened in the stream since the last `take`."""

    regenerated: int = 0  # groups refused as too old, started again
    dropped: int = 0  # groups refused as too old too often, dropped
    idle_s: float = 0.0  # time no group was generating (the server had none of this trainer's work)
    group_s: list[float] = field(default_factory=list)  # how long each taken group took to generate


class GroupStream:
    def __init__(self, make_group: Callable[[Work], Any], next_rows: Callable[[], list[dict]], group_size: int,
                 capacity: int, regenerations: int = 2, name: str = "grpo-stream"):
        """`make_group(work)`: generates one group (a worker thread); `next_rows()`: the prompt sampler's next batch
        of rows, each prompt `group_size` times in a row (called by one worker at a time)."""
        if capacity < 1:
            raise ValueError(f"a stream needs a capacity of at least one group, got {capacity}")
        self.make_group, self.next_rows, self.group_size = make_group, next_rows, group_size
        self.capacity, self.regenerations, self.name = capacity, regenerations, name
        self._cond = threading.Condition()
        self._todo: deque[Work] = deque()  # groups to start (a refused one first)
        self._done: deque[tuple[Work, Any]] = deque()  # finished groups, in the order they finished
        self._active = 0
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._epoch = 0  # bumped by reset: what a worker of an earlier epoch finishes is forgotten
        self._seq = 0
        self._rows_lock = threading.Lock()
        self._stats = StreamStats()
        self._idle_since: float | None = None

    def feed(self, rows: list[dict]) -> None:
        """Rows the prompt sampler gave already (the first batch): their groups start first."""
        g = self.group_size
        with self._cond:
            self._todo.extend(Work(rows[i:i + g]) for i in range(0, len(rows), g))
            self._cond.notify_all()

    # ---- workers ------------------------------------------------------------------------------
    def start(self) -> None:
        if self._threads:
            return
        self._idle_since = time.monotonic()
        for i in range(self.capacity):
            t = threading.Thread(target=self._work, name=f"{self.name}-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def _next_work(self) -> Work | None:
        """Under the lock: the next group to start, or None when the stream holds as many as it may."""
        if self._active + len(self._done) >= self.capacity:
            return None
        if not self._todo:
            with self._rows_lock:
                rows = self.next_rows()
            g = self.group_size
            if len(rows) % g:
                raise ValueError(f"got {len(rows)} prompt rows, not a multiple of num_generations={g}")
            self._todo.extend(Work(rows[i:i + g]) for i in range(0, len(rows), g))
        work = self._todo.popleft()
        work.started, work.seq = time.monotonic(), self._seq
        self._seq += 1
        return work

    def _work(self) -> None:
        while True:
            with self._cond:
                try:
                    while not self._closed and (work := self._next_work()) is None:
                        self._cond.wait()
                except Exception as exc:  # noqa: BLE001 - the prompt sampler's: handed to the caller of take()
                    self._done.append((Work([]), Failed([], exc)))
                    self._cond.notify_all()
                    return
                if self._closed:
                    return
                epoch = self._epoch
                if self._active == 0 and self._idle_since is not None:
                    self._stats.idle_s += time.monotonic() - self._idle_since
                    self._idle_since = None
                self._active += 1
            try:
                out = self.make_group(work)
            except GateClosed:
                out = None
            except BaseException as exc:  # noqa: BLE001 - handed to the caller of take()
                out = Failed(work.rows, exc)
            with self._cond:
                self._active -= 1
                if self._active == 0:
                    self._idle_since = time.monotonic()
                if epoch != self._epoch:  # reset meanwhile: started again
                    self._todo.appendleft(Work(work.rows))
                elif out is not None and not self._closed:
                    self._done.append((work, out))
                self._cond.notify_all()
            if out is None:
                return

    # ---- the trainer's side -------------------------------------------------------------------
    def take(self, n: int, accept: Callable[[Any], bool]) -> tuple[list[Any], StreamStats]:
        """The first `n` groups to finish that `accept` keeps (a `Failed` is returned at once, alone, with the
        groups taken before it given back); what happened since the last take that returned groups."""
        self.start()
        out: list[tuple[Work, Any]] = []
        with self._cond:
            while len(out) < n:
                while not self._done:
                    self._cond.wait()
                work, group = self._done.popleft()
                if isinstance(group, Failed):
                    self._done.extendleft(reversed(out))
                    self._cond.notify_all()
                    return [group], StreamStats()  # what happened so far goes with the next batch
                if accept(group):
                    out.append((work, group))
                    self._stats.group_s.append(time.monotonic() - work.started)
                elif work.regenerations < self.regenerations:
                    self._todo.appendleft(Work(work.rows, work.regenerations + 1))
                    self._stats.regenerated += 1
                else:
                    self._stats.dropped += 1
                self._cond.notify_all()  # room for another group
            return [g for _, g in out], self._stats_since()

    def _stats_since(self) -> StreamStats:
        stats, self._stats = self._stats, StreamStats()
        if self._active == 0 and self._idle_since is not None:  # idle now: count it up to here
            now = time.monotonic()
            stats.idle_s += now - self._idle_since
            self._idle_since = now
        return stats

    def reset(self) -> None:
        """Forget every group finished or under way (a lost server may have sampled them); workers go on with new
        ones. Their input rows are started again."""
        with self._cond:
            rows = [w for w, g in self._done]
            self._done.clear()
            self._epoch += 1
            self._todo.extendleft(Work(w.rows) for w in reversed(rows))
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
