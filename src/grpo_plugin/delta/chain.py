"""Which version of the weights a delta applies to: a chain of digests, one per pushed version.

- an anchor (a full push) gets `anchor_digest(anchor_id)`, from a random id the trainer draws for that push;
- the delta from version k to k+1 moves it on: `digest_{k+1} = sha256(digest_k || sha256(delta file))`.

A server holds a base and its digest; it applies a delta only when the delta's base digest is the one it holds and
the delta file it read moves that digest to the one the trainer computed (never half: it refuses instead).

Why a random id for the anchor, not a hash of its bytes: the id names the push, and the push's content is already
bound to what the server loaded (the shared path is the trainer's own file; an upload is refused unless its sha256
matches), and every push is verified by the probe. Hashing the full weights would cost a pass over every byte on
both sides per anchor (seconds for a 7B model) and would catch nothing those do not: what the chain must catch is a
server holding ANOTHER base (restarted, new, given another run's or an older anchor, or a delta it never got),
and a fresh id per anchor is different each time even when the weights are the same.
"""

from __future__ import annotations

import hashlib
import secrets


def new_anchor_id() -> str:
    return secrets.token_hex(16)


def anchor_digest(anchor_id: str) -> str:
    """The digest of the version a full push with this id made the server hold."""
    return hashlib.sha256(b"grpo_plugin delta anchor\0" + anchor_id.encode()).hexdigest()


def next_digest(digest: str, delta_sha256: str) -> str:
    """The digest after applying, to the version `digest`, the delta file whose sha256 is `delta_sha256` (hex)."""
    return hashlib.sha256(bytes.fromhex(digest) + bytes.fromhex(delta_sha256)).hexdigest()


__all__ = ["anchor_digest", "new_anchor_id", "next_digest"]
