"""A vLLM server that cannot read the trainer's sync directory (server/files.py, in_vllm/uploads.py), as a server on
another host sees none of the trainer's files: the session's `blind_server` (tests/conftest.py: a mount namespace
of its own whose /dev/shm, where the trainer's sync directories are, is a private tmpfs).
`grpo.weight_transport: auto` finds it blind before the first push and sends it the files over HTTP; `shared`
refuses it naming the server and the directory; every push is verified by the probe; a corrupted or misnamed
upload is refused and nothing of it is kept."""

from __future__ import annotations

import os

import pytest

from grpo_plugin.config.storage import default_sync_root
from grpo_plugin.server import files
from grpo_plugin.server.client import ServerError
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


def test_a_corrupted_or_misnamed_upload_is_refused_and_nothing_kept(blind_server, tmp_path):
    _, client = blind_server
    f = tmp_path / "w.bin"
    f.write_bytes(os.urandom(3 << 20))
    with pytest.raises(ServerError, match=r"HTTP 400: .*3145728 bytes arrived with sha256 .*nothing kept"):
        client.send_file("corrupt/w.bin", f, "0" * 64)
    assert client.delete_sent("corrupt") is True  # the directory was made, the file in it was not kept
    for name in ("../etc/w.bin", "a/../../w.bin", ".hidden/w.bin", "a/b/c"):
        with pytest.raises(ServerError, match="HTTP 40[04]"):  # refused, or normalised by HTTP out of the route
            client.send_file(name, f, files.sha256_of(f))
    with pytest.raises(ServerError, match="not a sync-directory check file"):
        client.sees("/etc/passwd", "root")
    path, size = client.send_file("good/w.bin", f, files.sha256_of(f))
    assert size == 3 << 20 and path.endswith("/good")
    assert client.delete_sent("good") is True
