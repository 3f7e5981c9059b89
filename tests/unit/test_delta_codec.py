"""Delta pushes' pure half (grpo_plugin/delta): the changed bits encoded exactly, the rebuild bit-identical
(NaN payloads, -0.0, infinities), every encoding picked where it is cheapest, the wire file round trip, and the
digest chain that makes a server refuse a delta for a base it does not hold."""

from __future__ import annotations

import pytest
import torch

from grpo_plugin.delta import chain, wire
from grpo_plugin.delta.codec import (
    ENCODINGS,
    Delta,
    DeltaMismatch,
    TensorDelta,
    apply,
    bits,
    check,
    deltable,
    encode,
    pack_mask,
    unpack_mask,
)

DTYPES = [torch.bfloat16, torch.float16]


def _same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
                                        and torch.equal(bits(a[k]), bits(b[k])) for k in a)


def _weights(dtype, seed=0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"embed.weight": torch.randn(50, 16, generator=g).to(dtype),
            "layer.0.weight": torch.randn(16, 16, generator=g).to(dtype),
            "layer.0.bias": torch.randn(16, generator=g).to(dtype),
            "norm.weight": torch.ones(16, dtype=dtype)}


def _special(dtype) -> torch.Tensor:
    """-0.0, +-inf, and NaNs with different payloads and signs, as raw bits."""
    raw = {torch.bfloat16: [0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7FC1, 0xFFC3, 0x7F81, 0x0001],
           torch.float16: [0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7E01, 0xFE03, 0x7C01, 0x0001]}[dtype]
    return torch.tensor([r - 0x10000 if r >= 0x8000 else r for r in raw], dtype=torch.int16).view(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_sparse_step_round_trips_bit_for_bit(dtype):
    old = _weights(dtype)
    new = {k: v.clone() for k, v in old.items()}
    new["layer.0.weight"].view(-1)[[3, 77, 200]] += 1  # three elements: sparse
    delta = encode(old, new)
    assert set(delta.tensors) == {"layer.0.weight"} and delta.tensors["layer.0.weight"].encoding == "sparse"
    assert delta.nbytes() == 3 * (4 + 2)
    assert _same_bits(apply(old, delta), new)
    assert not _same_bits(old, new)  # apply left the base as it was


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_payloads_negative_zero_and_infinities_survive(dtype):
    old = {"w": torch.zeros(8, dtype=dtype), "v": _special(dtype)}
    new = {"w": _special(dtype), "v": torch.zeros(8, dtype=dtype)}
    rebuilt = apply(old, encode(old, new))
    assert _same_bits(rebuilt, new)
    # a NaN for another NaN, -0.0 for 0.0: equal or unordered as floats, different bits, so changed
    a = torch.cat([_special(dtype), torch.zeros(100, dtype=dtype)])
    b = a.clone()
    bits(b)[3] += 1  # one NaN payload for another
    bits(b)[0] = 0  # -0.0 -> +0.0
    d = encode({"x": a}, {"x": b})
    assert d.tensors["x"].parts["idx"].tolist() == [0, 3]
    assert _same_bits(apply({"x": a}, d), {"x": b})


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_changed_goes_whole_and_none_changed_is_empty(dtype):
    old = _weights(dtype)
    new = {k: (v.float() + 1).to(dtype) for k, v in old.items()}
    delta = encode(old, new)
    assert {e.encoding for e in delta.tensors.values()} == {"whole"}
    assert delta.nbytes() == sum(v.numel() * 2 for v in new.values())
    assert _same_bits(apply(old, delta), new)
    same = encode(old, {k: v.clone() for k, v in old.items()})
    assert same.tensors == {} and same.nbytes() == 0
    assert _same_bits(apply(old, same), old)


def test_each_encoding_is_picked_where_it_is_cheapest():
    old = torch.zeros(8000, dtype=torch.bfloat16)
    for k, expected in ((10, "sparse"), (2000, "bitmask"), (7800, "whole")):
        new = old.clone()
        new[torch.randperm(8000, generator=torch.Generator().manual_seed(k))[:k]] = 1.0
        entry = encode({"w": old}, {"w": new}).tensors["w"]
        assert entry.encoding == expected, k
        costs = {name: e.cost(8000, k, 2) for name, e in ENCODINGS.items()}
        assert entry.nbytes() == min(costs.values()) == costs[expected]
        assert torch.equal(bits(apply({"w": old}, Delta({"w": entry}))["w"]), bits(new))


def test_mask_packing_round_trips_at_any_length():
    g = torch.Generator().manual_seed(1)
    for n in (1, 7, 8, 9, 63, 1000):
        mask = torch.rand(n, generator=g) > 0.5
        packed = pack_mask(mask)
        assert packed.dtype == torch.uint8 and packed.numel() == (n + 7) // 8
        assert torch.equal(unpack_mask(packed, n), mask)


def test_inplace_writes_the_base_itself():
    old = _weights(torch.bfloat16)
    new = {k: v.clone() for k, v in old.items()}
    new["embed.weight"][4] = 3.0
    held = {k: v.clone() for k, v in old.items()}
    ptr = held["embed.weight"].data_ptr()
    out = apply(held, encode(old, new), inplace=True)
    assert _same_bits(held, new) and _same_bits(out, new) and held["embed.weight"].data_ptr() == ptr


def test_a_delta_that_does_not_fit_is_refused_whole_before_anything_is_written():
    old = _weights(torch.bfloat16)
    new = {k: (v.float() + 1).to(torch.bfloat16) for k, v in old.items()}
    delta = encode(old, new)
    held = {k: v.clone() for k, v in old.items()}
    bad = dict(delta.tensors)
    bad["zzz.last"] = TensorDelta("sparse", {"idx": torch.tensor([10**6], dtype=torch.int32),
                                              "val": torch.tensor([1], dtype=torch.int16)})
    with pytest.raises(DeltaMismatch, match="zzz.last: not a tensor of the base"):
        apply(held, Delta(bad), inplace=True)
    out_of_range = {**delta.tensors, "norm.weight": TensorDelta(
        "sparse", {"idx": torch.tensor([16], dtype=torch.int32), "val": torch.tensor([1], dtype=torch.int16)})}
    with pytest.raises(DeltaMismatch, match=r"norm.weight: an index outside \[0, 16\)"):
        apply(held, Delta(out_of_range), inplace=True)
    wrong_width = {"norm.weight": TensorDelta("whole", {"val": torch.zeros(16, dtype=torch.int32)})}
    with pytest.raises(DeltaMismatch, match="values of dtype torch.int32"):
        check(held, Delta(wrong_width))
    assert _same_bits(held, old)  # nothing of any of them was applied
    with pytest.raises(DeltaMismatch, match="names differ"):
        encode(old, {k: v for k, v in new.items() if k != "norm.weight"})
    with pytest.raises(DeltaMismatch, match="layer.0.bias"):
        encode(old, {**new, "layer.0.bias": new["layer.0.bias"].half()})


def test_only_16_bit_floats_are_deltable():
    assert deltable(_weights(torch.bfloat16)) is None
    assert deltable({**_weights(torch.float16), "steps": torch.zeros(2, dtype=torch.int64)}) is None
    assert "float32" in deltable({**_weights(torch.bfloat16), "x": torch.zeros(2)})


def test_the_wire_file_round_trips_and_its_sha_is_of_the_bytes(tmp_path):
    old = _weights(torch.bfloat16)
    new = {k: v.clone() for k, v in old.items()}
    new["embed.weight"].view(-1)[:100] = 2.0  # bitmask
    new["layer.0.weight"][0, 0] = 5.0  # sparse
    new["norm.weight"] = (new["norm.weight"] * 3)  # whole
    delta = encode(old, new)
    assert {e.encoding for e in delta.tensors.values()} == {"sparse", "bitmask", "whole"}
    base = chain.anchor_digest(chain.new_anchor_id())
    sha = wire.write(tmp_path / "d.safetensors", delta, base)
    got, got_base, got_sha = wire.read(tmp_path / "d.safetensors")
    assert (got_base, got_sha) == (base, sha)
    assert _same_bits(apply(old, got), new)
    (tmp_path / "x.safetensors").write_bytes(b"not a delta")
    with pytest.raises(DeltaMismatch, match="not a safetensors file"):
        wire.read(tmp_path / "x.safetensors")


def test_the_digest_chain_names_one_history():
    a, b = chain.new_anchor_id(), chain.new_anchor_id()
    assert a != b and chain.anchor_digest(a) != chain.anchor_digest(b)  # a new anchor: a new base
    d0 = chain.anchor_digest(a)
    s1, s2 = "11" * 32, "22" * 32
    d1 = chain.next_digest(d0, s1)
    assert d1 == chain.next_digest(d0, s1) and len(d1) == 64
    assert chain.next_digest(d1, s2) != chain.next_digest(d0, s2)  # a skipped delta is another history
    assert chain.next_digest(d0, s2) != d1  # another delta from the same base is another version
