"""A delta as one safetensors file: each part of each tensor's entry is a tensor named `<tensor>::<part>`; the
metadata names the format, the base digest it applies to (delta/chain.py) and each tensor's encoding. The file's
sha256 moves the digest chain on; a reader gets it from the bytes it read, never from the writer."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

from safetensors.torch import load, save

from grpo_plugin.delta.codec import Delta, DeltaMismatch, TensorDelta

FORMAT = "grpo_plugin-delta-1"
FILE_NAME = "delta.safetensors"  # a push's delta, alone in its directory (sync/delta_push.py)
SEP = "::"


def write(path: Path, delta: Delta, base_digest: str) -> str:
    """Write `delta` to `path` (any old file replaced); returns the file's sha256 (hex)."""
    tensors = {f"{name}{SEP}{part}": t.contiguous() for name, entry in delta.tensors.items()
               for part, t in entry.parts.items()}
    meta = {"format": FORMAT, "base": base_digest,
            "encodings": json.dumps({name: e.encoding for name, e in delta.tensors.items()})}
    data = save(tensors, metadata=meta)  # a delta is small: hashed from the bytes written, not read back
    path.unlink(missing_ok=True)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def read(path: Path) -> tuple[Delta, str, str]:
    """(the delta, the base digest it names, the sha256 of the bytes read). DeltaMismatch: not a delta file."""
    data = Path(path).read_bytes()
    try:
        (size,) = struct.unpack("<Q", data[:8])
        meta = json.loads(data[8:8 + size]).get("__metadata__") or {}
        tensors = load(data)
    except Exception as exc:  # noqa: BLE001 - whatever is wrong with it, it is not a delta
        raise DeltaMismatch(f"{path}: not a safetensors file ({type(exc).__name__}: {exc})") from exc
    if meta.get("format") != FORMAT:
        raise DeltaMismatch(f"{path}: format {meta.get('format')!r}, expected {FORMAT}")
    encodings = json.loads(meta["encodings"])
    parts: dict[str, dict] = {name: {} for name in encodings}
    for key, t in tensors.items():
        name, _, part = key.rpartition(SEP)
        if name not in parts:
            raise DeltaMismatch(f"{path}: part {key!r} of no listed tensor")
        parts[name][part] = t
    delta = Delta({name: TensorDelta(enc, parts[name]) for name, enc in encodings.items()})
    return delta, str(meta["base"]), hashlib.sha256(data).hexdigest()


__all__ = ["FILE_NAME", "FORMAT", "read", "write"]
