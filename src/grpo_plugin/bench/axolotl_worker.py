"""Worker extension for the sync benchmark only: ours (the in-place reload) plus axolotl's own full-weight
HTTP-sync worker methods, so both run on the SAME vLLM server in the same benchmark run.

`bench_axolotl_http_update(params)` does what axolotl's `/http_update_weights/` route does with a request
(axolotl/scripts/vllm_serve_lora.py): decode each entry with axolotl's `decode_from_http`, re-encode it with
`encode_for_ipc`, and call axolotl's worker method `http_load_weights_batch`. The route sends that call
fire-and-forget, so a failure never reaches its caller and the server keeps running on whatever was loaded;
here the failure is returned as a value for the benchmark to report (raising it out of a collective_rpc
would kill vLLM 0.32's engine, which axolotl's route does not do either).
"""

from __future__ import annotations

from grpo_plugin.in_vllm.worker_ext import GRPOWorkerExtension

try:  # axolotl <= 0.19; gone in 0.21, whose full-weight sync is NCCL only (restart.py then skips this side)
    from axolotl.scripts.vllm_worker_ext import BatchWeightSyncWorkerExtension
except ImportError:
    BatchWeightSyncWorkerExtension = object


class BenchWorkerExtension(GRPOWorkerExtension, BatchWeightSyncWorkerExtension):
    def bench_axolotl_http_update(self, params: list[dict]) -> dict:
        from axolotl.utils.weight_serde import decode_from_http, encode_for_ipc  # optional: axolotl <= 0.19

        entries = [encode_for_ipc(*decode_from_http(p)) for p in params]
        try:
            self.http_load_weights_batch(entries)
        except Exception as exc:
            return {"params": len(entries), "error": f"{type(exc).__name__}: {exc}"}
        return {"params": len(entries)}
