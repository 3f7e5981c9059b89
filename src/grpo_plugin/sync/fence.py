"""The server fence: weight writes while OTHER clients generate on the server (Atropos environments).

Without other clients the trainer simply sends no request while it writes. With them, a write must not overlap
generation, and a prefix-cache reset fails while requests hold KV blocks (vLLM answers `success: false`). So:

1. `POST /pause?mode=wait&clear_cache=true` — vLLM lets in-flight requests finish on the old weights, queues new
   ones, then drops the prefix cache;
2. the write (a LoRA load, an in-place reload, or — for ipc — the optimizer step itself);
3. `POST /grpo/policy` — the policy version the server now computes with (requests admitted from here on are
   recorded under it, in_vllm/ledger.py);
4. `POST /resume`.

If the write fails, generation is resumed anyway (nothing new is announced) and the error is raised.
"""

from __future__ import annotations

import contextlib
import time

from grpo_plugin.server.client import ServerError
from grpo_plugin.sync.base import SyncError, SyncResult, explain_rpc_failure


class ServerFence:
    def __init__(self, client, mode: str):
        self.client, self.mode = client, mode
        self.held = False

    def hold(self) -> None:
        try:
            self.client.pause(mode="wait", clear_cache=True)
        except ServerError as exc:
            raise SyncError(explain_rpc_failure(self.mode, str(exc), "pausing generation failed")) from exc
        self.held = True

    def release(self, version: int | None = None, model: str | None = None) -> None:
        """Announce `version` (unless None) and resume generation."""
        try:
            if version is not None:
                self.client.set_policy(version, model)
        finally:
            self.held = False
            try:
                self.client.resume()
            except ServerError as exc:
                raise SyncError(explain_rpc_failure(self.mode, str(exc), "resuming generation failed")) from exc


class FencedSync:
    """A WeightSync whose pushes run inside the server fence and announce the step they push."""

    def __init__(self, inner, fence: ServerFence):
        self.inner, self.fence = inner, fence
        self.mode = inner.mode
        self.needs_initial_push = inner.needs_initial_push
        self.starts_server = inner.starts_server
        self.hands_files = inner.hands_files

    @property
    def generation_model(self) -> str:
        return self.inner.generation_model

    @property
    def reads(self) -> str:
        return self.inner.reads

    @property
    def writes_in_place(self) -> bool:
        return self.inner.writes_in_place

    @property
    def verify_context(self) -> str:
        return getattr(self.inner, "verify_context", "")

    def prepare(self, model) -> None:
        self.inner.prepare(model)

    def push(self, step: int, tensors: dict | None = None) -> SyncResult:
        t0 = time.perf_counter()
        self.fence.hold()
        try:
            result = self.inner.push(step, tensors)
        except BaseException:
            with contextlib.suppress(Exception):  # the push's error is the one to report
                self.fence.release()
            raise
        self.fence.release(step, self.inner.generation_model)
        result.sync_ms = (time.perf_counter() - t0) * 1e3  # the trainer's whole pause, fence included
        return result

    def server_restarted(self) -> None:
        self.fence.held = False  # a fresh server holds no pause
        self.inner.server_restarted()

    def close(self) -> None:
        self.inner.close()
