"""How the trainer reaches the server's shared weights, picked by the manifest's `transport` (one small object
each; sync/ipc.py only asks them):

- `shm` (vLLM-CPU): one shared-memory file the trainer maps (ipc/shm.py);
- `cuda`: one CUDA IPC handle per storage, rebuilt on the same GPU (ipc/cuda.py).

Each gives {vLLM name: tensor} (`attach`), says why its mapping no longer belongs to a live server (`orphaned`),
makes the optimizer's writes complete before the server may compute again (`after_write`), and names what it
shares (`describe`).
"""

from __future__ import annotations

import os
from typing import Protocol

import psutil
import torch


class Transport(Protocol):
    manifest: dict | None  # the manifest of the last attach

    def attach(self, manifest: dict) -> dict[str, torch.Tensor]: ...

    def orphaned(self) -> str | None: ...

    def after_write(self) -> None: ...

    def describe(self) -> str: ...

    def close(self) -> None: ...


def _worker_gone(manifest: dict | None) -> str | None:
    pid = (manifest or {}).get("pid")
    if pid and not psutil.pid_exists(pid):
        return f"its worker process {pid} is gone"
    return None


class ShmTransport:
    """The server's weights in one shared-memory file (vLLM-CPU). The open descriptor tells when the file was
    removed (a restarted server writes a new one)."""

    def __init__(self):
        self.manifest: dict | None = None
        self._fd: int | None = None

    def attach(self, manifest: dict) -> dict[str, torch.Tensor]:
        from grpo_plugin.ipc.shm import map_manifest  # only the transport in use is loaded

        tensors = map_manifest(manifest)
        self.close()
        self._fd = os.open(manifest["file"], os.O_RDONLY)
        self.manifest = manifest
        return tensors

    def orphaned(self) -> str | None:
        if self._fd is None or self.manifest is None:
            return None
        if os.fstat(self._fd).st_nlink == 0:
            return f"its weight file {self.manifest['file']} was removed"
        return _worker_gone(self.manifest)

    def after_write(self) -> None:
        """CPU: the optimizer's writes are done when step() returns."""

    def describe(self) -> str:
        return str(self.manifest["file"]) if self.manifest else "(not attached)"

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class CudaTransport:
    """The server's weights through CUDA IPC handles on one GPU. The optimizer's kernels are queued on the trainer's
    stream: `after_write` waits for them before the server may compute again (the trainer is its only writer and,
    with the `trainer` fence, its only client; with the `server` fence the wait comes before /resume)."""

    def __init__(self):
        self.manifest: dict | None = None

    def attach(self, manifest: dict) -> dict[str, torch.Tensor]:
        from grpo_plugin.ipc.cuda import attach  # only the transport in use is loaded (CUDA)

        tensors = attach(manifest)
        self.manifest = manifest
        return tensors

    def orphaned(self) -> str | None:
        return _worker_gone(self.manifest)

    def after_write(self) -> None:
        torch.cuda.synchronize()

    def describe(self) -> str:
        uuid = (self.manifest or {}).get("device_uuid", "?")
        return f"CUDA memory of GPU {uuid}"

    def close(self) -> None:
        pass


TRANSPORTS = {"shm": ShmTransport, "cuda": CudaTransport}


def transport_for(manifest: dict) -> Transport:
    name = manifest.get("transport", "shm")  # manifests from before the CUDA transport name none
    if name not in TRANSPORTS:
        raise ValueError(f"the server shares its weights through {name!r}; this trainer knows "
                         f"{', '.join(TRANSPORTS)}")
    return TRANSPORTS[name]()
