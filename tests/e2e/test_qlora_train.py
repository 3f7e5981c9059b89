"""QLoRA and 8-bit bases through `axolotl train` on the shared session server (tests/conftest.py `vllm_server`,
as if started with `axolotl vllm-serve`): the server serves the trainer's dequantized base, every adapter push is
verified, the reward rises, and the server gets its own checkpoint back when the run ends."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from grpo_plugin import probe
from tests.e2e.test_axolotl_train import quickstart, train

pytestmark = pytest.mark.e2e

BASES = {  # the quickstart's base (4-bit) and the 8-bit variant its header names
    "nf4": {},
    "int8": {"adapter": "lora", "load_in_4bit": False, "load_in_8bit": True},
}


@pytest.mark.parametrize("base", sorted(BASES))
def test_quantized_base_quickstart_learns_with_every_sync_verified(base, tmp_path, tiny_model_dir, tiny_data_file,
                                                                   cache_env, vllm_server):
    _, client = vllm_server
    probe_ids = list(range(40, 90))
    served = client.base_model()
    before = client.prompt_logprobs(probe_ids, model=served)
    steps = 30
    path, cfg = quickstart(tmp_path, tiny_model_dir, tiny_data_file, config="quickstart_qlora.yaml",
                           server=vllm_server, max_steps=steps, **BASES[base])
    proc = train(path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    kind = "4-bit nf4, double quantization" if base == "nf4" else "8-bit (LLM.int8)"
    assert f"the server now serves the trainer's {kind} base, dequantized" in log
    out = Path(cfg["output_dir"])
    recs = [json.loads(x) for x in (out / "grpo_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(1, steps + 1))
    summary = json.loads((out / "grpo_summary.json").read_text())
    assert summary["all_syncs_verified"] is True and summary["num_syncs"] == steps
    diffs = [r["sync_logprob_diff"] for r in recs]
    # nf4: the fp32 tolerance (measured ~5e-7: exact up to kernel order); 8-bit: axolotl loads an 8-bit base in
    # fp16, so the fp16 tolerance applies (measured ~2e-3 against this fp32 server)
    assert all(d is not None and d <= (1e-4 if base == "nf4" else 1e-2) for d in diffs), diffs
    assert summary["reward_mean_last_20pct"] > summary["reward_mean_first_20pct"] + 0.2, summary
    assert not re.search(r"could not reload the server's own checkpoint", log)
    # the shared server serves its own checkpoint again, as before the run
    after = client.prompt_logprobs(probe_ids, model=served)
    assert probe.logprob_diff(after, before)[1] == 0.0
