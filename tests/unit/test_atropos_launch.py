"""The Atropos launcher's watch (atropos/launch.py): what it started that ends is started again, within bounds;
real processes, no servers."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import psutil
import pytest

from grpo_plugin.atropos.launch import MAX_RESTARTS, Launch, LaunchError


def _launch(tmp_path) -> Launch:
    return Launch(Path("cfg.yaml"), {"output_dir": str(tmp_path)}, None, [])


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
