"""Shared fixtures: a tiny local model (no hub) and ONE real vLLM-CPU server for the whole session."""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import random
import socket
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `rewards.*` import paths resolve from the repo root, as for users
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("AXOLOTL_DO_NOT_TRACK", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Under pytest-xdist (scripts/test.sh runs two workers) each worker's vLLM servers compute on a core of their own
# instead of both binding their OpenMP threads to the same cores.
# Each worker's torch (its own process and the `axolotl train` runs it starts) gets its share of the cores: with
# two workers on two cores, two OpenMP threads per process spin at every parallel region's barrier while the other
# worker holds the second core (measured: the QLoRA, tool-calling, GSM8K and code e2e runs under -n 2 took
# 284 s instead of 393 s with one thread each).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw"):
    _cores = sorted(os.sched_getaffinity(0))
    if len(_cores) > 1:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(_cores[int(_WORKER[2:]) % len(_cores)]))
    _share = len(_cores) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _share)))
    if "torch" in sys.modules:  # already loaded (its OpenMP read the environment then)
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Session-scoped vLLM servers (below). The tests that use one run on one pytest-xdist worker, so it starts once.
SHARED_SERVERS = ("vllm_server", "full_weight_server", "blind_server")


def _order(item) -> int:
    """Longest first, so that two workers end together: fault runs, then the other e2e runs, then integration
    (a module's tests keep their order), then unit tests."""
    if item.get_closest_marker("slow"):
        return 0
    kind = Path(str(item.path)).parent.name
    return {"e2e": 1, "integration": 2}.get(kind, 3)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_order)  # stable: a module's tests keep their order


