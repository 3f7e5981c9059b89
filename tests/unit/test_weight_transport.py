"""server/files.py without a server: which transport each server gets, what a sent directory becomes, the digest
computed once per version of a file. (Against a real server that cannot read the sync directory:
tests/integration/test_weight_transport.py.)"""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from grpo_plugin.server import files


class FakeServer:
    """What files.py asks of a client: whether it reads a path, and to take a file."""

    def __init__(self, url: str, reads: bool):
        self.base_url, self.reads = url, reads
        self.received: list[tuple[str, bytes, str]] = []
        self.deleted: list[str] = []

    def sees(self, path, nonce):
        with open(path) as fh:  # the trainer's check file exists while it asks
            assert fh.read() == nonce
        return (True, "") if self.reads else (False, f"{path}: No such file or directory")

    def send_file(self, name, path, sha256):
        self.received.append((name, path.read_bytes(), sha256))
        return f"/srv/up/{name.split('/')[0]}", path.stat().st_size

    def delete_sent(self, name):
        self.deleted.append(name)
        return True


def test_each_server_gets_the_transport_it_can_use(tmp_path):
    near, far = FakeServer("http://a:1", True), FakeServer("http://b:2", False)
    assert [t.kind for t in files.choose([near, far], tmp_path, "auto")] == ["shared", "network"]
    assert [t.kind for t in files.choose([near, far], tmp_path, "network")] == ["network", "network"]
    with pytest.raises(files.TransportError, match=r"server at http://b:2 cannot read the trainer's sync directory "
                                                   rf"{tmp_path} \(.*No such file.*weight_transport: network"):
        files.choose([near, far], tmp_path, "shared")
    assert list(tmp_path.iterdir()) == []  # the check file is removed, whatever the answer


def test_a_sent_directory_is_every_file_once_and_forgotten_by_name(tmp_path):
    folder = tmp_path / "adapter-v3"
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes(b"w" * 1000)
    (folder / "adapter_config.json").write_text("{}")
    (folder / ".partial").write_text("not sent")
    server, sent = FakeServer("http://b:2", False), files.SentFiles()
    assert sent.server_path(server, str(folder)) == "/srv/up/adapter-v3"
    assert [(n, hashlib.sha256(b).hexdigest() == d) for n, b, d in server.received] == [
        ("adapter-v3/adapter_config.json", True), ("adapter-v3/adapter_model.safetensors", True)]
    assert sent.bytes_sent == 1002
    sent.forget(server, str(folder))
    assert server.deleted == ["adapter-v3"]
    assert files.SharedFiles().server_path(server, str(folder)) == str(folder)  # shared: the path as it is
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="nothing to send"):
        sent.server_path(server, str(empty))


def test_the_digest_is_computed_once_per_version_of_a_file(tmp_path, monkeypatch):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"a" * 100)
    calls = []
    real = hashlib.sha256

    def counting():
        calls.append(1)
        return real()

    monkeypatch.setattr(files.hashlib, "sha256", counting)
    first = files.sha256_of(f)
    assert files.sha256_of(f) == first and len(calls) == 1  # the second server of the push: no second pass
    time.sleep(0.01)
    f.unlink()
    f.write_bytes(b"b" * 100)  # the next push's file: same name and size, another version
    os.utime(f)
    assert files.sha256_of(f) == real(b"b" * 100).hexdigest() and len(calls) == 2
