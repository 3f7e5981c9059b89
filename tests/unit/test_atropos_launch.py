"""The Atropos launcher (atropos/launch.py): what it started that ends is started again, within bounds; its vLLM
server started from the config as `axolotl vllm-serve` starts it. Real processes; a stand-in answers for vLLM."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from grpo_plugin.atropos.launch import MAX_RESTARTS, Launch, LaunchError, served
from grpo_plugin.config.lookups import run_config
from grpo_plugin.config.runtime import SERVER_HOST
from grpo_plugin.server.process import ServerSpec, VLLMServerProcess, spec_from
from tests.conftest import free_port


def _launch(tmp_path) -> Launch:
    return Launch(Path("cfg.yaml"), run_config({"output_dir": str(tmp_path)}), [])


def _stop(run: Launch) -> None:
    for _, proc in run.procs:
        with contextlib.suppress(psutil.Error):
            for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
                p.kill()


def test_a_server_that_ends_is_started_again_and_the_trainer_goes_on(tmp_path):
    run = _launch(tmp_path)
    log = tmp_path / "server.log"
    starts = []

    def server() -> None:  # the first one dies after 0.3 s; the one started again keeps running
        cmd = "import time; time.sleep(0.3)" if not starts else "import time; time.sleep(60)"
        starts.append(run._start("vLLM server", [sys.executable, "-c", cmd], log, again=server))

    try:
        server()
        run.trainer = run._start("trainer", [sys.executable, "-c", "import time; time.sleep(3)"], None)
        assert run._watch(poll=0.1) == 0
        assert len(starts) == 2 and run.restarts == {"vLLM server": 1}
        assert starts[0].poll() is not None and starts[1].poll() is None  # the new one is up
        assert [name for name, _ in run.procs].count("vLLM server") == 1
    finally:
        _stop(run)


def test_a_process_that_keeps_ending_stops_the_launch_with_its_log(tmp_path):
    run = _launch(tmp_path)
    log = tmp_path / "run_api.log"

    def api() -> None:
        run._start("Atropos run-api", [sys.executable, "-c", "print('bad port'); raise SystemExit(2)"], log,
                   again=api)

    try:
        api()
        run.trainer = run._start("trainer", [sys.executable, "-c", "import time; time.sleep(60)"], None)
        with pytest.raises(LaunchError, match=f"(?s)started again {MAX_RESTARTS} times.*bad port"):
            run._watch(poll=0.1)
        assert run.restarts == {"Atropos run-api": MAX_RESTARTS}
    finally:
        _stop(run)


# answers GET /health with 200; its first start (no marker file yet) ends one second after it is up
_SERVE = """
import http.server, os, sys, threading
port, marker = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass
if not os.path.exists(marker):
    open(marker, "w").close()
    threading.Timer(1.0, os._exit, (3,)).start()
print("serving", port, flush=True)
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


@dataclass
class _StandIn(ServerSpec):
    marker: str = ""

    def command(self) -> list[str]:
        return [sys.executable, "-c", _SERVE, str(self.port), self.marker]


def test_the_launchers_server_that_ends_is_replaced_by_one_of_the_same_spec_and_stopped_at_the_end(tmp_path):
    run = Launch(Path("cfg.yaml"), run_config({"output_dir": str(tmp_path), "grpo": {"server_timeout": 30}}), [])
    spec = _StandIn(model="m", port=free_port(), marker=str(tmp_path / "started-once"))
    first = VLLMServerProcess(spec, log_path=tmp_path / "vllm_serve.log")
    try:
        first.start()
        run._watch_server(first, "vLLM server")
        run._wait_healthy(first)
        run.trainer = run._start("trainer", [sys.executable, "-c", "import time; time.sleep(4)"], None)
        assert run._watch(poll=0.1) == 0
        assert run.restarts == {"vLLM server": 1} and first.proc.poll() == 3
        [(name, proc)] = [(n, p) for n, p in run.procs if n == "vLLM server"]
        second = run.servers[proc.pid]
        assert second is not first and second.spec == spec and proc.poll() is None  # the same spec, up
        assert (tmp_path / "vllm_serve.log").read_text().count("serving") == 2  # one log, appended
        run.stop_all()
        assert proc.poll() is not None and run.servers == {}
    finally:
        _stop(run)


def test_a_taken_server_port_stops_the_launch_naming_it_and_kills_nothing(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = {"output_dir": str(tmp_path), "base_model": "m", "vllm": {"host": "127.0.0.1", "port": port}}
        run = Launch(Path("cfg.yaml"), run_config(cfg), [])
        with pytest.raises(LaunchError, match=f"port {port} .*already in use.*Nothing was killed"):
            run._start_server()
        assert run.procs == []


def test_the_server_gets_the_config_as_axolotl_vllm_serve_has_it():
    """`bf16: auto` resolved as axolotl resolves it (no GPU here: float32, the dtype an ipc server then holds); an
    unset `vllm.host` is the loopback, the address every client of the config connects to; what the config names
    is kept."""
    run = run_config({"base_model": "m", "vllm": {"port": 8001}, "bf16": "auto", "grpo": {"sync": "ipc"}})
    assert run.trainer_dtype is None  # unresolved until the launcher (or axolotl) resolves it
    spec = spec_from(served(run))
    assert (spec.host, spec.port, spec.dtype) == (SERVER_HOST, 8001, "float32")
    assert spec_from(served(run_config({"vllm": {"host": "0.0.0.0"}, "bf16": True}))).host == "0.0.0.0"
    assert served(run_config({"bf16": True})).trainer_dtype == "bfloat16"
