"""Who reads the trained weights during a sync, and how, when the trainer runs on several ranks.

- `OneCopy` — one process, DDP, DeepSpeed ZeRO-1/2: rank 0 holds every weight. Rank 0 pushes and probes alone;
  the other ranks wait for the served model name (sync/session.py).
- `LeadFollow` — DeepSpeed ZeRO-3 and FSDP2: each rank holds a shard of every weight, so whatever touches the weights is
  collective: gathering them for the push, the probe's forward pass (a forward on rank 0 alone would wait forever
  for the other ranks' shards). Rank 0 LEADS: the sync code is the one that runs with one copy; each collective
  step it takes (`gathered`, `logprobs`) is first announced by a broadcast. The other ranks FOLLOW: they join each
  announced step with the same arguments until rank 0 says the sync is done (or failed: they stop with its error).

The gathers are the hosts' own:
- ZeRO-3: `deepspeed.zero.GatheredParameters` — in place: each rank holds the full tensors of the gathered
  parameters while rank 0 writes them out (a LoRA push gathers the adapter only; restart gathers every weight, the
  full model on each rank for the length of the write); the push reads them from the model as with one copy.
- FSDP2: torch's `get_model_state_dict(full_state_dict=True, cpu_offload=True)` — the full state dict, on rank 0
  only and in CPU memory (the other ranks send their shards and keep nothing); the push reads it (`tensors=`)
  instead of the model's sharded DTensors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from accelerate.utils import broadcast_object_list

from grpo_plugin.sync import probe

READS = ("trainable", "all")  # which parameters a mode's push reads: the adapter (lora_sync) or every weight


def selected(model, reads: str) -> list:
    """The parameters a push reads, in the model's order (the same list on every rank)."""
    if reads not in READS:
        raise ValueError(f"reads must be one of {READS}, not {reads!r}")
    return [p for p in model.parameters() if reads == "all" or p.requires_grad]


def _held(p) -> int:
    """Elements of `p` this rank holds between pushes: DeepSpeed keeps its partition in `ds_tensor`, a DTensor
    (FSDP2) its local shard."""
    if hasattr(p, "ds_tensor"):
        return p.ds_tensor.numel()
    if hasattr(p, "to_local"):
        return p.to_local().numel()
    return p.numel()


def describe_gather(params: list) -> str:
    """Inside a gather: how many elements were gathered, and how many of them this rank holds between pushes."""
    full = sum(p.numel() for p in params)  # a gathered ZeRO-3 parameter, or a DTensor (its global shape)
    held = sum(_held(p) for p in params)
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
        yield None  # the push reads the model itself

    def logprobs(self, model, token_ids) -> list[float]:
        return probe.token_logprobs(model, token_ids)


@contextlib.contextmanager
def zero3_gather(model, reads: str) -> Iterator[None]:
    """In place: inside, every rank's selected parameters hold their full tensors (the push reads the model)."""
    import deepspeed  # here: only a ZeRO-3 run needs it (it also starts its accelerator probe when imported)

    with deepspeed.zero.GatheredParameters(selected(model, reads), modifier_rank=None):
        yield None


@contextlib.contextmanager
def fsdp2_gather(model, reads: str) -> Iterator[dict]:
    """The full state dict on rank 0 (CPU memory), {} on the others; `reads` makes no difference to the gather
    (torch gathers the whole state dict; a LoRA push then picks the adapter out of it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict  # FSDP2 runs only

    yield get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _broadcast(obj):
    return broadcast_object_list([obj], from_process=0)[0]


class FollowerStopped(RuntimeError):
    """Rank 0 announced that its sync failed; this rank stops too (rank 0 raises the error itself)."""


class LeadFollow:
    """ZeRO-3: rank 0 leads every collective step of a sync, the other ranks follow (module docstring)."""

    sharded = True

    def __init__(self, gather: Callable = zero3_gather, broadcast: Callable = _broadcast, name: str = "ZeRO-3"):
        """`gather(model, reads)`: a context manager, entered on every rank, yielding what the push reads instead
        of the model (None: the model itself holds the gathered weights)."""
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
    def gathered(self, model, reads: str) -> Iterator[dict | None]:
        self.broadcast(("gather", reads))
        with self.gather(model, reads) as tensors:
            if reads not in self._told:
                self._told.add(reads)
                print(f"[grpo_plugin] {self.name}: each push gathers {describe_gather(selected(model, reads))}",
                      flush=True)
            yield tensors

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
                with self.gather(model, arg):
                    pass  # rank 0 writes the gathered tensors; this rank's copy is released at once
            elif what == "logprobs":
                probe.token_logprobs(model, arg)
            else:
                raise RuntimeError(f"rank 0 announced an unknown sync step {what!r}")
            joined += 1


def for_accelerator(accelerator) -> OneCopy | LeadFollow:
    """LeadFollow under DeepSpeed ZeRO-3 or FSDP2 (one rank too: its parameters are partitioned all the same),
    else OneCopy."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is not None and int(plugin.zero_stage or 0) == 3:
        return LeadFollow()
    if getattr(accelerator, "is_fsdp2", False):
        return LeadFollow(gather=fsdp2_gather, name="FSDP2")
    return OneCopy()
