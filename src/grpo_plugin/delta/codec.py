"""The elements of the served weights whose BITS changed, encoded exactly, and the rebuild from base + delta.

Pure functions on named tensors (checkpoint naming, as `sync.restart.checkpoint_tensors` gives): no floating-point
arithmetic touches a value. Each tensor is compared and copied as the integers of its bits (bf16/fp16 as int16), so
NaN payloads, -0.0 and infinities survive bit for bit, and a value that changed only in its bits (a NaN for another
NaN, -0.0 for 0.0) counts as changed.

Per tensor the cheapest of three exact encodings is picked from the number of changed elements `k` of `n`, each
`w` bytes wide:

- `sparse`: the flat indices of the changed elements (int32, int64 past 2**31 elements) + their new bits:
  `k * (4 + w)` bytes;
- `bitmask`: one bit per element (packed, little-endian within a byte) + the new bits of the set ones:
  `n / 8 + k * w` bytes;
- `whole`: every element's bits: `n * w` bytes.

An unchanged tensor is left out of the delta.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_SHIFTS = torch.arange(8, dtype=torch.uint8)


class DeltaMismatch(ValueError):
    """A delta that does not fit the base it is applied to (names, sizes, dtypes or indices): nothing is applied."""


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as a flat integer tensor of the same width (a view when `t` is contiguous)."""
    width = t.element_size()
    if width not in _INT_OF_WIDTH:
        raise DeltaMismatch(f"no integer type of {width} bytes for dtype {t.dtype}")
    return t.contiguous().view(_INT_OF_WIDTH[width]).reshape(-1)


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """A flat bool tensor as packed bits: element i is bit (i % 8) of byte i // 8."""
    pad = (-mask.numel()) % 8
    grouped = torch.nn.functional.pad(mask.to(torch.uint8), (0, pad)).view(-1, 8)
    return (grouped << _SHIFTS).sum(dim=1, dtype=torch.uint8)


def unpack_mask(packed: torch.Tensor, n: int) -> torch.Tensor:
    """`pack_mask`'s inverse: the first `n` bits as a flat bool tensor."""
    return ((packed.unsqueeze(1) >> _SHIFTS) & 1).reshape(-1)[:n].bool()


class Encoding(Protocol):
    """One exact way to carry a tensor's changed elements."""

    name: str

    def cost(self, n: int, k: int, width: int) -> int:
        """Bytes carried for `k` changed elements of `n`, each `width` bytes."""

    def encode(self, new_bits: torch.Tensor, changed: torch.Tensor) -> dict[str, torch.Tensor]:
        """The parts (flat tensors) that carry `new_bits` where `changed`."""

    def check(self, parts: dict[str, torch.Tensor], n: int) -> str | None:
        """Why the parts cannot apply to a tensor of `n` elements (None: they can)."""

    def apply(self, out_bits: torch.Tensor, parts: dict[str, torch.Tensor]) -> None:
        """Write the carried bits into the flat `out_bits`."""


def _index_dtype(n: int) -> torch.dtype:
    return torch.int32 if n <= 2**31 else torch.int64


class Sparse:
    name = "sparse"

    def cost(self, n: int, k: int, width: int) -> int:
        return k * ((4 if _index_dtype(n) == torch.int32 else 8) + width)

    def encode(self, new_bits, changed):
        idx = changed.nonzero().reshape(-1)
        return {"idx": idx.to(_index_dtype(changed.numel())), "val": new_bits[idx]}

    def check(self, parts, n):
        idx, val = parts.get("idx"), parts.get("val")
        if idx is None or val is None or idx.dim() != 1 or idx.numel() != val.numel():
            return "sparse parts must be idx and val of one length"
        if idx.dtype not in (torch.int32, torch.int64):
            return f"indices of dtype {idx.dtype}"
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
            return f"an index outside [0, {n})"
        return None

    def apply(self, out_bits, parts):
        out_bits[parts["idx"].long()] = parts["val"]


class Bitmask:
    name = "bitmask"

    def cost(self, n: int, k: int, width: int) -> int:
        return (n + 7) // 8 + k * width

    def encode(self, new_bits, changed):
        return {"mask": pack_mask(changed), "val": new_bits[changed]}

    def check(self, parts, n):
        mask, val = parts.get("mask"), parts.get("val")
        if mask is None or val is None or mask.dtype != torch.uint8 or mask.numel() != (n + 7) // 8:
            return f"bitmask parts must be a uint8 mask of {(n + 7) // 8} bytes and val"
        if int(unpack_mask(mask, n).sum()) != val.numel() or (n % 8 and int(mask[-1]) >> (n % 8)):
            return "the mask's set bits do not match the values"
        return None

    def apply(self, out_bits, parts):
        out_bits[unpack_mask(parts["mask"], out_bits.numel())] = parts["val"]


