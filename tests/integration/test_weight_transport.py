"""A vLLM server that cannot read the trainer's sync directory (server/files.py, in_vllm/uploads.py), as a server on
another host sees none of the trainer's files: the session's `blind_server` (tests/conftest.py: a mount namespace
of its own whose /dev/shm, where the trainer's sync directories are, is a private tmpfs).
`grpo.weight_transport: auto` finds it blind before the first push and sends it the files over HTTP; `shared`
refuses it naming the server and the directory; every push is verified by the probe; a corrupted or misnamed
upload is refused and nothing of it is kept; a push cut by the link (dropped mid-push) or corrupted on the way is
made again and verified, and the run goes on."""

from __future__ import annotations

import os

import pytest

from grpo_plugin.config.storage import default_sync_root
from grpo_plugin.server import client as client_module
from grpo_plugin.server import files
from grpo_plugin.server.client import CorruptUpload, ServerError
from grpo_plugin.server.recovery import ServerGuard
from grpo_plugin.sync import ProbeVerifier
from grpo_plugin.sync.lora import LoraSync
from grpo_plugin.sync.restart import InPlaceReload
from tests.integration.conftest import perturb_lora

pytestmark = pytest.mark.integration


def test_auto_sends_to_a_server_that_cannot_read_the_sync_dir_and_shared_refuses_it(blind_server, tmp_path):
    _, blind = blind_server
    root = default_sync_root()  # /dev/shm: the server has its own
    assert [t.kind for t in files.choose([blind], root, "auto")] == ["network"]
    assert [t.kind for t in files.choose([blind], root, "network")] == ["network"]
    with pytest.raises(files.TransportError, match=rf"the vLLM server at {blind.base_url} cannot read the "
                                                   rf"trainer's sync directory {root} .*does not exist"):
        files.choose([blind], root, "shared")
    assert not [p for p in root.iterdir() if p.name.startswith(".grpo_plugin-sees-")]  # the check file went
    # a directory both see (/tmp is not private to the server): handed as a path
    assert [t.kind for t in files.choose([blind], tmp_path, "auto")] == ["shared"]
    assert [t.kind for t in files.choose([blind], tmp_path, "shared")] == ["shared"]


def _verified_pushes(client, sync, model, step, probe_ids, pushes: int) -> None:
    """`pushes` times: `step(model, seed=...)` (a stand-in optimizer step), push, the probe within 1e-4."""
    verifier = ProbeVerifier(client, probe_ids, tolerance=1e-4, mode=sync.mode)
    client.set_policy(0, None)  # a session server: no policy an earlier test's run announced (a run does this first)
    for i in range(pushes):
        step(model, seed=i)
        result = sync.push(i)
        assert verifier.verify(model, sync.generation_model, result).logprob_diff <= 1e-4


def test_lora_sync_over_http_every_push_verified_and_retired_versions_removed_there(blind_server, peft_trainer,
                                                                                    probe_ids, request):
    _, client = blind_server
    client.files = sent = files.SentFiles()
    sync = LoraSync(client, adapter_name="net", keep=2)
    request.addfinalizer(sync.close)
    sync.prepare(peft_trainer)
    _verified_pushes(client, sync, peft_trainer.model, perturb_lora, probe_ids, pushes=3)
    adapter = (sync.adapter_dir / sync.generation_model / "adapter_model.safetensors").stat().st_size
    assert sent.bytes_sent >= 3 * adapter
    # net-v1 was retired at the third push: unloaded, and its uploaded directory removed on the server
    assert client.delete_sent("net-v1") is False and client.delete_sent("net-v3") is True


def test_restart_reload_over_http_serves_the_trained_weights(blind_server, tiny_model_dir, probe_ids, tmp_path):
    from grpo_plugin.sync.restart import RestartSync
    from tests.integration.test_restart_sync import train_step, trainer_for

    _, client = blind_server
    client.files = sent = files.SentFiles()
    trainer = trainer_for(tiny_model_dir)
    sync = RestartSync(client, strategy="reload")  # in /dev/shm: the trainer's, which the server cannot see
    try:
        sync.prepare(trainer)
        _verified_pushes(client, sync, trainer.model, train_step, probe_ids, pushes=2)
        weights = sum(p.stat().st_size for p in default_sync_root().glob(
            f"grpo_plugin-restart-{os.getpid()}-*/*.safetensors"))
        assert sent.bytes_sent >= 2 * weights > 0
    finally:
        InPlaceReload(client, timeout=300).apply(None)  # back to its own checkpoint for the tests after this one
        sync.close()


