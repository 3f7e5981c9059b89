"""A run survives its vLLM server: every call the trainer makes to it goes through `ServerGuard.run`.

When a call fails and the server is found gone (its process exited, /health does not answer, or it hung past
`grpo.server_hang_timeout` while a request was in flight), the guard brings a server back and asks the trainer to
put its CURRENT weights on it (`restore`: the mode's push + the probe), then redoes the call:

- managed server (`grpo.managed_server: true`): our own process tree is stopped (a hung one too: SIGCONT +
  SIGTERM, then SIGKILL) and started again, at most `grpo.server_restarts` times in `grpo.server_restart_window`
  seconds;
- unmanaged server (`axolotl vllm-serve` elsewhere): the guard waits, with a rate-limited message naming the URL
  and the command, up to `grpo.server_timeout` for someone to bring it back.

With several servers (server/group.py) only the lost ones are restarted (and, for ipc, the servers that map a
restarted server's weight file); the others keep serving. The restore then pushes to every server and the probe
verifies every one.

With several trainer ranks (`agreement`, server/rank_agreement.py) no rank decides alone: every rank reports at
the end of each rollout and of each push whether it lost the server; if any did, all recover together — global
rank 0 restarts the managed server, the others wait for it and its /health, every rank joins the restore, and each
rank redoes what it lost (its rollout; the push is the restore itself).

A call that failed on the link while the server still answers /health (server/link_faults.py) is recovered the
same way with nothing to bring back: the weights pushed again in full and verified, the call redone; at most
`LINK_TRIES` such faults in a row.

When that is impossible it raises `ServerUnrecoverable`; the trainer then saves a checkpoint (trainer.py).
Every outage is recorded (`outages`) for the metrics.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from grpo_plugin.server import managed
from grpo_plugin.server.client import ServerError, ServerLost
from grpo_plugin.server.group import replicas_of
from grpo_plugin.server.link_faults import LinkFaults, is_link_fault
from grpo_plugin.server.process import Progress, ServerStartError, wait_until
from grpo_plugin.server.rank_agreement import RankAgreement, RanksApart

LOG = logging.getLogger("grpo_plugin")


class ServerUnrecoverable(RuntimeError):
    """The server was lost and could not be brought back within the configured bounds."""


@dataclass
class Outage:
    step: int
    during: str  # what failed: "rollout", "weight push", ...
    cause: str
    restarted: bool = False  # the guard restarted the (managed) server itself
    servers: list[str] = field(default_factory=list)  # the URL of each server that was lost
    down_s: float = 0.0  # from the failure to weights restored and verified
    redone: list[str] = field(default_factory=list)  # what was done again: the weight push, the call


def _short(text: str, n: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


class RestartBudget:
    """At most `limit` restarts in any `window_s` seconds (pure bookkeeping; `now` injectable for tests)."""

    def __init__(self, limit: int, window_s: float, now: Callable[[], float] = time.monotonic):
        self.limit, self.window_s, self.now = limit, window_s, now
        self._times: deque[float] = deque()

    def _trim(self) -> None:
        t = self.now()
        while self._times and t - self._times[0] > self.window_s:
            self._times.popleft()

    def available(self) -> bool:
        self._trim()
        return len(self._times) < self.limit

    def spend(self) -> None:
        self._trim()
        self._times.append(self.now())


def _proc_exited(proc) -> str | None:
    """Why a managed server's process counts as gone (None: running, or not ours)."""
    if proc is not None and proc.proc is not None and proc.proc.poll() is not None:
        return f"the managed vLLM server (pid {proc.pid}) exited with code {proc.proc.returncode}"
    return None


