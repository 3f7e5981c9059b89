"""Fetched Atropos batches on disk until a checkpoint covers the steps that trained them.

The run-api hands a batch out once (`/batch` pops it; it keeps no copy and takes no acknowledgement). So every
batch is written here as soon as it is fetched, BEFORE it is queued for training:

    <spool>/pending/<seq>.batch               fetched, not trained yet
    <spool>/consumed/<step>-<seq>.batch       trained from optimizer step <step> (0-based global step) on

A checkpoint at global step k covers the batches consumed at steps < k (each trains `span` steps: usually 1);
their files are deleted then. A run resumed from checkpoint k replays, in order, the batches consumed at steps
>= k (their updates were lost with the process), then the pending ones (fetched, never trained), and only then
asks the run-api for more: nothing fetched is lost or trained twice relative to the checkpoint.

A file is one metadata line (JSON) followed by the run-api's `/batch` reply exactly as received (bytes), so
writing costs no re-encoding. Writes are atomic (temp file + rename).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

_PENDING = re.compile(r"^(\d+)\.batch$")
_CONSUMED = re.compile(r"^(\d+)-(\d+)\.batch$")


class SpoolError(RuntimeError):
    """A spooled batch could not be read back."""


class Spool:
    def __init__(self, root: str | Path, span: int = 1):
        if span < 1:
            raise ValueError("span (optimizer steps per batch) must be >= 1")
        self.root = Path(root)
        self.span = span
        self.pending_dir = self.root / "pending"
        self.consumed_dir = self.root / "consumed"
        self.pending_dir.mkdir(parents=True, exist_ok=True)
        self.consumed_dir.mkdir(parents=True, exist_ok=True)
        seqs = [s for _, s in self._consumed()] + list(self._pending())
        self._next = max(seqs, default=-1) + 1

    # ---- listing --------------------------------------------------------------------------------
    def _pending(self) -> dict[int, Path]:
        out = {}
        for p in self.pending_dir.iterdir():
            m = _PENDING.match(p.name)
            if m:
                out[int(m.group(1))] = p
        return dict(sorted(out.items()))

    def _consumed(self) -> list[tuple[int, int]]:
        out = []
        for p in self.consumed_dir.iterdir():
            m = _CONSUMED.match(p.name)
            if m:
                out.append((int(m.group(1)), int(m.group(2))))
        return sorted(out)

    def counts(self) -> tuple[int, int]:
        """(pending, consumed) batches on disk."""
        return len(self._pending()), len(self._consumed())

    # ---- writing --------------------------------------------------------------------------------
    def add(self, meta: dict, raw_reply: bytes) -> int:
        """Store one fetched batch; returns its sequence number."""
        seq = self._next
        self._next += 1
        head = json.dumps(dict(meta, seq=seq), separators=(",", ":")).encode()
        path = self.pending_dir / f"{seq:09d}.batch"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            fh.write(head + b"\n" + raw_reply)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        return seq

    def mark_consumed(self, seq: int, step: int) -> None:
        src = self.pending_dir / f"{seq:09d}.batch"
        os.replace(src, self.consumed_dir / f"{step:09d}-{seq:09d}.batch")

    def discard(self, seq: int) -> None:
        """A pending batch with nothing trainable in it (every group rejected)."""
        (self.pending_dir / f"{seq:09d}.batch").unlink(missing_ok=True)

    def release(self, checkpoint_step: int) -> int:
        """A checkpoint at `checkpoint_step` was saved: drop the batches it covers. Returns how many."""
        n = 0
        for step, seq in self._consumed():
            if step + self.span <= checkpoint_step:
                (self.consumed_dir / f"{step:09d}-{seq:09d}.batch").unlink(missing_ok=True)
                n += 1
        return n

    def clear(self) -> int:
        """Forget everything (a fresh run). Returns how many batches were dropped."""
        n = sum(self.counts())
        shutil.rmtree(self.root, ignore_errors=True)
        self.pending_dir.mkdir(parents=True, exist_ok=True)
        self.consumed_dir.mkdir(parents=True, exist_ok=True)
        self._next = 0
        return n

    # ---- reading --------------------------------------------------------------------------------
    def resume(self, step: int) -> list[int]:
        """Resuming at global step `step` (the checkpoint's): drop what the checkpoint covers, put the batches
        consumed at later steps back in front of the pending ones. Returns the sequence numbers to train next,
        in order."""
        self.release(step)
        replay = []
        for cstep, seq in self._consumed():  # trained after the checkpoint: their updates were lost
            os.replace(self.consumed_dir / f"{cstep:09d}-{seq:09d}.batch", self.pending_dir / f"{seq:09d}.batch")
            replay.append(seq)
        rest = [s for s in self._pending() if s not in set(replay)]
        return replay + rest

    def load(self, seq: int) -> tuple[dict, bytes]:
        """(metadata, the run-api's reply bytes) of a pending batch."""
        path = self.pending_dir / f"{seq:09d}.batch"
        try:
            data = path.read_bytes()
            head, _, body = data.partition(b"\n")
            meta = json.loads(head)
        except (OSError, ValueError) as exc:
            raise SpoolError(f"spooled batch {path} cannot be read back: {exc}. Move it away to skip it.") from exc
        if not body:
            raise SpoolError(f"spooled batch {path} holds no reply. Move it away to skip it.")
        return meta, body

    def path(self, seq: int) -> Path:
        return self.pending_dir / f"{seq:09d}.batch"
