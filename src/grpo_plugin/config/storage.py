"""Where synced weights live: one bounded, private directory per run, never left behind.

- The directory is `<root>/grpo_plugin-<mode>-<pid>-<random>`; root is `grpo.sync_dir`, else /dev/shm (RAM,
  fastest) when writable, else the temp dir. It is separate from the user's `output_dir` checkpoints.
- It holds only what the server needs for the *current* sync; every write replaces the previous one.
- `close()` removes it (normal end, Ctrl-C, crash through atexit). After a hard kill (SIGKILL, OOM killer)
  the next run removes directories whose owning process is gone (`remove_stale`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

import psutil

LOG = logging.getLogger("grpo_plugin")

PREFIX = "grpo_plugin-"
_NAME = re.compile(rf"^{re.escape(PREFIX)}[a-z_]+-(\d+)-")


class SyncStorageError(RuntimeError):
    """The sync directory cannot hold what a sync must write."""


SEES_PREFIX = ".grpo_plugin-sees-"  # + a nonce: the file a server is asked to read (server/files.py, uploads.py)
# the server's answer to an upload whose bytes do not match its sha256 (in_vllm/uploads.py): the trainer sends it again
CORRUPT_UPLOAD_STATUS = 422


def default_sync_root() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def sync_root(root: str | Path | None) -> Path:
    """Where sync directories are made: `grpo.sync_dir`, else the default root."""
    return Path(root) if root else default_sync_root()


def owner_pid(path: Path) -> int | None:
    """The pid of the process that created sync directory `path`, or None for a name that is not one."""
    m = _NAME.match(Path(path).name)
    return int(m.group(1)) if m else None


def remove_stale(root: Path) -> list[Path]:
    """Remove sync directories left in `root` by runs whose process no longer exists. Returns what was removed.
    A directory whose owner is alive (another run, maybe another user's) is never touched."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            pid = owner_pid(entry)
            if pid is None or not entry.is_dir():
                continue
            if pid == os.getpid() or psutil.pid_exists(pid):
                continue
            shutil.rmtree(entry, ignore_errors=True)
            if not entry.exists():
                removed.append(entry)
                LOG.warning("grpo_plugin: removed %s left by an earlier run (pid %d is gone)", entry, pid)
    return removed


class SyncDir:
    def __init__(self, mode: str, root: str | Path | None = None):
        self.root = sync_root(root)
        self.root.mkdir(parents=True, exist_ok=True)
        remove_stale(self.root)
        self.path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{mode}-{os.getpid()}-", dir=self.root))

    def ensure_space(self, nbytes: int, what: str, replaces: Path | None = None) -> None:
        """Raise a clear error if writing `nbytes` would not fit (counting the file it replaces as free)."""
        free = shutil.disk_usage(self.path).free
        if replaces is not None and replaces.exists():
            free += replaces.stat().st_size
        if nbytes > free:
            raise SyncStorageError(
                f"{what} needs {nbytes / 2**20:.0f} MiB but only {free / 2**20:.0f} MiB are free in "
                f"{self.root} (the sync directory). Set `grpo.sync_dir` to a filesystem with more room "
                "(fast local disk or tmpfs), or free space there."
            )

    def write_checkpoint(self, tensors: dict, what: str, name: str = "model.safetensors") -> Path:
        """Write `tensors` as one safetensors file `name`, replacing the previous one (the old file goes first,
        so the directory never holds two copies); `what` names the write in a lack-of-space error."""
        from safetensors.torch import save_file  # here: it imports torch, and config checks import this module

        target = self.path / name
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        self.ensure_space(nbytes + (1 << 20), what, replaces=target)
        target.unlink(missing_ok=True)
        save_file({k: (v if v.device.type == "cpu" else v.cpu()).contiguous() for k, v in tensors.items()},
                  str(target), metadata={"format": "pt"})
        return target

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
