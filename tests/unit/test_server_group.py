"""Several servers without vLLM: how prompts are shared out, what the summary says per server, which servers a
recovery restarts, how a second ipc server adopts the first one's weight file, and the config rules. The e2e
runs with real servers are tests/e2e/test_scale_train.py; here the servers' faults and replies are injected."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from grpo_plugin.config.lookups import run_config
from grpo_plugin.reporting.metrics import server_summary
from grpo_plugin.server.client import Completion, ServerError, VLLMServerClient
from grpo_plugin.server.group import ServerGroup, replicas_of, shares
from grpo_plugin.server.recovery import ServerGuard


@pytest.mark.parametrize("n_prompts,n_servers", [(0, 2), (1, 2), (4, 2), (5, 2), (7, 3), (3, 4), (64, 5)])
def test_shares_cover_every_prompt_once_in_order_and_balanced(n_prompts, n_servers):
    for offset in range(n_servers):
        ranges = shares(n_prompts, n_servers, offset)
        assert len(ranges) == n_servers
        assert [i for r in ranges for i in r] == list(range(n_prompts))  # contiguous, in order, each once
        sizes = [len(r) for r in ranges]
        assert max(sizes) - min(sizes) <= 1


def test_the_server_that_gets_the_extra_prompt_rotates():
    assert [len(r) for r in shares(1, 2, 0)] == [1, 0]
    assert [len(r) for r in shares(1, 2, 1)] == [0, 1]
    assert [len(r) for r in shares(5, 3, 2)] == [2, 1, 2]


class _Replica(VLLMServerClient):
    """A server stand-in: answers generate() with its own index in every token, or raises `fail`."""

    def __init__(self, url: str, index: int, fail: Exception | None = None):
        super().__init__(url)
        self.index, self.fail, self.calls = index, fail, []

    def generate(self, prompts, *, model, n, **kw):
        self.calls.append([p[0] for p in prompts])
        if self.fail is not None:
            raise self.fail
        return [[Completion([p[0], self.index], [0.0, 0.0], "stop") for _ in range(n)] for p in prompts]

    def reset_prefix_cache(self):
        self.calls.append("reset")
        if self.fail is not None:
            raise self.fail


def test_generate_splits_by_whole_prompt_and_returns_in_order():
    a, b = _Replica("http://a:1", 0), _Replica("http://b:2", 1)
    group = ServerGroup([a, b])
    prompts = [[10], [11], [12], [13], [14]]
    out = group.generate(prompts, model="m", n=3)
    assert [g[0].token_ids[0] for g in out] == [10, 11, 12, 13, 14]  # prompt order kept
    assert all(len(g) == 3 and len({c.server for c in g}) == 1 for g in out)  # a group stays on one server
    assert a.calls == [[10, 11, 12]] and b.calls == [[13, 14]]
    assert [c.server for g in out for c in g[:1]] == [0, 0, 0, 1, 1]
    assert all(c.token_ids[1] == c.server for g in out for c in g)  # `server` says who sampled it
    out = group.generate([[20]], model="m", n=1)  # the next call starts the remainder on the other server
    assert b.calls[-1] == [20] and out[0][0].server == 1


def test_a_failure_on_one_server_is_raised_naming_it_after_every_server_answered():
    a, b = _Replica("http://a:1", 0), _Replica("http://b:2", 1, fail=ServerError("POST /reset_prefix_cache -> 500"))
    group = ServerGroup([a, b])
    with pytest.raises(ServerError, match=r"\[server http://b:2\] POST /reset_prefix_cache -> 500"):
        group.reset_prefix_cache()
    assert a.calls == ["reset"]  # the healthy server got the call too
    with pytest.raises(ServerError, match="http://b:2"):
        group.generate([[1], [2]], model="m", n=1)


def test_the_group_refuses_one_server_a_duplicate_and_a_single_prompt_logprobs():
    with pytest.raises(ValueError, match="two or more"):
        ServerGroup([_Replica("http://a:1", 0)])
    with pytest.raises(ValueError, match="listed twice"):
        ServerGroup([_Replica("http://a:1", 0), _Replica("http://a:1", 1)])
    group = ServerGroup([_Replica("http://a:1", 0), _Replica("http://b:2", 1)])
    with pytest.raises(TypeError, match="ask each server"):
        group.prompt_logprobs([1, 2], model="m")
    assert [c.base_url for c in replicas_of(group)] == ["http://a:1", "http://b:2"]
    assert replicas_of(group.replicas[0]) == [group.replicas[0]]
    fork = group.fork()
    assert fork.urls == group.urls and fork.replicas[0].session is not group.replicas[0].session


def test_server_summary_counts_rollouts_syncs_and_verdicts_per_server():
    records = [
        {"step": 1, "sync_ms": 5.0, "sync_logprob_diff": 2e-6, "sync_server_diffs": [1e-6, 2e-6],
         "server_rows": [16, 16]},
        {"step": 2, "sync_ms": 5.0, "sync_logprob_diff": 3e-4, "sync_server_diffs": [1e-6, 3e-4],
         "server_rows": [8, 24]},
        {"step": 3, "sync_ms": 0.0, "sync_logprob_diff": None, "server_rows": [32, 0]},
    ]
    out = server_summary(records, ["http://a:1", "http://b:2"], tolerance=1e-4, transports=["shared", "network"])
    assert out == [{"url": "http://a:1", "rollouts": 56, "syncs": 2, "syncs_verified": 2, "weight_transport": "shared"},
                   {"url": "http://b:2", "rollouts": 40, "syncs": 2, "syncs_verified": 1,
                    "weight_transport": "network"}]
    assert server_summary(records, ["http://a:1", "http://b:2"], tolerance=None)[0]["syncs_verified"] == 0


class _Proc:
    """A managed server stand-in: records stop / restart; `exited` injects a dead process."""

    def __init__(self, port: int, depends_on=None, exited: bool = False):
        self.spec = SimpleNamespace(port=port)
        self.depends_on, self.pid, self.events = depends_on, 1000 + port, []
        self.proc = SimpleNamespace(poll=lambda: 137 if self.exited else None, returncode=137)
        self.exited = exited

    def stop(self, timeout=30.0):
        self.events.append("stop")

    def restart(self):
        self.events.append("restart")
        self.exited = False

    def wait_healthy(self, timeout, healthy, progress=None):
        self.events.append("healthy")
        return 0.0

    def log_tail(self, n=40):
        return ""


def _group_with(health: list[bool]) -> ServerGroup:
    clients = [VLLMServerClient(f"http://127.0.0.1:{9000 + i}") for i in range(len(health))]
    for c, ok in zip(clients, health):
        c.healthy = (lambda ok=ok: ok)
    return ServerGroup(clients)


def test_recovery_restarts_only_the_lost_server_and_restores_all():
    group = _group_with([True, True, True])
    procs = [_Proc(9000), _Proc(9001, exited=True), _Proc(9002)]
    restored = []
    guard = ServerGuard(group, restore=lambda: restored.append(1) or "ok", step=lambda: 5, servers=lambda: procs)
    assert "pid 10001" in guard.lost_reason()
    calls = iter([ServerError("POST /v1/completions failed"), "done"])

    def call():
        x = next(calls)
        if isinstance(x, Exception):
            raise x
        return x

    assert guard.run("rollout", call) == "done"
    assert procs[1].events == ["stop", "restart", "healthy"] and procs[0].events == procs[2].events == []
    assert restored == [1]
    (outage,) = guard.new_outages()
    assert outage["servers"] == ["http://127.0.0.1:9001"] and outage["restarted"]


def test_recovery_of_the_server_whose_ipc_file_others_map_restarts_them_too():
    group = _group_with([False, True])
    owner = _Proc(9000, exited=True)
    procs = [owner, _Proc(9001, depends_on=owner)]
    guard = ServerGuard(group, restore=lambda: None, step=lambda: 1, servers=lambda: procs)
    guard.recover("weight push", "gone", redo=False)
    assert procs[0].events == procs[1].events == ["stop", "restart", "healthy"]


def test_unmanaged_servers_are_waited_for_by_url():
    group = _group_with([True, False])
    guard = ServerGuard(group, restore=lambda: None, step=lambda: 2, servers=lambda: [], wait_timeout_s=0.3)
    with pytest.raises(Exception, match=r"http://127.0.0.1:9001 was lost .* did not come back within 0.3 s"):
        guard.recover("rollout", "gone")


def test_a_second_server_adopts_the_first_servers_file_and_frees_its_own(tmp_path):
    from grpo_plugin.ipc.shm import adopt, export

    torch.manual_seed(0)
    first = torch.nn.Linear(8, 4)
    second = torch.nn.Linear(8, 4)  # other values: its own load
    export(first, tmp_path, model_name="m")
    result = {}
    t = threading.Thread(target=lambda: result.update(adopt(second, tmp_path, timeout=10)))
    t.start()
    t.join(20)
    assert result["owner_pid"] == result["pid"]  # (same process here) both pids recorded
    with torch.no_grad():
        first.weight.mul_(2.0)  # a write through the first mapping ...
    assert torch.equal(second.weight, first.weight)  # ... is what the second computes with
    assert second.weight.data_ptr() != first.weight.data_ptr()  # two mappings of one file


def test_adopting_a_different_model_names_each_mismatch(tmp_path):
    from grpo_plugin.ipc.shm import adopt, export

    export(torch.nn.Linear(8, 4), tmp_path, model_name="m")
    with pytest.raises(RuntimeError, match=r"weight: torch.float32 \(4, 6\) here, torch.float32 \(4, 8\) shared"):
        adopt(torch.nn.Linear(6, 4), tmp_path, timeout=5)
    with pytest.raises(TimeoutError, match="no weight file was exported"):
        adopt(torch.nn.Linear(8, 4), tmp_path / "empty", timeout=0.5)


def test_a_watch_that_asks_every_server_while_every_server_is_busy_does_not_deadlock():
    """The liveness watch (server/recovery.py) runs inside a call in flight and asks every server's /health:
    with a pool as wide as the group, both workers waited on health checks that could never run (a training run
    hung at step 0 this way)."""
    group = _group_with([True, True])
    seen = []

    class _Busy(_Replica):
        def generate(self, prompts, *, model, n, **kw):
            seen.append(group.healthy())  # what the watch does while the request waits
            return super().generate(prompts, model=model, n=n, **kw)

    group.replicas = [_Busy("http://a:1", 0), _Busy("http://b:2", 1)]
    for c in group.replicas:
        c.healthy = lambda: True
    done = threading.Event()
    threading.Thread(target=lambda: (group.generate([[1], [2]], model="m", n=1), done.set()), daemon=True).start()
    assert done.wait(10) and seen == [True, True]


def test_each_server_gets_its_own_gpus_and_too_few_is_an_error_naming_the_count():
    from grpo_plugin.server.process import ServerSpec, ServerStartError, device_slices

    assert device_slices(["0", "1", "2", "3"], 2, 2) == ["0,1", "2,3"]
    assert device_slices(["4", "5", "6"], 3, 1) == ["4", "5", "6"]
    assert device_slices(["0", "1", "2", "3", "4"], 2, 2) == ["0,1", "2,3"]  # a spare GPU stays unused
    with pytest.raises(ServerStartError, match=r"2 servers x vllm.tensor_parallel_size 2 need 4 GPUs, but 3 are "
                                               r"visible \(0,1,2\)"):
        device_slices(["0", "1", "2"], 2, 2)
    env = ServerSpec(model="m", visible_devices="2,3").env(base={})
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert "CUDA_VISIBLE_DEVICES" not in ServerSpec(model="m").env(base={})


def test_num_servers_gives_consecutive_ports_and_ipc_servers_map_the_first(monkeypatch):
    from grpo_plugin.server import process

    cfg = {"base_model": "m", "vllm": {"port": 8100}, "grpo": {"sync": "ipc", "num_servers": 3}}
    specs = process.specs_from(run_config(cfg))
    assert [s.port for s in specs] == [8100, 8101, 8102] and all(s.ipc for s in specs)
    assert all(s.visible_devices is None for s in specs)  # no CUDA here: nothing to split
    env = specs[1].env(base={}, ipc_export="/dev/shm/x", ipc_share=True)
    assert env["GRPO_IPC_EXPORT"] == "/dev/shm/x" and env["GRPO_IPC_SHARE"] == "1"
    assert "GRPO_IPC_SHARE" not in specs[0].env(base={"GRPO_IPC_SHARE": "1"}, ipc_export="/dev/shm/x")


@pytest.mark.parametrize("block,message", [
    ({"server_urls": ["http://a:8000", "http://a:8000"]}, "lists a server twice"),
    ({"server_urls": ["a:8000"]}, r"must look like http://HOST:PORT"),
    ({"server_urls": ["http://a:8000"], "num_servers": 2}, "keep one"),
    ({"server_urls": ["http://a:8000", "http://b:8000"], "managed_server": True}, "starts them itself"),
    ({"sync": "ipc", "server_urls": ["http://127.0.0.1:8000", "http://10.0.0.2:8000"]}, r"\['http://10.0.0.2:8000'\] "
                                                                                         "are elsewhere"),
    ({"num_servers": 2, "atropos": {}}, "Atropos environments generate on one server"),
    ({"num_servers": 0}, "greater than or equal to 1"),
])
def test_server_settings_refuse_what_cannot_work_saying_why(block, message):
    from pydantic import ValidationError

    from grpo_plugin.config.schema import GRPOSettings

    with pytest.raises(ValidationError, match=message):
        GRPOSettings(**block)


def test_server_urls_and_num_servers_say_how_many_servers_and_where():
    from grpo_plugin.config.schema import GRPOSettings
    from grpo_plugin.server.connect import server_urls

    args = SimpleNamespace(vllm_server_base_url=None, vllm_server_host="0.0.0.0", vllm_server_port=8000)
    assert server_urls(args, GRPOSettings()) == ["http://127.0.0.1:8000"]
    assert server_urls(args, GRPOSettings(num_servers=2)) == ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]
    urls = GRPOSettings(server_urls=["http://node1:8000/", "http://node2:8000"])
    assert urls.servers == 2 and server_urls(args, urls) == ["http://node1:8000", "http://node2:8000"]
    based = SimpleNamespace(vllm_server_base_url="http://h:9000", vllm_server_host=None, vllm_server_port=None)
    assert server_urls(based, GRPOSettings(num_servers=2)) == ["http://h:9000", "http://h:9001"]
    portless = SimpleNamespace(vllm_server_base_url="http://h", vllm_server_host=None, vllm_server_port=None)
    with pytest.raises(ValueError, match="has no port"):
        server_urls(portless, GRPOSettings(num_servers=2))


def test_core_slices_give_each_server_its_own_cores():
    from grpo_plugin.server.process import ServerSpec, core_slices

    assert core_slices([0, 1], 2) == ["0", "1"]
    assert core_slices([3, 0, 1, 2, 4], 2) == ["0,1,2", "3,4"]
    assert core_slices([0], 2) == ["0", "0"]  # more servers than cores: they share
    env = ServerSpec(model="m", cpu_bind="1").env(base={})
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and env["OMP_NUM_THREADS"] == "1" and env["OMP_PLACES"] == "{1}"


def test_a_user_core_binding_is_left_alone(monkeypatch):
    from grpo_plugin.server import process

    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-1|2-3")
    specs = process.specs_from(run_config({"base_model": "m", "grpo": {"num_servers": 2}}))
    assert [s.cpu_bind for s in specs] == [None, None]
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND")
    two = run_config({"base_model": "m", "grpo": {"num_servers": 2}})
    assert len({s.cpu_bind for s in process.specs_from(two)}) == 2


@pytest.mark.parametrize("rank_0_starts_it", [False, True])
def test_waiting_for_a_server_says_who_starts_it(rank_0_starts_it, capsys):
    """A rank other than 0 of a managed-server run waits for the server rank 0 starts: its lines say so, not
    `axolotl vllm-serve` (what a user who starts the server in another terminal reads)."""
    from grpo_plugin.server.client import VLLMServerClient
    from grpo_plugin.server.connect import wait_for_servers
    from tests.conftest import free_port

    client = VLLMServerClient(f"http://127.0.0.1:{free_port()}", timeout=1.0)  # nothing listens there
    with pytest.raises(ConnectionError) as err:
        wait_for_servers(client, 0.5, started_by_rank_0=rank_0_starts_it)
    said = capsys.readouterr().err + str(err.value)
    assert ("rank 0 is starting it (grpo.managed_server)" in said) is rank_0_starts_it, said
    assert ("rank 0 starts it" in str(err.value)) is rank_0_starts_it
    assert ("axolotl vllm-serve" in said) is not rank_0_starts_it, said


def test_a_busy_server_that_misses_one_health_answer_is_not_restarted_with_the_hung_one():
    """The hung server (never answers) is restarted; the other one, busy generating, misses one /health answer
    right when the hang is declared and answers the next: it keeps its process."""
    group = _group_with([False, True])
    busy = iter([True, False])  # answers while the hang is timed, misses one when the guard recovers, then answers
    group.replicas[1].healthy = lambda: next(busy, True)
    procs = [_Proc(9000), _Proc(9001)]
    guard = ServerGuard(group, restore=lambda: "ok", step=lambda: 14, servers=lambda: procs, hang_timeout_s=0.2)
    assert guard.lost_reason() is None  # the first silence starts server 0's clock
    time.sleep(0.3)
    assert guard.lost_reason().startswith("http://127.0.0.1:9000: no answer to /health for")
    guard.recover("rollout", "hung", redo=False)
    assert procs[0].events == ["stop", "restart", "healthy"] and procs[1].events == []
    (outage,) = guard.new_outages()
    assert outage["servers"] == ["http://127.0.0.1:9000"]


def test_after_a_failed_call_a_server_missing_health_twice_is_the_lost_one():
    group = _group_with([True, True])
    blink = iter([False])  # misses the first /health only
    group.replicas[0].healthy = lambda: next(blink, True)
    group.replicas[1].healthy = lambda: False  # gone
    procs = [_Proc(9000), _Proc(9001)]
    guard = ServerGuard(group, restore=lambda: None, step=lambda: 2, servers=lambda: procs)
    guard.recover("rollout", "POST failed")
    assert procs[0].events == [] and procs[1].events == ["stop", "restart", "healthy"]


def test_a_loss_reported_when_every_server_serves_again_restarts_none_and_restores():
    """A hang that ended by itself (or one already recovered): nothing is lost now, so no server is restarted (it
    used to restart every one); the weights are pushed and verified again and the call redone."""
    group = _group_with([True, True])
    procs = [_Proc(9000), _Proc(9001)]
    restored = []
    guard = ServerGuard(group, restore=lambda: restored.append(1) or "ok", step=lambda: 4, servers=lambda: procs)
    assert guard.recover("rollout", "no answer to /health for 14 s", redo=False) == "ok"
    assert procs[0].events == procs[1].events == [] and restored == [1]
    (outage,) = guard.new_outages()
    assert outage["servers"] == [] and not outage["restarted"]
