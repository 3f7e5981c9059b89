"""Which vLLM servers the trainer talks to, and waiting for them to answer.

One server: `trl.vllm_server_base_url`, else `trl.vllm_server_host` / `trl.vllm_server_port` (the plugin fills
them from `vllm.host` / `vllm.port`). Several: `grpo.num_servers: N` (ports `vllm_server_port` ...
`vllm_server_port + N - 1`, as `axolotl vllm-serve` and the managed servers start them) or `grpo.server_urls`.
"""

from __future__ import annotations

from urllib.parse import urlparse

from grpo_plugin.config import runtime
from grpo_plugin.server import managed
from grpo_plugin.server.client import ServerError, VLLMServerClient
from grpo_plugin.server.group import ServerGroup, replicas_of
from grpo_plugin.server.process import Progress, wait_until


def server_urls(args, settings) -> list[str]:
    """The base URL of every server, in order. `args`: the trainer's TrainingArguments; `settings`: grpo."""
    if settings.server_urls:
        return [u.rstrip("/") for u in settings.server_urls]
    if getattr(args, "vllm_server_base_url", None):
        first = args.vllm_server_base_url.rstrip("/")
        if settings.num_servers == 1:
            return [first]
        parsed = urlparse(first)
        if parsed.port is None:
            raise ValueError(f"trl.vllm_server_base_url {first!r} has no port, so grpo.num_servers: "
                             f"{settings.num_servers} cannot count ports from it. Add the port, or list the servers "
                             "in grpo.server_urls.")
        return [parsed._replace(netloc=f"{parsed.hostname}:{parsed.port + i}").geturl()
                for i in range(settings.num_servers)]
    return [runtime.server_url(args.vllm_server_host, args.vllm_server_port + i) for i in range(settings.num_servers)]


def connect(urls: list[str], timeout: float):
    """One client for one server; a ServerGroup (server/group.py) for several."""
    clients = [VLLMServerClient(u, timeout=timeout) for u in urls]
    return clients[0] if len(clients) == 1 else ServerGroup(clients)


def wait_for_servers(client, timeout: float, *, started_by_rank_0: bool = False) -> None:
    """Every server answers /health: the managed ones are watched as they start (a server that exits is an
    error with its log); others are waited for with a line saying how to start them — or, on the other ranks of a
    run with grpo.managed_server (`started_by_rank_0`), that rank 0 is starting them."""
    procs = managed.servers()
    clients = replicas_of(client)
    hint = ("rank 0 is starting it (grpo.managed_server)" if started_by_rank_0
            else "not up yet — start it with `axolotl vllm-serve <config.yaml>`")
    for i, c in enumerate(clients):
        if len(procs) == len(clients):
            procs[i].wait_healthy(timeout, c.healthy, Progress(f"starting vLLM on {c.base_url}"))
            continue
        if c.healthy():
            continue
        waited = wait_until(c.healthy, timeout, Progress(f"waiting for the vLLM server at {c.base_url}"),
                            lambda _: hint, ready="connected", poll=1.0)
        if waited is None:
            more = (f" (server {i + 1} of {len(clients)}: `axolotl vllm-serve` starts grpo.num_servers of them on "
                    "consecutive ports)" if len(clients) > 1 else "")
            if started_by_rank_0:
                raise ConnectionError(
                    f"No vLLM server answered at {c.base_url}/health within {timeout:.0f} s{more}: rank 0 starts "
                    "it (grpo.managed_server); its output and the server log (vllm_server.log in output_dir) say "
                    "why it is not up. Raise grpo.server_timeout if it is still starting.")
            raise ConnectionError(
                f"No vLLM server answered at {c.base_url}/health within {timeout:.0f} s{more}. Start it with "
                "`axolotl vllm-serve <config.yaml>` in another terminal, or set `grpo.managed_server: true` "
                "so `axolotl train` starts it."
            )


def require_whole_prefills(client) -> None:
    """grpo.seeded_sampling: a vLLM-CPU server must not split a prefill across engine steps. After a partial prefill
    vLLM rewinds a seeded request's generator with CUDA-only offsets, and the CPU engine stops on it (the plugin's
    servers start without chunked prefill: server/process.py)."""
    for c in replicas_of(client):
        config = c.server_info().get("vllm_config") or {}
        device = str((config.get("device_config") or {}).get("device", ""))
        chunked = (config.get("scheduler_config") or {}).get("enable_chunked_prefill")
        if "cpu" in device.lower() and chunked is not False:
            raise ServerError(
                f"grpo.seeded_sampling: the vLLM-CPU server at {c.base_url} runs chunked prefill (its "
                f"scheduler_config.enable_chunked_prefill is {chunked!r}), which stops its engine on a seeded request "
                "whose prefill it splits. Start it with `axolotl vllm-serve <config.yaml>` (the same config: it turns "
                "chunked prefill off), or pass --no-enable-chunked-prefill --max-num-batched-tokens <max_model_len>.")
