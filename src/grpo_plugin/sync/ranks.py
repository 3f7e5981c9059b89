"""Who reads the trained weights during a sync, and how, when the trainer runs on several ranks.

- `OneCopy` — one process, DDP, DeepSpeed ZeRO-1/2: rank 0 holds every weight. Rank 0 pushes and probes alone;
  the other ranks wait for the served model name (trainer.py).
- `LeadFollow` — DeepSpeed ZeRO-3: each rank holds a shard of every weight, so whatever touches the weights is
  collective: gathering them for the push, the probe's forward pass (a forward on rank 0 alone would wait forever
  for the other ranks' shards). Rank 0 LEADS: the sync code is the one that runs with one copy; each collective
  step it takes (`gathered`, `logprobs`) is first announced by a broadcast. The other ranks FOLLOW: they join each
  announced step with the same arguments until rank 0 says the sync is done (or failed: they stop with its error).

The gather is DeepSpeed's own (`deepspeed.zero.GatheredParameters`): each rank holds the full tensors of the
gathered parameters while rank 0 writes them out (a LoRA push gathers the adapter only; restart gathers every
weight, the full model on each rank for the length of the write).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from grpo_plugin import probe

READS = ("trainable", "all")  # which parameters a mode's push reads: the adapter (lora_sync) or every weight


def selected(model, reads: str) -> list:
    """The parameters a push reads, in the model's order (the same list on every rank)."""
    if reads not in READS:
        raise ValueError(f"reads must be one of {READS}, not {reads!r}")
    return [p for p in model.parameters() if reads == "all" or p.requires_grad]


def describe_gather(params: list) -> str:
    """Inside a gather: how many elements were gathered, and how many of them this rank holds between pushes
    (DeepSpeed keeps a rank's partition in `ds_tensor`)."""
    full = sum(p.numel() for p in params)
    held = sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel() for p in params)
    return f"{len(params)} tensors, {full:,} elements (rank 0 holds {held:,} of them between pushes)"


class OneCopy:
    """Rank 0 holds every weight: nothing to gather, nobody to tell."""

    sharded = False

    @contextlib.contextmanager
    def leading(self) -> Iterator[None]:
        yield

    def follow(self, model) -> None:
        return None

    @contextlib.contextmanager
    def gathered(self, model, reads: str) -> Iterator[None]:
        yield

    def logprobs(self, model, token_ids) -> list[float]:
        return probe.token_logprobs(model, token_ids)


def zero3_gather(params: list):
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)


def _broadcast(obj):
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([obj], from_process=0)[0]


class FollowerStopped(RuntimeError):
    """Rank 0 announced that its sync failed; this rank stops too (rank 0 raises the error itself)."""


class LeadFollow:
    """ZeRO-3: rank 0 leads every collective step of a sync, the other ranks follow (module docstring)."""

    sharded = True

    def __init__(self, gather: Callable = zero3_gather, broadcast: Callable = _broadcast, name: str = "ZeRO-3"):
        self.gather, self.broadcast, self.name = gather, broadcast, name
        self._told: set[str] = set()

    # ---- rank 0 --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def leading(self) -> Iterator[None]:
        """Around rank 0's whole sync: the followers are released when it ends, or told it failed."""
        try:
            yield
        except BaseException as exc:
            self.broadcast(("failed", f"{type(exc).__name__}: {exc}"))
            raise
        self.broadcast(("done", None))

    @contextlib.contextmanager
    def gathered(self, model, reads: str) -> Iterator[None]:
        params = selected(model, reads)
        self.broadcast(("gather", reads))
        with self.gather(params):
            if reads not in self._told:
                self._told.add(reads)
                print(f"[grpo_plugin] {self.name}: each push gathers {describe_gather(params)}", flush=True)
            yield

    def logprobs(self, model, token_ids) -> list[float]:
        self.broadcast(("logprobs", list(token_ids)))
        return probe.token_logprobs(model, token_ids)

    # ---- the other ranks -----------------------------------------------------------------------
    def follow(self, model) -> int:
        """Join rank 0's collective steps until its sync ends; the number of steps joined."""
        joined = 0
        while True:
            what, arg = self.broadcast(None)
            if what == "done":
                return joined
            if what == "failed":
                raise FollowerStopped(f"rank 0's weight sync failed ({arg}); this rank stops with it")
            if what == "gather":
                with self.gather(selected(model, arg)):
                    pass  # rank 0 writes the gathered tensors; this rank's copy is released at once
            elif what == "logprobs":
                probe.token_logprobs(model, arg)
            else:
                raise RuntimeError(f"rank 0 announced an unknown sync step {what!r}")
            joined += 1


def for_accelerator(accelerator) -> OneCopy | LeadFollow:
    """LeadFollow under DeepSpeed ZeRO-3 (one rank too: its parameters are partitioned all the same), else
    OneCopy."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is not None and int(plugin.zero_stage or 0) == 3:
        return LeadFollow()
    return OneCopy()
