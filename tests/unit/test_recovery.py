"""server/recovery.py and the client's deadline: the parts that need no vLLM server (the e2e fault tests in
tests/e2e/test_server_faults.py run the real thing). The hung server here is a real socket that accepts and
never answers (an injected fault)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from grpo_plugin.server.client import ServerError, ServerLost, VLLMServerClient
from grpo_plugin.server.recovery import RestartBudget, ServerGuard, ServerUnrecoverable


@pytest.fixture
def silent_server():
    """Listens and accepts, never answers: what a SIGSTOPped server looks like from the outside."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    conns = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join()
    for c in conns:
        c.close()
    srv.close()


def test_restart_budget_counts_within_the_window():
    now = [0.0]
    b = RestartBudget(2, 60.0, now=lambda: now[0])
    assert b.available()
    b.spend()
    now[0] = 10
    b.spend()
    assert not b.available()
    now[0] = 61  # the first restart left the window
    assert b.available()
    assert not RestartBudget(0, 60.0).available()


def test_a_hung_server_is_noticed_by_the_watch_long_before_the_request_timeout(silent_server):
    client = VLLMServerClient(silent_server, timeout=300)
    client.watch_every = 0.2
    calls = []

    def watch():
        calls.append(time.monotonic())
        return "hung (injected)" if len(calls) >= 3 else None

    client.watch = watch
    t0 = time.monotonic()
    with pytest.raises(ServerLost, match=r"POST /v1/completions .*: hung \(injected\)"):
        client.generate([[1, 2]], model="m", n=1, max_tokens=1)
    assert time.monotonic() - t0 < 5


def test_an_abandoned_request_does_not_hold_the_process_at_exit(silent_server):
    """A trainer that gave up on a request to a server that never answers (here: a socket that accepts and stays
    silent, as a user-killed server in graceful shutdown keeps our connection) exits at once when it is done,
    not after the request's own 120 s timeout."""
    import subprocess
    import sys

    child = (
        "import sys\n"
        "from grpo_plugin.server.client import ServerLost, VLLMServerClient\n"
        f"client = VLLMServerClient({silent_server!r}, timeout=120)\n"
        "client.watch_every = 0.1\n"
        "client.watch = lambda: 'gone (injected)'\n"
        "try:\n"
        "    client.generate([[1, 2]], model='m', n=1, max_tokens=1)\n"
        "except ServerLost:\n"
        "    print('abandoned', flush=True)\n"
    )
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "abandoned", out.stderr[-2000:]
    assert time.monotonic() - t0 < 30  # the interpreter did not wait for the abandoned request


def test_without_a_watch_the_request_timeout_is_the_deadline(silent_server):
    client = VLLMServerClient(silent_server, timeout=0.5)
    with pytest.raises(ServerError, match="timed out"):
        client.prompt_logprobs([1, 2], model="m")


def test_the_guard_declares_a_hang_after_server_hang_timeout(silent_server):
    client = VLLMServerClient(silent_server, timeout=300)
    client.health_timeout = 0.1
    guard = ServerGuard(client, restore=lambda: None, step=lambda: 3, servers=lambda: [], hang_timeout_s=0.5)
    assert client.watch == guard.lost_reason  # installed on the client
    assert guard.lost_reason() is None  # the first silent /health starts the clock
    time.sleep(0.6)
    assert "no answer to /health" in guard.lost_reason()


def test_a_real_error_from_a_healthy_server_is_not_a_loss_and_other_errors_pass_through(silent_server):
    client = VLLMServerClient(silent_server)
    client.healthy = lambda: True  # injected: the server answers /health
    guard = ServerGuard(client, restore=lambda: pytest.fail("no recovery for a real error"), step=lambda: 0,
                        servers=lambda: [])
    with pytest.raises(ServerError, match="HTTP 400"):
        guard.run("rollout", lambda: (_ for _ in ()).throw(ServerError("POST /v1/completions -> HTTP 400: bad")))
    with pytest.raises(KeyError):
        guard.run("rollout", lambda: {}["x"])


