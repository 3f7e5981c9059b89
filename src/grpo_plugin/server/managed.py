"""`grpo.managed_server: true`: `axolotl train` starts the vLLM server itself and stops exactly that process
tree at exit — normal end, Ctrl-C, SIGTERM, or a crash (atexit; and PR_SET_PDEATHSIG if we are killed)."""

from __future__ import annotations

import atexit
import signal
import sys
from pathlib import Path

from grpo_plugin.server.process import VLLMServerProcess, spec_from_cfg

_SERVER: VLLMServerProcess | None = None


def current() -> VLLMServerProcess | None:
    return _SERVER


def start(cfg) -> VLLMServerProcess:
    """Start the server (non-blocking; the trainer waits for health with a progress line)."""
    global _SERVER
    if _SERVER is not None:
        return _SERVER
    grpo = cfg.get("grpo") or {}
    log = grpo.get("server_log") or str(Path(cfg.get("output_dir") or ".") / "vllm_server.log")
    server = VLLMServerProcess(spec_from_cfg(cfg), log_path=log)
    server.start()
    _SERVER = server
    print(f"[grpo_plugin] started managed vLLM server pid {server.pid} on {server.spec.base_url} (log: {log})",
          file=sys.stderr, flush=True)
    atexit.register(stop)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        prev = signal.getsignal(sig)

        def _handler(signum, frame, _prev=prev):
            stop()
            if callable(_prev):
                _prev(signum, frame)
            else:
                raise SystemExit(128 + signum)

        signal.signal(sig, _handler)
    return server


def stop() -> None:
    global _SERVER
    server, _SERVER = _SERVER, None
    if server is not None:
        print(f"[grpo_plugin] stopping managed vLLM server pid {server.pid}", file=sys.stderr, flush=True)
        server.stop()
        print(f"[grpo_plugin] managed vLLM server pid {server.pid} stopped", file=sys.stderr, flush=True)
