"""`grpo.managed_server: true`: `axolotl train` starts the vLLM server itself — `grpo.num_servers` of them, on
consecutive ports — and stops exactly those process trees at exit: normal end, Ctrl-C, SIGTERM, or a crash
(atexit; and PR_SET_PDEATHSIG if we are killed)."""

from __future__ import annotations

import atexit
import signal
import sys
from pathlib import Path

from grpo_plugin.config.views import RunConfig
from grpo_plugin.server.process import VLLMServerProcess, specs_from, start_servers

_SERVERS: list[VLLMServerProcess] = []


def servers() -> list[VLLMServerProcess]:
    """Every managed server, in port order (empty: the trainer manages none)."""
    return list(_SERVERS)


def log_path(run: RunConfig, index: int) -> str:
    log = run.grpo.server_log or str(Path(run.output_dir or ".") / "vllm_server.log")
    if index == 0:
        return log
    path = Path(log)
    return str(path.with_name(f"{path.stem}-{index}{path.suffix}"))


def start(run: RunConfig) -> VLLMServerProcess:
    """Start the run's servers (non-blocking; the trainer waits for their health with a progress line). Returns the
    first. A server that cannot start stops the ones already started."""
    if _SERVERS:
        return _SERVERS[0]
    specs = specs_from(run)  # once per run: a server lost later is started again on its own spec
    started = start_servers(specs, log_path=lambda i: log_path(run, i))
    _SERVERS.extend(started)
    for server in started:
        print(f"[grpo_plugin] started managed vLLM server pid {server.pid} on {server.spec.base_url} "
              f"(log: {server.log_path})", file=sys.stderr, flush=True)
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
    return started[0]


def stop() -> None:
    stopping = list(_SERVERS)
    _SERVERS.clear()
    for server in stopping:
        pid = server.pid
        print(f"[grpo_plugin] stopping managed vLLM server pid {pid}", file=sys.stderr, flush=True)
        server.stop()
        print(f"[grpo_plugin] managed vLLM server pid {pid} stopped", file=sys.stderr, flush=True)