class Whole:
    name = "whole"

    def cost(self, n: int, k: int, width: int) -> int:
        return n * width

    def encode(self, new_bits, changed):
        return {"val": new_bits.clone()}

    def check(self, parts, n):
        val = parts.get("val")
        return None if val is not None and val.numel() == n else f"whole parts must be val of {n} elements"

    def apply(self, out_bits, parts):
        out_bits.copy_(parts["val"])


ENCODINGS: dict[str, Encoding] = {e.name: e for e in (Whole(), Bitmask(), Sparse())}  # ties: the first wins


@dataclass(frozen=True)
class TensorDelta:
    """One tensor's changed elements: `encoding` names an entry of ENCODINGS; `parts` its flat tensors (values as
    the integers of their bits)."""

    encoding: str
    parts: dict[str, torch.Tensor]

    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parts.values())


@dataclass(frozen=True)
class Delta:
    """What changed from one version of the named tensors to the next (unchanged tensors absent)."""

    tensors: dict[str, TensorDelta]

    def nbytes(self) -> int:
        return sum(t.nbytes() for t in self.tensors.values())


def encode_tensor(old: torch.Tensor, new: torch.Tensor) -> TensorDelta | None:
    """The cheapest exact encoding of the elements of `new` whose bits differ from `old` (None: none differ)."""
    if old.dtype != new.dtype or old.shape != new.shape:
        raise DeltaMismatch(f"{tuple(old.shape)} {old.dtype} -> {tuple(new.shape)} {new.dtype}")
    new_bits = bits(new)
    changed = bits(old) != new_bits
    k = int(torch.count_nonzero(changed))  # (a bool tensor's sum() is several times slower)
    if k == 0:
        return None
    n, width = new_bits.numel(), new.element_size()
    best = min(ENCODINGS.values(), key=lambda e: e.cost(n, k, width))
    return TensorDelta(best.name, best.encode(new_bits, changed))


def encode(old: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> Delta:
    """The delta from `old` to `new` (the same names, shapes and dtypes, else DeltaMismatch: a full push then)."""
    if old.keys() != new.keys():
        raise DeltaMismatch(f"the tensor names differ: {sorted(old.keys() ^ new.keys())[:5]}")
    out = {}
    for name, t in new.items():
        try:
            entry = encode_tensor(old[name], t)
        except DeltaMismatch as exc:
            raise DeltaMismatch(f"{name}: {exc}") from exc
        if entry is not None:
            out[name] = entry
    return Delta(out)


def check(base: dict[str, torch.Tensor], delta: Delta) -> None:
    """Raise DeltaMismatch unless every entry of `delta` applies to `base` as it is (checked before anything is
    written: a delta is applied whole or not at all)."""
    for name, entry in delta.tensors.items():
        if name not in base:
            raise DeltaMismatch(f"{name}: not a tensor of the base")
        encoding = ENCODINGS.get(entry.encoding)
        if encoding is None:
            raise DeltaMismatch(f"{name}: unknown encoding {entry.encoding!r}")
        target = bits(base[name])
        why = encoding.check(entry.parts, target.numel())
        if why is None and "val" in entry.parts and entry.parts["val"].dtype != target.dtype:
            why = f"values of dtype {entry.parts['val'].dtype}, the base's bits are {target.dtype}"
        if why is not None:
            raise DeltaMismatch(f"{name}: {why}")


def apply(base: dict[str, torch.Tensor], delta: Delta, *, inplace: bool = False) -> dict[str, torch.Tensor]:
    """The new tensors: `base` with `delta` applied, bit for bit. `inplace`: the base's tensors are written (no
    second copy of the model); otherwise the changed ones are copied first and `base` is left as it was. Checked
    whole first (DeltaMismatch: nothing written)."""
    check(base, delta)
    out = dict(base)
    for name, entry in delta.tensors.items():
        target = (base[name] if inplace and base[name].is_contiguous()
                  else base[name].clone(memory_format=torch.contiguous_format))
        ENCODINGS[entry.encoding].apply(bits(target), entry.parts)
        if inplace and target is not base[name]:
            base[name].copy_(target)
            target = base[name]
        out[name] = target
    return out


def deltable(tensors: dict[str, torch.Tensor]) -> str | None:
    """Why these served tensors are not worth delta pushes (None: they are). Only 16-bit floats: after an optimizer
    step at a GRPO learning rate most bf16/fp16 values keep their bits, while nearly every fp32 value changes."""
    wide = sorted({str(t.dtype) for t in tensors.values()
                   if t.is_floating_point() and t.dtype not in (torch.bfloat16, torch.float16)})
    return f"the served weights are {', '.join(wide)} (delta pushes pay for bf16/fp16 only)" if wide else None


__all__ = ["ENCODINGS", "Delta", "DeltaMismatch", "Encoding", "TensorDelta", "apply", "bits", "check",
           "deltable", "encode", "encode_tensor", "pack_mask", "unpack_mask"]
