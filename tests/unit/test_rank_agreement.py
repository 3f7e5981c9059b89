"""server/rank_agreement.py and the guard with several ranks: two real trainer "ranks" — two processes spawned here,
joined by a real gloo process group (torch.distributed, as accelerate joins CPU ranks) — agree on a lost server at
the points every rank reaches, recover together, and never wait for a missing peer without bound. The server is
what is stood in for (a client whose /health answers; a call or a prefetched rollout that fails as on a lost
server: the inner producer of tests/unit/test_prefetch_recovery.py); the e2e run
with a killed and a hung managed server under two ranks is in tests/e2e/test_scale_train.py."""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from types import SimpleNamespace

import pytest

from tests.conftest import free_port

WORLD = 2


def _client():
    from grpo_plugin.server.client import VLLMServerClient

    client = VLLMServerClient("http://127.0.0.1:9", timeout=5)
    client.healthy = lambda: True  # the (restarted) server answers /health
    return client


def _agree(rank: int, agreement) -> dict:
    none = agreement.any(None, "the end of the rollout (step 1)")
    one = agreement.any("gone" if rank == 1 else None, "the end of the rollout (step 2)")
    return {"none": none, "one": one}


def _guard_recovers_together(rank: int, agreement) -> dict:
    """Rank 1's rollout meets the lost server, rank 0's ended before: both recover (one restore each, which is
    collective in a real run), rank 1 redoes its call, rank 0 keeps its result."""
    from grpo_plugin.server.client import ServerLost
    from grpo_plugin.server.recovery import ServerGuard

    calls, restores = [], []
    guard = ServerGuard(_client(), restore=lambda: restores.append(agreement.any(None, "restore")) or "restored",
                        step=lambda: 2, servers=lambda: [], agreement=agreement)

    def rollout():
        calls.append(1)
        if rank == 1 and len(calls) == 1:
            raise ServerLost("the server does not answer /health after: connection refused")
        return f"rollout of rank {rank}, call {len(calls)}"

    result = guard.run("rollout", rollout)
    after = guard.run("rollout", rollout)  # the next rollout: nothing lost, nothing recovered
    return {"result": result, "after": after, "calls": len(calls), "restores": len(restores),
            "outages": [(o.step, o.during, o.cause) for o in guard.outages]}


def _prefetch_recovers_together(rank: int, agreement) -> dict:
    """trl.async_prefetch (producers/prefetch.py on axolotl's AsyncDataProducer): rank 1's rollout of step 1,
    prefetched in the background, met the lost server; rank 0's did not. Both recover when the rollout is taken
    (the background threads never do), rank 1 makes its step 1 again, rank 0 keeps its own."""
    from grpo_plugin.producers.prefetch import PrefetchingProducer
    from grpo_plugin.server.client import ServerLost
    from grpo_plugin.server.recovery import ServerGuard
    from tests.unit.test_prefetch_recovery import _Inner

    restores = []
    guard = ServerGuard(_client(), restore=lambda: restores.append(agreement.any(None, "restore")), step=lambda: 1,
                        servers=lambda: [], agreement=agreement)
    inner = _Inner(fail_steps={1} if rank == 1 else (), error=ServerLost("connection refused"))
    producer = PrefetchingProducer(inner, guard=guard)
    steps = [int(producer.produce(None, step)._data["x"][0]) for step in range(3)]
    producer.shutdown()
    return {"steps": steps, "restores": len(restores), "outages": [o.cause for o in guard.outages],
            "remade": [s for s, main in inner.calls if main]}


def _restart_refused(rank: int, agreement) -> dict:
    """Rank 0's managed server exited and it may not restart it (server_restarts: 0): every rank stops, saying
    why, none waits in a collective."""
    from grpo_plugin.server.client import ServerError, ServerLost
    from grpo_plugin.server.recovery import ServerGuard, ServerUnrecoverable

    dead = SimpleNamespace(pid=4242, proc=SimpleNamespace(poll=lambda: -9, returncode=-9),
                           log_tail=lambda n: "(the server's last lines)")
    guard = ServerGuard(_client(), restore=lambda: None, step=lambda: 5, max_restarts=0,
                        servers=lambda: [dead] if rank == 0 else [], agreement=agreement)
    error = ServerError("POST /v1/completions failed") if rank == 0 else ServerLost("connection refused")
    try:
        guard.run("rollout", lambda: (_ for _ in ()).throw(error))
    except ServerUnrecoverable as exc:
        return {"stopped": str(exc)}
    return {"stopped": None}


