"""The spool keeps every fetched batch until a checkpoint covers it: resume replays exactly the untrained ones."""

import json

import pytest

from grpo_plugin.atropos.api import parse_batch
from grpo_plugin.atropos.spool import Spool, SpoolError


def reply(tag: int) -> bytes:
    return json.dumps({"batch": [{"tokens": [[tag, tag]], "scores": [float(tag)]}]}).encode()


def tags(spool: Spool, seqs):
    return [parse_batch(spool.load(s)[1]).groups[0]["tokens"][0][0] for s in seqs]


def test_reply_bytes_and_metadata_round_trip(tmp_path):
    sp = Spool(tmp_path)
    seq = sp.add({"fetch_step": 3, "versions": [1, 2]}, reply(7))
    meta, raw = sp.load(seq)
    assert meta == {"fetch_step": 3, "versions": [1, 2], "seq": seq}
    assert raw == reply(7)  # the run-api's bytes, unchanged
    assert sp.counts() == (1, 0)


def test_resume_replays_batches_trained_after_the_checkpoint_then_pending_in_order(tmp_path):
    sp = Spool(tmp_path)
    seqs = [sp.add({}, reply(i)) for i in range(6)]
    for step, seq in enumerate(seqs[:4]):  # steps 0..3 trained batches 0..3; 4 and 5 fetched, not trained
        sp.mark_consumed(seq, step)
    assert sp.release(2) == 2  # checkpoint-2 covers the batches of steps 0 and 1
    assert sp.counts() == (2, 2)

    resumed = Spool(tmp_path)  # a new process
    order = resumed.resume(2)
    assert tags(resumed, order) == [2, 3, 4, 5]
    assert resumed.counts() == (4, 0)
    # new batches get fresh sequence numbers after every one on disk
    assert resumed.add({}, reply(9)) == 6


def test_resume_from_an_earlier_checkpoint_than_the_last_release_keeps_nothing_twice(tmp_path):
    sp = Spool(tmp_path)
    for i in range(3):
        sp.mark_consumed(sp.add({}, reply(i)), i)
    order = Spool(tmp_path).resume(1)
    assert tags(sp, order) == [1, 2]


def test_a_batch_spanning_several_steps_is_released_only_when_all_of_them_are_saved(tmp_path):
    sp = Spool(tmp_path, span=2)
    sp.mark_consumed(sp.add({}, reply(0)), 0)  # trains steps 0 and 1
    assert sp.release(1) == 0
    assert sp.release(2) == 1


def test_discard_and_clear(tmp_path):
    sp = Spool(tmp_path)
    a, b = sp.add({}, reply(0)), sp.add({}, reply(1))
    sp.discard(a)
    assert sp.counts() == (1, 0)
    sp.mark_consumed(b, 0)
    assert sp.clear() == 1
    assert sp.counts() == (0, 0)
    assert sp.add({}, reply(2)) == 0


def test_unreadable_batch_names_the_file(tmp_path):
    sp = Spool(tmp_path)
    seq = sp.add({}, b"")
    with pytest.raises(SpoolError, match=f"{seq:09d}.batch holds no reply"):
        sp.load(seq)
    sp.path(seq).write_bytes(b"{not json\n{}")
    with pytest.raises(SpoolError, match=f"{seq:09d}.batch cannot be read back"):
        sp.load(seq)


def test_span_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="span"):
        Spool(tmp_path, span=0)
