"""The base a vLLM worker holds for delta pushes (in_vllm/delta_base.py), without a server: a delta is applied only
to the base whose digest it names and only when the file read leads to the trainer's digest; a refused delta leaves
the base exactly as it was."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from grpo_plugin.delta import chain, codec, wire
from grpo_plugin.in_vllm.delta_base import DeltaRefused, HeldBase


def _weights(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"embed.weight": torch.randn(40, 8, generator=g).bfloat16(), "norm.weight": torch.ones(8).bfloat16()}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(codec.bits(a[k]), codec.bits(b[k])) for k in a)


@pytest.fixture
def held(tmp_path):
    (tmp_path / "anchor").mkdir()
    save_file(_weights(), str(tmp_path / "anchor" / "model.safetensors"))
    base = HeldBase()
    anchor = chain.anchor_digest(chain.new_anchor_id())
    assert base.hold(str(tmp_path / "anchor"), anchor)["held_bytes"] == (40 * 8 + 8) * 2
    return base, anchor


def _delta_dir(tmp_path, old: dict, new: dict, base_digest: str, name="d") -> tuple[str, str]:
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    sha = wire.write(folder / wire.FILE_NAME, codec.encode(old, new), base_digest)
    return str(folder), chain.next_digest(base_digest, sha)


def test_a_delta_for_the_held_base_moves_it_on(held, tmp_path):
    base, anchor = held
    new = _weights()
    new["embed.weight"][3, 4] = 7.0
    folder, digest = _delta_dir(tmp_path, _weights(), new, anchor)
    assert _same(base.advance(folder, anchor, digest), new) and base.digest == digest
    newer = {k: v.clone() for k, v in new.items()}
    newer["norm.weight"][0] = -0.0
    folder, digest2 = _delta_dir(tmp_path, new, newer, digest, name="d2")
    assert _same(base.advance(folder, digest, digest2), newer) and base.digest == digest2


def test_refused_whole_when_the_base_is_another(held, tmp_path):
    base, anchor = held
    new = _weights()
    new["embed.weight"][0, 0] = 3.0
    other = chain.anchor_digest(chain.new_anchor_id())  # another run's anchor, or one this server never got
    folder, digest = _delta_dir(tmp_path, _weights(), new, other)
    with pytest.raises(DeltaRefused, match="the delta is for base .* this server holds"):
        base.advance(folder, other, digest)
    # the trainer's claim and the file disagree with what is held: refused too
    with pytest.raises(DeltaRefused, match="the delta file is for base"):
        base.advance(folder, anchor, digest)
    assert _same(base.tensors, _weights()) and base.digest == anchor


def test_refused_when_the_file_is_not_the_one_the_trainer_wrote(held, tmp_path):
    base, anchor = held
    new = _weights()
    new["embed.weight"][1, 1] = 2.0
    folder, digest = _delta_dir(tmp_path, _weights(), new, anchor)
    tampered = _weights()
    tampered["embed.weight"][1, 1] = 9.0
    wire.write(tmp_path / "d" / wire.FILE_NAME, codec.encode(_weights(), tampered), anchor)  # same base, other bytes
    with pytest.raises(DeltaRefused, match="does not lead to the trainer's version"):
        base.advance(folder, anchor, digest)
    (tmp_path / "d" / wire.FILE_NAME).write_bytes(b"garbage")
    with pytest.raises(DeltaRefused, match="cannot be read"):
        base.advance(folder, anchor, digest)
    assert _same(base.tensors, _weights()) and base.digest == anchor


def test_nothing_held_refuses_every_delta(tmp_path):
    empty = HeldBase()
    anchor = chain.anchor_digest(chain.new_anchor_id())
    with pytest.raises(DeltaRefused, match="holds no base"):
        empty.advance(str(tmp_path), anchor, anchor)
