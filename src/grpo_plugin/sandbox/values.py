"""Values a sandboxed program's process sent back (typed JSON, child.py's `_make_plain`), decoded as untrusted
input: a malformed, too deep or unknown value is a ValueError, never a crash of the trainer or a pass."""

from __future__ import annotations

import json

from grpo_plugin.sandbox.child import Opaque  # the children's own (standard library only)

MAX_DEPTH = 200
__all__ = ["Opaque", "decode"]
_TYPES = {t.__name__: t for t in (int, float, complex, str, bytes, bool, list, tuple, dict, set, frozenset,
                                  type(None), bytearray, range, object, type)}


def decode(text: str):
    """The value in `text`; ValueError when it is not one the sandbox sends."""
    try:
        return _dec(json.loads(text), 0)
    except (ValueError, TypeError, KeyError, RecursionError, OverflowError) as exc:
        raise ValueError(f"an invalid value from the program's process ({type(exc).__name__})") from None


def _dec(x, depth: int):
    if depth > MAX_DEPTH:
        raise ValueError("nested too deep")
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, list):
        return [_dec(e, depth + 1) for e in x]
    if not isinstance(x, dict) or len(x) != 1:
        raise ValueError("not a tagged value")
    (tag, v), = x.items()
    if tag == "i":
        return int(v, 16)  # hex: no digit limit for big results, as decimal strings would have
    if tag == "f":
        return float(v)
    if tag == "c":
        return complex(float(v[0]), float(v[1]))
    if tag == "b":
        return bytes.fromhex(v)
    if tag == "ba":
        return bytearray.fromhex(v)
    if tag in ("t", "s", "fs"):
        items = [_dec(e, depth + 1) for e in v]
        return {"t": tuple, "s": set, "fs": frozenset}[tag](items)
    if tag == "d":
        return {_dec(k, depth + 1): _dec(val, depth + 1) for k, val in v}
    if tag == "r":
        return range(*(int(a) for a in v))
    if tag == "y":
        return _TYPES[v]
    if tag == "o":
        return Opaque(v)
    raise ValueError(f"unknown tag {tag!r}")
