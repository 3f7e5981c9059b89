"""How a weight sync's files reach each vLLM server (`grpo.weight_transport`): the trainer always writes them into
its sync directory (storage.SyncDir); a server that reads that directory is handed the path (`shared`), one that
cannot (another host, another mount namespace) gets the files over HTTP (`network`: in_vllm/uploads.py), streamed
from the trainer's file in chunks (never a second copy in the trainer's memory), checksummed, to every server at
once (the server group fans every sync call out in parallel).

`auto` (the default) finds out before the first push: the trainer writes a file holding a random nonce into the
sync directory's root and asks each server whether it reads that file with that content (`POST /grpo/sees`).
`shared` refuses a server that does not (the sync would fail at the first load, or load a stale file left at that
path); `network` sends to every server.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
from pathlib import Path

from grpo_plugin.config.storage import SEES_PREFIX

LOG = logging.getLogger("grpo_plugin")
CHUNK = 8 << 20  # bytes per read of the file being sent


class SharedFiles:
    """The server reads the trainer's sync directory at the same path."""

    kind = "shared"

    def server_path(self, client, local_dir: str) -> str:
        return local_dir

    def forget(self, client, local_dir: str) -> None:
        pass


class SentFiles:
    """The server cannot see the trainer's sync directory: each directory a sync hands it is sent first."""

    kind = "network"

    def __init__(self):
        self.bytes_sent = 0

    def server_path(self, client, local_dir: str) -> str:
        folder = Path(local_dir)
        files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
        if not files:
            raise FileNotFoundError(f"nothing to send in {folder}")
        remote = None
        for f in files:
            remote, sent = client.send_file(f"{folder.name}/{f.name}", f, sha256_of(f))
            self.bytes_sent += sent
        return remote

    def forget(self, client, local_dir: str) -> None:
        client.delete_sent(Path(local_dir).name)


_DIGESTS: dict[tuple, str] = {}  # (path, inode, size, mtime) -> sha256: a push's file is hashed once, not per server
_DIGEST_LOCK = threading.Lock()


def sha256_of(path: Path) -> str:
    """The file's sha256, computed once per version of the file (every server of a push asks for it)."""
    st = path.stat()
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    with _DIGEST_LOCK:  # the servers' threads ask at once: the first hashes, the others wait for its answer
        if key not in _DIGESTS:
            digest = hashlib.sha256()
            with path.open("rb") as fh:
                while chunk := fh.read(CHUNK):
                    digest.update(chunk)
            if len(_DIGESTS) > 64:
                _DIGESTS.clear()
            _DIGESTS[key] = digest.hexdigest()
        return _DIGESTS[key]


def chunks(path: Path):
    """The file's bytes, CHUNK at a time (the request body: streamed, chunked transfer encoding)."""
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            yield chunk


class TransportError(RuntimeError):
    """A server cannot be given the sync's files the way the config says."""


def choose(clients: list, sync_root: Path, setting: str) -> list:
    """One file transport per server, as `grpo.weight_transport` says (`auto`: what each server can read)."""
    if setting == "network":
        return [SentFiles() for _ in clients]
    sync_root.mkdir(parents=True, exist_ok=True)
    nonce = secrets.token_hex(16)
    check = sync_root / f"{SEES_PREFIX}{nonce}"
    check.write_text(nonce)
    try:
        seen = [c.sees(str(check), nonce) for c in clients]
    finally:
        check.unlink(missing_ok=True)
    out = []
    for c, (sees, why) in zip(clients, seen):
        if sees:
            out.append(SharedFiles())
            continue
        if setting == "shared":
            raise TransportError(
                f"grpo.weight_transport: shared, but the vLLM server at {c.base_url} cannot read the trainer's sync "
                f"directory {sync_root} ({why}): it runs on another host or in another mount namespace. Mount the "
                "same filesystem there at the same path and set grpo.sync_dir to it, or set grpo.weight_transport: "
                "network (or auto) to send the weights over HTTP.")
        LOG.warning("grpo_plugin: the vLLM server at %s cannot read the sync directory %s (%s): its weights go "
                    "over HTTP (grpo.weight_transport: %s)", c.base_url, sync_root, why, setting)
        out.append(SentFiles())
    return out



__all__ = ["SentFiles", "SharedFiles", "TransportError", "choose", "chunks", "sha256_of"]
