"""`grpo.delta_anchor_every`: restart (reload) pushes that send only the elements of the served weights whose bits
changed since the version the server holds.

A push is a full one (an anchor) when no base is held (the run's first push, after a server was restarted or
replaced: `server_restarted`), every `delta_anchor_every` pushes, and when the served weights are not bf16/fp16
(fp32: nearly every value changes at every step, so deltas are switched off for the run and no copy is kept). An
anchor is written and reloaded like any full push; the server also keeps it as its base (in_vllm/delta_base.py),
under a digest drawn for it (delta/chain.py), and the trainer keeps its own copy of the served tensors on CPU
(one copy of the model in the served dtype). Between anchors a push encodes what changed (delta/codec.py), writes
it as one small file into a directory of its own (a network transport sends just that file: server/files.py), and
asks every worker to apply it (`grpo_apply_delta`). A worker that does not hold the base the delta is for refuses
it whole; the push then falls back to an anchor, logged. Either way the server ends up serving weights
bit-identical to a full push, and the session's probe verifies them like every push.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from grpo_plugin.config.storage import SyncDir
from grpo_plugin.delta import chain, codec, wire
from grpo_plugin.server.group import replicas_of

LOG = logging.getLogger("grpo_plugin")
DELTA_METHOD = "grpo_apply_delta"
DEFAULT_EVERY = 10  # where it pays: a server sent its files over the network


def anchor_every(setting: int | None, transports: list[str]) -> int:
    """The anchor interval a run uses: the setting, or (None) DEFAULT_EVERY when any server is sent its files over
    the network (a delta saves the link most of a push), 0 (off) when every server reads the sync directory (the
    full file is not sent anywhere; a delta saves little there and costs a copy of the model on both sides)."""
    if setting is not None:
        return setting
    return DEFAULT_EVERY if "network" in transports else 0


def delta_pushes(reload, client, setting: int | None, sync_dir: str | None) -> DeltaPushes | None:
    """The delta pushes of a run, or None when they are off (every push a full one)."""
    every = anchor_every(setting, [c.files.kind for c in replicas_of(client)])
    return DeltaPushes(reload, every, sync_dir) if every > 0 else None


class DeltaPushes:
    """Anchors and deltas for an in-place reload strategy (`reload`: sync/restart.py's InPlaceReload)."""

    def __init__(self, reload, every: int, sync_dir: str | None = None):
        self.reload, self.every = reload, every
        self.storage = SyncDir("delta", sync_dir)  # its own directory: a network push sends only the delta
        self.base: dict | None = None  # the served tensors the server holds, on CPU
        self.digest: str | None = None  # their digest (delta/chain.py)
        self.since_anchor = 0
        self.off: str | None = None  # why deltas are off for this run (the served dtype)

    def push(self, named: dict, write: Callable[[dict], str]) -> dict:
        """Push the checkpoint-named tensors `named`: a delta where one applies, else a full push (`write` writes
        them, returning the directory). The report says which, and the bytes of a delta."""
        why = self._why_full(named)
        if why is None:
            report = self._delta(named)
            if "refused" not in report:
                return report
            why = f"the server refused the delta ({report['refused']})"
            LOG.warning("grpo_plugin: %s; full push instead", why)
        return self._anchor(named, write, why)

    def _why_full(self, named: dict) -> str | None:
        if self.off is None:
            self.off = codec.deltable(named) or ""
            if self.off:
                LOG.warning("grpo_plugin: grpo.delta_anchor_every: delta pushes off for this run: %s", self.off)
        if self.off:
            return self.off
        if self.digest is None:
            return "no base held (the run's first push, or the server was restarted)"
        if self.since_anchor + 1 >= self.every:
            return f"an anchor every {self.every} pushes"
        return None

    def _anchor(self, named: dict, write: Callable[[dict], str], why: str) -> dict:
        self.base, self.digest = None, None  # whatever happens, the server will not hold the old base
        t0 = time.perf_counter()
        path = write(named)
        t1 = time.perf_counter()
        digest = None if self.off else chain.anchor_digest(chain.new_anchor_id())
        report = self.reload.apply(path, delta_base=digest) if digest else self.reload.apply(path)
        if digest:
            self.base = {n: t.detach().to("cpu", copy=True) for n, t in named.items()}
            self.digest, self.since_anchor = digest, 0
        LOG.info("grpo_plugin: full push (anchor): %s", why)
        return {"push": "full", "why": why, "write_ms": (t1 - t0) * 1e3, **report}

    def _delta(self, named: dict) -> dict:
        t0 = time.perf_counter()
        try:
            delta = codec.encode(self.base, {n: t.detach().to("cpu") for n, t in named.items()})
        except codec.DeltaMismatch as exc:  # the trainer's tensors changed shape or names: a full push
            return {"refused": f"not comparable with the base: {exc}"}
        t1 = time.perf_counter()
        sha = wire.write(self.storage.path / wire.FILE_NAME, delta, self.digest)
        digest = chain.next_digest(self.digest, sha)
        t2 = time.perf_counter()
        results = self.reload.call(DELTA_METHOD, {"delta_path": str(self.storage.path)},
                                   {"base": self.digest, "digest": digest})
        refused = [r["refused"] for r in results if r.get("refused")]
        if refused:
            return {"refused": refused[0]}
        report = self.reload.report(results)
        codec.apply(self.base, delta, inplace=True)  # the trainer's copy: the version the server now holds
        self.digest = digest
        self.since_anchor += 1
        return {"push": "delta", "delta_bytes": delta.nbytes(), "changed_tensors": len(delta.tensors),
                "encode_ms": (t1 - t0) * 1e3, "write_ms": (t2 - t1) * 1e3, **report}

    def server_restarted(self) -> None:
        self.base, self.digest = None, None

    def close(self) -> None:
        self.base = None
        self.storage.close()


__all__ = ["DEFAULT_EVERY", "DELTA_METHOD", "DeltaPushes", "anchor_every", "delta_pushes"]
