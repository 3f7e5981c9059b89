"""Which policy version produced a sequence: the server records it, the trainer looks it up.

Atropos environments generate on our server and post finished groups to the run-api, which serves them LIFO
and may hand the trainer a batch several optimizer steps old. Nothing in an Atropos group says which weights
produced it, so the server keeps a bounded ledger: for every completion `/generate` returns, the fingerprint
of its full token sequence (prompt + completion, exactly what Atropos's ManagedServer puts in `tokens`) maps to
the policy version the server held when the request was admitted. The trainer announces each version
(`POST /grpo/policy`) inside the sync fence, so no request straddles two announcements.

Pure Python, no vLLM import: used inside the server process and by the trainer.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence


def fingerprint(token_ids: Sequence[int]) -> str:
    """A short stable digest of a token sequence (the same on both sides)."""
    return hashlib.blake2b(array("q", token_ids).tobytes(), digest_size=12).hexdigest()


class Ledger:
    """fingerprint → policy version, the oldest entries dropped past `capacity`."""

    def __init__(self, capacity: int = 200_000):
        if capacity < 1:
            raise ValueError("ledger capacity must be >= 1")
        self.capacity = capacity
        self._entries: OrderedDict[str, int] = OrderedDict()

    def record(self, sequences: Iterable[Sequence[int]], version: int) -> None:
        for seq in sequences:
            key = fingerprint(seq)
            self._entries[key] = version
            self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def lookup(self, fingerprints: Iterable[str]) -> list[int | None]:
        return [self._entries.get(fp) for fp in fingerprints]

    def __len__(self) -> int:
        return len(self._entries)
