"""Several trainer ranks recover a lost vLLM server together: where they agree that an outage happened.

Each rank talks to the server on its own (its own rollouts), so a kill or a hang can be seen by one rank and not
by the other (rank 0's rollout ended before the kill, rank 1's was still running). A recovery, though, is done by
all ranks together: global rank 0 alone restarts a managed server, and the restore's push is collective under
ZeRO-3 / FSDP2 (every rank joins the gather and the probe's forward pass). A rank that recovered while its peer
went on into a collective would deadlock both. So the ranks never decide alone: at fixed points that every rank
reaches in the same order, each hands in what it saw (None: nothing wrong; else why the server counts as lost)
and receives every rank's answer. If any rank lost the server, every rank joins the recovery:

- the end of each rollout (a rank's rollout call, or its prefetched rollout being taken);
- the end of each weight push (rank 0 pushes; the other ranks follow);
- inside a recovery: after rank 0's restart (is the server back?) and after the restore (were the weights put back
  and verified?), so that a failure there stops every rank, each with the reason.

The exchange runs on a gloo process group of its own, over the trainer's ranks (CPU objects, whatever backend
trains: NCCL on GPUs), with a timeout: a rank whose peer died or hangs elsewhere does not wait forever; it stops
with `RanksApart`, naming the point it waited at and for how long.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta


class RanksApart(RuntimeError):
    """A rank did not reach an agreement point in time (it died, or hangs elsewhere)."""


class RankAgreement:
    def __init__(self, rank: int, world_size: int, timeout_s: float,
                 all_gather: Callable[[list, object], None] | None = None):
        """`all_gather(out, obj)`: torch.distributed.all_gather_object on the agreement's group (`over_trainer`
        builds one)."""
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self._all_gather = all_gather

    @classmethod
    def over_trainer(cls, timeout_s: float) -> RankAgreement:
        """Every trainer rank calls this at the same point (it creates a process group: a collective). torch.
        distributed is up (accelerate started it)."""
        import torch.distributed as dist  # here: only a run with several ranks builds one

        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))

        def all_gather(out: list, obj) -> None:
            dist.all_gather_object(out, obj, group=group)

        return cls(dist.get_rank(), dist.get_world_size(), timeout_s, all_gather)

    def exchange(self, mine, at: str) -> list:
        """Every rank's `mine`, in rank order; every rank must call this at the same point `at`."""
        out = [None] * self.world_size
        try:
            self._all_gather(out, mine)
        except RuntimeError as exc:  # gloo: a peer that does not come in time, or whose connection closed
            raise RanksApart(
                f"trainer rank {self.rank} waited up to {self.timeout_s:g} s for the other trainer ranks to agree "
                f"on the vLLM server at {at}, and they did not come (a rank died or hangs elsewhere; its own "
                f"output says why): {' '.join(str(exc).split())[:300]}") from exc
        return out

    def any(self, why: str | None, at: str) -> str | None:
        """Hand in why this rank lost the server, or its error in a step of the recovery (None: nothing wrong).
        Returns what went wrong, naming each rank it went wrong on, or None when nothing did on any rank. Every
        rank gets the same answer."""
        said = [(r, w) for r, w in enumerate(self.exchange(why, at)) if w]
        return "; ".join(f"trainer rank {r}: {w}" for r, w in said) if said else None


def agreement_timeout(hang_timeout_s: float, request_timeout_s: float, server_timeout_s: float) -> float:
    """How long a rank waits at an agreement point for the others: a peer may still be in its rollout (one request,
    up to request_timeout), noticing a hang (hang_timeout) or, inside a recovery, restarting the server
    (server_timeout); a minute more for everything else."""
    return max(request_timeout_s, server_timeout_s) + hang_timeout_s + 60.0