def test_a_corrupted_or_misnamed_upload_is_refused_and_nothing_kept(blind_server, tmp_path, monkeypatch):
    _, client = blind_server
    f = tmp_path / "w.bin"
    f.write_bytes(os.urandom(3 << 20))
    monkeypatch.setattr(client_module, "RESEND_AFTER_S", 0.01)
    with pytest.raises(CorruptUpload, match=r"HTTP 422: .*3145728 bytes arrived with sha256 .*nothing kept"):
        client.send_file("corrupt/w.bin", f, "0" * 64)  # sent SEND_TRIES times, refused each time
    assert client.delete_sent("corrupt") is True  # the directory was made, the file in it was not kept
    for name in ("../etc/w.bin", "a/../../w.bin", ".hidden/w.bin", "a/b/c"):
        with pytest.raises(ServerError, match="HTTP 40[04]"):  # refused, or normalised by HTTP out of the route
            client.send_file(name, f, files.sha256_of(f))
    with pytest.raises(ServerError, match="not a sync-directory check file"):
        client.sees("/etc/passwd", "root")
    path, size = client.send_file("good/w.bin", f, files.sha256_of(f))
    assert size == 3 << 20 and path.endswith("/good")
    assert client.delete_sent("good") is True


class LinkFault:
    """Injected into the trainer's side of a send (server/client.py reads each file through `chunks`): at the
    `at`-th send on, for `times` sends, `fault()` runs before the first bytes leave, or (`corrupt`) one bit of the
    first chunk flips on the way, as a faulty link or proxy would do it."""

    def __init__(self, monkeypatch, *, at: int = 1, times: int = 1, corrupt: bool = False, fault=None):
        self.sends, self.at, self.times, self.corrupt, self.fault = 0, at, times, corrupt, fault
        self._chunks = files.chunks  # the real one (not an earlier fault's)
        monkeypatch.setattr(client_module, "chunks", self.chunks)

    def chunks(self, path):
        self.sends += 1
        hit = self.at <= self.sends < self.at + self.times
        for i, chunk in enumerate(self._chunks(path)):
            if hit and i == 0:
                if self.corrupt:
                    chunk = bytes([chunk[0] ^ 1]) + chunk[1:]
                else:
                    self.fault()
            yield chunk


def test_a_push_cut_by_the_link_or_corrupted_on_the_way_is_made_again_and_verified(
        blind_server, tiny_model_dir, probe_ids, monkeypatch, capsys):
    """restart (reload) to a server on a host of its own, each push under the server guard as a run makes it:
    - (a) the link dropped for 6 s while a push's file is on its way (the server's end of the veth pair down):
      whatever the connection made of it (the send stalled and resumed, or a request on an idle connection was
      reset), the push ends with the trainer's weights on the server, verified, no server restarted;
    - (b) the file corrupted on the way: the server refuses it by its sha256 and keeps nothing, the trainer sends it
      again; corrupted at every send of a push: the guard pushes the weights again in full and verifies them;
    - the pushes after each fault go on as usual."""
    import threading

    from grpo_plugin.sync.restart import RestartSync
    from tests.integration.test_restart_sync import train_step, trainer_for

    server, client = blind_server
    client.files = files.SentFiles()
    monkeypatch.setattr(client_module, "RESEND_AFTER_S", 0.2)
    trainer = trainer_for(tiny_model_dir)
    sync = RestartSync(client, strategy="reload")
    verifier = ProbeVerifier(client, probe_ids, tolerance=1e-4, mode="restart")
    step = [0]

    def push_verified():
        result = sync.push(step[0])
        verifier.verify(trainer.model, sync.generation_model, result)  # raises past the tolerance
        return result

    def restore():  # what the session's restore does (sync/session.py)
        sync.server_restarted()
        return push_verified()

    guard = ServerGuard(client, restore=restore, step=lambda: step[0], servers=lambda: [], hang_timeout_s=30,
                        wait_timeout_s=120)
    client.set_policy(0, None)

    def train_and_push(fault: LinkFault | None = None):
        step[0] += 1
        train_step(trainer.model, seed=step[0])
        sends = fault.sends if fault else 0
        result = guard.run("weight push", push_verified, redo=False)
        assert result.logprob_diff <= 1e-4
        return (fault.sends - sends) if fault else 0

    def drop_link():
        server.link(False)
        threading.Timer(6.0, server.link, (True,)).start()

    try:
        sync.prepare(trainer)
        train_and_push()
        # (a) the link down for 6 s mid-push
        train_and_push(LinkFault(monkeypatch, fault=drop_link))
        assert all(not o.restarted and o.cause.startswith("the link to the vLLM server failed") for o in guard.outages)
        train_and_push()
        # (b) one send corrupted: refused by checksum, sent again (2 sends), no recovery needed
        outages = len(guard.outages)
        assert train_and_push(LinkFault(monkeypatch, corrupt=True)) == 2
        assert len(guard.outages) == outages
        # (b) every send of the push corrupted: the guard pushes the weights again in full, verified
        assert train_and_push(LinkFault(monkeypatch, corrupt=True, times=client_module.SEND_TRIES)) \
            == client_module.SEND_TRIES + 1
        last = guard.outages[-1]
        assert len(guard.outages) == outages + 1 and not last.restarted and last.redone == ["weight push + probe"]
        assert "arrived with sha256" in last.cause and guard.links.in_a_row == 0
        train_and_push()
    finally:
        client.watch = None  # the session's server: no guard of this test's watching its later requests
        InPlaceReload(client, timeout=300).apply(None)
        sync.close()
    err = capsys.readouterr().err
    assert "failed on the link to the vLLM server" in err and "so it is not restarted" in err