def test_unmanaged_server_that_never_returns_ends_with_the_command_to_run(silent_server):
    client = VLLMServerClient(silent_server)
    client.healthy = lambda: False  # injected: gone for good
    guard = ServerGuard(client, restore=lambda: None, step=lambda: 7, servers=lambda: [], wait_timeout_s=0.5)
    with pytest.raises(ServerUnrecoverable, match=r"step 7 .*did not come back within 0.5 s .*axolotl vllm-serve"):
        guard.run("rollout", lambda: (_ for _ in ()).throw(ServerError("POST /v1/completions failed")))


def test_a_disabled_guard_passes_everything_through(silent_server):
    client = VLLMServerClient(silent_server)
    guard = ServerGuard(client, restore=lambda: None, step=lambda: 0, servers=lambda: [], enabled=False)
    assert client.watch is None
    with pytest.raises(ServerError):
        guard.run("rollout", lambda: (_ for _ in ()).throw(ServerError("x")))


def _fails_on_the_link(times: int):
    """A call that fails `times` times as a dropped connection does (the push's own error wrapping it), then passes."""
    from grpo_plugin.server.client import LinkError

    left = [times]

    def call():
        if left[0]:
            left[0] -= 1
            try:
                raise LinkError("PUT /grpo/files/d/f to the vLLM server at http://b:1 failed: Connection reset")
            except LinkError as exc:
                raise RuntimeError("grpo.sync=restart (reload): the push failed") from exc
        return "pushed"
    return call


def test_a_link_fault_on_a_server_that_answers_is_recovered_without_a_restart(silent_server, capsys):
    """The call failed on the link, the server answers /health: nothing is restarted or waited for, the weights
    are put back (restore: a full push + the probe) and the call is redone; recorded as an outage of the link."""
    client = VLLMServerClient(silent_server)
    client.healthy = lambda: True  # injected: the server answers /health
    restores = []
    guard = ServerGuard(client, restore=lambda: restores.append(1) or "restored", step=lambda: 4,
                        servers=lambda: [])
    assert guard.run("rollout", _fails_on_the_link(2)) == "pushed"
    assert len(restores) == 2 and len(guard.outages) == 2
    outage = guard.outages[0]
    assert not outage.restarted and outage.servers == [] and outage.redone == ["weight push + probe", "rollout"]
    assert outage.cause.startswith("the link to the vLLM server failed: ")
    err = capsys.readouterr().err
    assert "step 4: the rollout failed on the link to the vLLM server (grpo.sync=restart (reload): the push failed)" \
        in err and "the server still answers /health, so it is not restarted" in err
    assert "link fault 2 of at most 3 in a row" in err and "recovered in" in err
    # a push: the restore IS the push (redo=False), and the count starts again once a call got through
    assert guard.run("weight push", _fails_on_the_link(1), redo=False) == "restored"
    assert guard.links.in_a_row == 0


def test_link_faults_in_a_row_past_the_bound_stop_the_run_with_the_cause(silent_server):
    client = VLLMServerClient(silent_server)
    client.healthy = lambda: True
    guard = ServerGuard(client, restore=lambda: "restored", step=lambda: 9, servers=lambda: [])
    with pytest.raises(ServerUnrecoverable, match=r"the rollout at step 9 failed on the link to the vLLM server 4 "
                                                  r"times in a row, .*the last: grpo.sync=restart .*Check the network"):
        guard.run("rollout", _fails_on_the_link(10))
    assert len(guard.outages) == 3


def test_a_link_error_on_a_server_that_does_not_answer_is_an_outage_not_a_link_fault(silent_server):
    client = VLLMServerClient(silent_server)
    client.healthy = lambda: False  # the link is still down, or the server is gone: waited for as an outage
    guard = ServerGuard(client, restore=lambda: None, step=lambda: 2, servers=lambda: [], wait_timeout_s=0.3)
    with pytest.raises(ServerUnrecoverable, match=r"did not come back within 0.3 s"):
        guard.run("weight push", _fails_on_the_link(1), redo=False)
    assert guard.links.in_a_row == 0
