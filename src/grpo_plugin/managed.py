"""`grpo.managed_server: true`: `axolotl train` starts the vLLM server itself and stops exactly that process
tree at exit — normal end, Ctrl-C, SIGTERM, or a crash (atexit; and PR_SET_PDEATHSIG if we are killed)."""

from __future__ import annotations

import atexit
import logging
import signal
from pathlib import Path

from grpo_plugin.server import VLLMServerProcess, spec_from_cfg

LOG = logging.getLogger("grpo_plugin")
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
    LOG.info("started managed vLLM server pid %s on %s (log: %s)", server.pid, server.spec.base_url, log)
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
        LOG.info("stopping managed vLLM server pid %s", server.pid)
        server.stop()
