"""QLoRA and 8-bit bases, with the memory-lean optimizers a QLoRA user picks, through `axolotl train` on the shared
session server (tests/conftest.py, as if started with `axolotl vllm-serve`): the server serves the trainer's
dequantized base, every adapter push is verified, the reward rises, and the server gets its own checkpoint back
when the run ends."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from grpo_plugin.sync import probe
from tests.e2e.test_axolotl_train import quickstart, train

pytestmark = pytest.mark.e2e

# the quickstart's base (4-bit) and the 8-bit variant its header names, each with a memory-lean optimizer a
# QLoRA user picks (bitsandbytes' paged and 8-bit AdamW run on CPU too: without paging there)
BASES = {
    "nf4": {"optimizer": "paged_adamw_8bit"},  # the QLoRA paper's optimizer
    "int8": {"adapter": "lora", "load_in_4bit": False, "load_in_8bit": True, "optimizer": "adamw_bnb_8bit"},
}


@pytest.mark.parametrize("base", sorted(BASES))
def test_quantized_base_quickstart_learns_with_every_sync_verified(base, tmp_path, tiny_model_dir, tiny_data_file,
                                                                   cache_env, vllm_server):
    _, client = vllm_server
    probe_ids = list(range(40, 90))
    served = client.base_model()
    before = client.prompt_logprobs(probe_ids, model=served)
    steps = 12  # the reward takes off around steps 3-7 (a 4-bit step is ~5 s of CPU here: no more than it takes)
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
    expected = {"nf4": "bitsandbytes AdamW 8-bit paged", "int8": "bitsandbytes AdamW 8-bit"}[base]
    assert summary["optimizer"] == expected, summary["optimizer"]
    assert not re.search(r"could not reload the server's own checkpoint", log)
    # the shared server serves its own checkpoint again, as before the run
    after = client.prompt_logprobs(probe_ids, model=served)
    assert probe.logprob_diff(after, before)[1] == 0.0


# Adafactor, the memory-lean choice for full fine-tuning, trains the GSM8K run (tests/e2e/test_gsm8k_train.py).