class ServerGuard:
    def __init__(self, client, *, restore: Callable[[], Any], step: Callable[[], int],
                 servers: Callable[[], list] | None = None, max_restarts: int = 3, restart_window_s: float = 1800.0,
                 hang_timeout_s: float = 60.0, wait_timeout_s: float = 600.0, starts_itself: bool = False,
                 enabled: bool = True, agreement: RankAgreement | None = None):
        """`restore()` puts the trainer's current weights on a fresh server and verifies them (returns the sync
        result); `step()` the trainer's global step; `servers()` the managed servers, one per server `client`
        talks to, in its order (empty: unmanaged); `starts_itself`: the mode's push starts the servers
        (restart_strategy: process), the guard only stops them. `enabled=False`: calls pass through untouched
        (no watch, no recovery). `agreement`: several trainer ranks, which recover together (module docstring);
        set with `join_ranks` once the ranks are joined."""
        if servers is None:
            servers = managed.servers
        self.client, self.restore, self.step, self.servers = client, restore, step, servers
        self.budget = RestartBudget(max_restarts, restart_window_s)
        self.hang_timeout_s, self.wait_timeout_s, self.starts_itself = hang_timeout_s, wait_timeout_s, starts_itself
        self.enabled, self.agreement = enabled, agreement
        self._caller_agrees = False
        self.outages: list[Outage] = []
        self._reported = 0
        self._silent_since: dict[int, float] = {}  # per server (index): since when /health went unanswered
        self._recovering = False
        self.links = LinkFaults()
        if enabled:
            client.watch = self.lost_reason  # a hang is noticed while a request waits, not after its timeout

    # ---- detection ------------------------------------------------------------------------------
    def lost_reason(self) -> str | None:
        """Why the server counts as lost now, or None. Called while a request is in flight (client.watch):
        a process that exited is lost at once; a /health unanswered for `hang_timeout_s` is a hang. The silence
        is kept per server, so a server that misses one answer while busy is not taken for the hung one."""
        exited = self._exited()
        if exited:
            return exited
        silences = [s or 0.0 for s in self._silences()]
        worst = max(range(len(silences)), key=silences.__getitem__)
        if silences[worst] >= self.hang_timeout_s:
            who = f"{self._clients()[worst].base_url}: " if len(silences) > 1 else ""
            return (f"{who}no answer to /health for {silences[worst]:.0f} s "
                    f"(grpo.server_hang_timeout: {self.hang_timeout_s:g} s)")
        return None

    def _clients(self) -> list:
        return replicas_of(self.client)

    def _silences(self) -> list[float | None]:
        """Asks every server's /health (in parallel) and returns, per server, how long it has gone unanswered
        (None: it answered)."""
        several = len(self._clients()) > 1  # a ServerGroup: asks them all at once
        answers = self.client.each(lambda c: c.healthy()) if several else [self.client.healthy()]
        now = time.monotonic()
        for i, ok in enumerate(answers):
            if ok:
                self._silent_since.pop(i, None)
            else:
                self._silent_since.setdefault(i, now)
        return [None if ok else now - self._silent_since[i] for i, ok in enumerate(answers)]

    def serving(self) -> bool:
        """Every server's process runs and every server answers /health, now."""
        return self._exited() is None and self.client.healthy()

    def _lost_members(self, members: list) -> list[int]:
        """Which servers to bring back: those whose process exited and those silent past the hang deadline;
        failing that (a request failed and the group does not answer), those that miss /health twice a second
        apart. None of them (a hang that ended by itself): no server is restarted; the weights are pushed and
        verified again all the same."""
        silences = self._silences()
        lost = [i for i, (_, proc) in enumerate(members)
                if _proc_exited(proc) or (silences[i] or 0.0) >= self.hang_timeout_s]
        if lost:
            return lost
        failing = [i for i, s in enumerate(silences) if s is not None]
        if failing:
            time.sleep(1.0)
            again = self._silences()
            failing = [i for i in failing if again[i] is not None]
        return failing

    def is_lost(self, exc: BaseException) -> str | None:
        """After a failed call: why the server is lost, why the link failed (it answers /health, but the call did
        not get through: link_faults.py), or None when it is alive and answered (the error is a real one)."""
        if isinstance(exc, ServerLost):
            return str(exc)
        chain, e = [], exc
        while e is not None and len(chain) < 8:
            chain.append(e)
            e = e.__cause__ or e.__context__
        if not any(isinstance(x, ServerError) for x in chain):
            return None
        exited = self._exited()
        if exited:
            return f"{exited}: {exc}"
        if not self.client.healthy():
            return f"the server does not answer /health after: {exc}"
        return self.links.reason(exc, chain)

    def _members(self) -> list[tuple[Any, Any]]:
        """(client, managed process or None) per server."""
        clients = replicas_of(self.client)
        procs = list(self.servers() or [])
        return list(zip(clients, procs if len(procs) == len(clients) else [None] * len(clients)))

    def _exited(self) -> str | None:
        """A managed server's process has exited (None: all running, or no managed server)."""
        for _, proc in self._members():
            why = _proc_exited(proc)
            if why:
                return why
        return None

    # ---- the wrapper ----------------------------------------------------------------------------
    @property
    def leads(self) -> bool:
        """This process restarts managed servers: the only one, or global rank 0 of several."""
        return self.agreement is None or self.agreement.rank == 0

    def join_ranks(self, agreement: RankAgreement) -> None:
        """Several trainer ranks, joined: from now on they recover together."""
        self.agreement = agreement

    @contextlib.contextmanager
    def caller_agrees(self) -> Iterator[None]:
        """Several ranks: the calls made inside pass through (a failure is raised); the caller reports it at its
        own agreement point (producers/prefetch.py: one per rollout taken, whichever way it was made)."""
        before, self._caller_agrees = self._caller_agrees, self.agreement is not None
        try:
            yield
        finally:
            self._caller_agrees = before

    def attempt(self, call: Callable[[], Any]) -> tuple[Any, str | None]:
        """(`call()`, None), or (None, why the server counts as lost) when it failed on a lost server; any other
        error is raised."""
        try:
            return call(), None
        except Exception as exc:
            why = self.is_lost(exc)
            if why is None:
                raise
            return None, why

    def agree(self, during: str, why: str | None) -> str | None:
        """At the end of a rollout or a push: why the server was lost on any rank (None: on none). Several ranks:
        every rank must call it at the same point; one rank: `why` itself."""
        if self.agreement is None or not self.enabled:
            return why
        return self.agreement.any(why, f"the end of the {during} (step {self.step()})")

    def run(self, during: str, call: Callable[[], Any], *, redo: bool = True) -> Any:
        """`call()`, surviving a lost server. `redo=False`: the restore IS the call (a weight push): its result
        is returned instead of calling again. Off the main thread (axolotl's prefetch thread) the call is made
        as is: a restore reads the trainer's weights, which only the main thread may do (producers/prefetch.py
        recovers there). Several ranks: every rank calls it at the same point; a rank whose call ended before
        the outage keeps its result, the others redo theirs."""
        if (not self.enabled or self._caller_agrees
                or threading.current_thread() is not threading.main_thread()):
            return call()
        if self.agreement is not None:  # each round one agreement on every rank, until none lost the server
            result, why = self.attempt(call)
            while (lost := self.agree(during, why)) is not None:
                restored = self.recover(during, lost, redo=redo)
                if why is None:  # this rank's call ended before the outage (a peer's did not): kept
                    continue
                result, why = self.attempt(call) if redo else (restored, None)
            return result
        while True:
            try:
                result = call()
                self.links.passed()
                return result
            except Exception as exc:
                if self._recovering:
                    raise
                why = self.is_lost(exc)
                if why is None:
                    raise
                restored = self.recover(during, why, redo=redo)
                if not redo:
                    return restored

    def recover(self, during: str, why: str, *, redo: bool = True) -> Any:
        outage = Outage(step=self.step(), during=during, cause=_short(why))
        t0 = time.monotonic()
        if not is_link_fault(why):
            print(f"[grpo_plugin] step {outage.step}: the vLLM server was lost during the {during} "
                  f"({outage.cause}); recovering", file=sys.stderr, flush=True)
        elif (stop := self.links.meet(outage.step, during, outage.cause)) is not None:
            raise ServerUnrecoverable(stop)
        self._recovering = True
        try:
            error = None
            if self.leads:  # several ranks: global rank 0 brings the server back, the others wait for it
                try:
                    self._bring_back(outage)
                except ServerUnrecoverable as exc:
                    if self.agreement is None:
                        raise
                    error = str(exc)
            if self.agreement is not None:
                self._with_rank_0(outage, error)
            result = self.restore()  # several ranks: every rank joins it (sync/session.py)
        except (ServerUnrecoverable, RanksApart):
            raise
        except Exception as exc:
            raise ServerUnrecoverable(
                f"the {during} at step {outage.step} failed ({outage.cause}), and putting the trainer's weights "
                f"back on the vLLM server failed: {exc}") from exc
        finally:
            self._recovering = False
            self._silent_since.clear()
        if not redo:  # the restore was the call (a push): it got through
            self.links.passed()
        outage.down_s = round(time.monotonic() - t0, 3)
        outage.redone = ["weight push + probe"] + ([during] if redo else [])
        self.outages.append(outage)
        diff = getattr(result, "logprob_diff", None)
        print(f"[grpo_plugin] step {outage.step}: recovered in {outage.down_s:.1f} s; the trainer's current weights "
              f"are back on the server" + (f" (probe |Δlogp| {diff:.2g})" if diff is not None else "")
              + f"; redoing the {during}", file=sys.stderr, flush=True)
        return result

    def _bring_back(self, outage: Outage) -> None:
        members = self._members()
        lost = self._lost_members(members)
        outage.servers = [members[i][0].base_url for i in lost]
        if lost and members[0][1] is not None:
            self._restart(members, lost, outage)
        elif lost:
            self._wait_for_unmanaged([members[i][0] for i in lost], outage)

    def _with_rank_0(self, outage: Outage, error: str | None) -> None:
        """Several ranks: every rank learns whether rank 0 brought the server back (else each stops, saying why);
        the others then wait for its /health (up to grpo.server_timeout) before they join the restore — unless
        the restore's push starts it (restart_strategy: process)."""
        failed = self.agreement.any(error, f"the restart of the vLLM server (step {outage.step})")
        if failed:
            raise ServerUnrecoverable(failed)
        who = f"trainer rank {self.agreement.rank}"
        if not self.leads and not self.starts_itself and wait_until(
                self.client.healthy, self.wait_timeout_s, Progress(f"{who}: the restarted vLLM server", every=30.0),
                lambda t: "waiting for its /health", ready="it answers", poll=0.5) is None:
            raise ServerUnrecoverable(f"{who}: the vLLM server rank 0 restarted at step {outage.step} did not "
                                      f"answer /health within {self.wait_timeout_s:g} s (grpo.server_timeout)")

    def _restart(self, members: list, lost: list[int], outage: Outage) -> None:
        """Restart the lost managed servers, and every server that maps a restarted one's weights (ipc)."""
        first = members[lost[0]][1]
        if not self.budget.available():
            bound = ("grpo.server_restarts is 0: the trainer does not restart it" if self.budget.limit == 0 else
                     f"it was already restarted {self.budget.limit} time(s) in the last {self.budget.window_s:g} s "
                     "(grpo.server_restarts / grpo.server_restart_window)")
            raise ServerUnrecoverable(
                f"the managed vLLM server was lost during the {outage.during} at step {outage.step} "
                f"({outage.cause}), and {bound}. Last server output:\n{first.log_tail(20)}")
        self.budget.spend()
        outage.restarted = True
        chosen = set(lost)
        for i, (_, proc) in enumerate(members):  # in port order: a server comes after the one it maps
            if getattr(proc, "depends_on", None) in {members[j][1] for j in chosen}:
                chosen.add(i)
        todo = [members[i] for i in sorted(chosen)]
        for _, proc in todo:
            proc.stop(timeout=10.0)
        if self.starts_itself:  # the mode's push starts them on the current weights (restart_strategy: process)
            return
        try:
            for _, proc in todo:
                proc.restart()
            for client, proc in todo:
                proc.wait_healthy(self.wait_timeout_s, client.healthy,
                                  Progress(f"restarting the vLLM server on {client.base_url}"))
                print(f"[grpo_plugin] restarted managed vLLM server pid {proc.pid} on {client.base_url}",
                      file=sys.stderr, flush=True)
        except ServerStartError as exc:
            raise ServerUnrecoverable(f"the vLLM server was lost at step {outage.step} ({outage.cause}) and could "
                                      f"not be started again: {exc}") from exc

    def _wait_for_unmanaged(self, clients: list, outage: Outage) -> None:
        url = ", ".join(c.base_url for c in clients)
        waited = wait_until(
            lambda: all(c.healthy() for c in clients), self.wait_timeout_s,
            Progress(f"the vLLM server at {url} is gone", every=30.0),
            lambda t: (f"waiting for it to come back (restart it with `axolotl vllm-serve <config.yaml>`; "
                       f"{max(0.0, self.wait_timeout_s - t):.0f} s of grpo.server_timeout left)"),
            ready="it answers again", poll=1.0)
        if waited is None:
            raise ServerUnrecoverable(
                f"the vLLM server at {url} was lost during the {outage.during} at step {outage.step} "
                f"({outage.cause}) and did not come back within {self.wait_timeout_s:g} s (grpo.server_timeout). "
                "Start it with `axolotl vllm-serve <config.yaml>`, or let `axolotl train` manage it "
                "(`grpo.managed_server: true`).")

    # ---- metrics --------------------------------------------------------------------------------
    def new_outages(self) -> list[dict]:
        """The outages recorded since the last call (each reported once, on the step it happened)."""
        new, self._reported = self.outages[self._reported:], len(self.outages)
        return [asdict(o) for o in new]