@functools.cache
def _arguments(path: str) -> dict[str, set[str]]:
    """Each function of a test module (tests and fixtures) -> the names of its arguments (read with ast: nothing
    is imported)."""
    tree = ast.parse((ROOT / path).read_text())
    return {node.name: {a.arg for a in node.args.args}
            for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


def server_scope(nodeid: str) -> str:
    """Which tests must share a pytest-xdist worker (scripts/test.sh runs two):
    - an integration module's tests stay together (their servers are module-scoped fixtures), in the scope of a
      session server if one of its functions (a test or a fixture) takes one;
    - an e2e or unit test that takes a session server joins that server's scope; every other test is alone."""
    path, _, rest = nodeid.partition("::")
    funcs = _arguments(path)
    if Path(path).parent.name == "integration":
        used = sorted({name for args in funcs.values() for name in args if name in SHARED_SERVERS})
        return used[0] if used else path
    args = funcs.get(rest.split("::")[-1].split("[")[0], set())
    return next((name for name in SHARED_SERVERS if name in args), nodeid)


if importlib.util.find_spec("xdist") is not None:

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(config, log):
        """Scopes from `server_scope`, in collection order (longest first). Not `xdist_group` marks: pytest-xdist
        3.8 records a group by renaming `item._nodeid`, which pytest 9 no longer reads, so `--dist loadgroup`
        silently scheduled every test alone (each worker started every module's servers)."""
        from xdist.scheduler import LoadScopeScheduling

        class ServerScopes(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return server_scope(nodeid)

        return ServerScopes(config, log)


def axolotl_load_cfg(path):
    """axolotl's `load_cfg`, without its process-wide side effects leaking into later tests: it exports
    ACCELERATE_*/KMP_*/TOKENIZERS_* variables (which every server started afterwards inherits) and, for
    DeepSpeed configs, initialises accelerate's global state."""
    import axolotl.utils.distributed as axolotl_dist
    from accelerate.state import AcceleratorState
    from axolotl.cli.config import load_cfg

    saved = dict(os.environ)
    try:
        return load_cfg(str(path))
    finally:
        os.environ.clear()
        os.environ.update(saved)
        AcceleratorState._reset_state(reset_partial_state=True)
        axolotl_dist.distributed_state = None


# Ports for the servers tests start: below the kernel's ephemeral range (32768-60999 here), where the port an
# outgoing connection takes comes from: a port asked of the kernel with bind(0) is in that range, and another
# connection could take it in the ~30 s before the server binds it ("Address already in use"). Each pytest-xdist
# worker draws from its own share, so two workers never pick the same port.
_PORTS = range(20000, 32000)


def _port_candidates():
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    k = int(worker[2:]) if worker[2:].isdigit() else 0
    share = len(_PORTS) // 4
    lo = _PORTS.start + (k % 4) * share
    return random.Random().sample(range(lo, lo + share), 200)


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    for port in _port_candidates():
        if _is_free(port):
            return port
    raise RuntimeError("no free port in this worker's share of 20000-31999")


def free_ports(n: int) -> int:
    """The first of `n` consecutive free ports (grpo.num_servers starts servers on consecutive ports)."""
    for _ in range(200):
        first = free_port()
        if first + n - 1 > 65535:
            continue
        socks = []
        try:
            for port in range(first, first + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports found")


# One vLLM cache for every server the tests start (with or without `cache_env`), shared by both pytest-xdist workers
# and by the sessions of both stacks (the same vLLM): a server's first start on an empty cache inspects the model
# class in a subprocess of its own (~16 s of imports here, once per architecture instead of once per worker and
# session). vLLM keys each entry by its model module's content and writes it atomically.
os.environ.setdefault("VLLM_CACHE_ROOT", str(Path(tempfile.gettempdir()) / f"grpo-tests-{os.getuid()}" / "vllm"))


@pytest.fixture(scope="session")
def cache_env(tmp_path_factory):
    cache = tmp_path_factory.mktemp("inductor-cache")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
    return cache


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from grpo_plugin.demo.tiny import build_model

    return build_model(tmp_path_factory.mktemp("models") / "tiny-qwen2")


@pytest.fixture(scope="session")
def tiny_data_file(tmp_path_factory) -> Path:
    from grpo_plugin.demo.tiny import build_digit_task

    return build_digit_task(tmp_path_factory.mktemp("data") / "digits.jsonl", n=128)


def _session_server(tmp_path_factory, name: str, **spec):
    from grpo_plugin.server.process import ServerSpec, launch

    spec = ServerSpec(port=free_port(), dtype="float32", max_model_len=512, enforce_eager=True, **spec)
    server, client = launch(spec, tmp_path_factory.mktemp("logs") / f"{name}.log")
    try:
        yield server, client
    finally:
        server.stop()


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir, cache_env, tmp_path_factory):
    """A real vLLM-CPU server (runtime LoRA on: the shape `axolotl vllm-serve` starts for lora_sync), started once
    per session and stopped at the end. Integration tests and unmanaged lora_sync e2e runs share it: a run
    unloads its adapter versions at the end, and the base weights are never written."""
    yield from _session_server(tmp_path_factory, "vllm_server", model=str(tiny_model_dir), max_lora_rank=16)


@pytest.fixture(scope="session")
def full_weight_server(tiny_model_dir, cache_env, tmp_path_factory):
    """A full-weight server for unmanaged `grpo.sync: restart` e2e runs (no LoRA, the worker extension; the
    shape `axolotl vllm-serve` starts for restart), shared for the session: every run's first push reloads its
    own initial weights, so a run never sees the one before it."""
    yield from _session_server(tmp_path_factory, "full_weight_server", model=str(tiny_model_dir),
                               enable_lora=False, seed=42)


@pytest.fixture(scope="session")
def blind_server(tiny_model_dir, cache_env, tmp_path_factory):
    """(server, client): a LoRA-enabled vLLM-CPU server on another host as the trainer sees it: in a network namespace
    of its own reached over a veth pair (bench/netns.py: its address exists only on that pair, so a test can drop
    the link: `server.link(False)`) and a mount namespace of its own whose /dev/shm is a private tmpfs (it cannot read
    the trainer's sync directories). The weight-transport tests (tests/integration/test_weight_transport.py) and an
    unmanaged lora_sync e2e run share it. Needs root (CI runs as root); elsewhere its tests skip saying so."""
    import shutil
    import subprocess
    import time
    from types import SimpleNamespace

    from grpo_plugin.bench.netns import VethLink, ip
    from grpo_plugin.server.client import VLLMServerClient
    from grpo_plugin.server.process import ServerSpec, stop_tree
    from tests.e2e.hosts import available, own_mounts

    if os.geteuid() != 0 or not shutil.which("unshare") or available():
        pytest.skip("a server on a host of its own needs root, iproute2 and util-linux's unshare")
    log = tmp_path_factory.mktemp("logs") / "blind-server.log"
    with VethLink() as veth:
        spec = ServerSpec(model=str(tiny_model_dir), host=veth.peer, port=free_port(), dtype="float32",
                          max_model_len=512, enforce_eager=True)
        env = spec.env()
        env.pop("GRPO_HOST_STAGE", None)  # its /tmp stays the machine's
        argv = ["ip", "netns", "exec", veth.netns, *own_mounts(spec.command(), "grpo-blind")]
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        client = VLLMServerClient(spec.base_url, timeout=120)

        def link(up: bool) -> None:
            """The server's end of the link up or down (its address stays; packets are dropped while down)."""
            ip("-n", veth.netns, "link", "set", veth.peer_if, "up" if up else "down")

        try:
            t0 = time.monotonic()
            while not client.healthy():
                if proc.poll() is not None or time.monotonic() - t0 > 300:
                    pytest.fail(f"the namespaced vLLM server did not come up:\n{log.read_text()[-4000:]}")
                time.sleep(0.5)
            # the shape of _session_server's (server, client)
            yield SimpleNamespace(spec=spec, proc=proc, link=link, log=log), client
        finally:
            stop_tree(proc)