def _peer_missing(rank: int, agreement) -> dict:
    """Rank 1 never reaches the agreement point (it died or hangs elsewhere): rank 0 waits at most the timeout."""
    from grpo_plugin.server.rank_agreement import RanksApart

    if rank == 1:
        time.sleep(agreement.timeout_s + 1)  # comes after rank 0 gave up
        return {}
    t0 = time.monotonic()
    try:
        agreement.any(None, "the end of the weight push (step 3)")
    except RanksApart as exc:
        return {"error": str(exc), "waited": time.monotonic() - t0}
    return {"error": None}


# every scenario in one pair of processes (each spawn imports torch: ~10 s here); the one that leaves a peer
# behind comes last
SCENARIOS = ("_agree", "_guard_recovers_together", "_prefetch_recovers_together", "_restart_refused",
             "_peer_missing")
TIMEOUT_S = 5.0


def _rank_main(rank: int, port: int, out) -> None:
    try:
        import torch.distributed as dist

        import tests.unit.test_prefetch_recovery  # noqa: F401 - axolotl's import, before the agreement's clock
        from grpo_plugin.server.rank_agreement import RankAgreement

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
        dist.barrier()  # both ranks here (the default group's own, long timeout)
        agreement = RankAgreement.over_trainer(TIMEOUT_S)
        out.put((rank, {name: globals()[name](rank, agreement) for name in SCENARIOS}))
    except BaseException:  # noqa: BLE001 - reported to the test
        out.put((rank, {"crashed": traceback.format_exc()}))


@pytest.fixture(scope="module")
def ranks() -> dict[str, list[dict]]:
    """Each scenario's result on rank 0 and rank 1."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, out), daemon=True) for r in range(WORLD)]
    for p in procs:
        p.start()
    try:
        results = dict(out.get(timeout=180) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert not any("crashed" in r for r in results.values()), results
    return {name: [results[r][name] for r in range(WORLD)] for name in SCENARIOS}


def test_every_rank_hears_that_one_rank_lost_the_server(ranks):
    r0, r1 = ranks["_agree"]
    assert r0 == r1 == {"none": None, "one": "trainer rank 1: gone"}


def test_a_peer_losing_the_server_makes_every_rank_recover_and_only_the_loser_redoes_its_call(ranks):
    r0, r1 = ranks["_guard_recovers_together"]
    assert r0["restores"] == r1["restores"] == 1  # one restore, joined by both ranks
    assert r0["result"] == "rollout of rank 0, call 1"  # ended before the outage: kept
    assert r1["result"] == "rollout of rank 1, call 2"  # lost: redone after the restore
    assert (r0["calls"], r1["calls"]) == (2, 3)  # and the next rollout of each, once
    cause = "trainer rank 1: the server does not answer /health after: connection refused"
    assert r0["outages"] == r1["outages"] == [(2, "rollout", cause)]


def test_a_prefetched_rollout_lost_on_one_rank_is_recovered_by_both_and_made_again_on_that_rank_only(ranks):
    r0, r1 = ranks["_prefetch_recovers_together"]
    assert r0["steps"] == r1["steps"] == [0, 1, 2]  # every step's rollout, once, on each rank
    assert r0["restores"] == r1["restores"] == 1
    assert r0["outages"] == r1["outages"] == ["trainer rank 1: connection refused"]
    assert 1 in r1["remade"] and 1 not in r0["remade"], (r0, r1)  # step 1 made again by rank 1 alone


def test_a_restart_rank_0_may_not_make_stops_every_rank_with_its_reason(ranks):
    r0, r1 = ranks["_restart_refused"]
    assert "grpo.server_restarts is 0" in r0["stopped"] and "pid 4242" in r0["stopped"]
    assert r1["stopped"].startswith("trainer rank 0: the managed vLLM server was lost"), r1
    assert "grpo.server_restarts is 0" in r1["stopped"]


def test_a_rank_whose_peer_never_comes_stops_after_the_timeout_naming_the_point(ranks):
    r0, _ = ranks["_peer_missing"]
    assert r0["error"] and "the end of the weight push (step 3)" in r0["error"], r0
    assert "waited up to 5 s" in r0["error"] and TIMEOUT_S - 1 < r0["waited"] < TIMEOUT_S + 10, r0


@pytest.mark.parametrize("hang, per_request, server", [(60.0, 300.0, 600.0), (10.0, 60.0, 240.0)])
def test_the_agreement_outwaits_a_peer_rollout_hang_and_restart(hang, per_request, server):
    from grpo_plugin.server.rank_agreement import agreement_timeout

    assert agreement_timeout(hang, per_request, server) > max(per_request, server) + hang
