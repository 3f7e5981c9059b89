"""`grpo.sync: lora_sync` — hot-swap the trained LoRA adapter into the running vLLM server.

Per push: the adapter tensors (only those, a few MB at most) are written as one safetensors file into a
directory on fast storage (/dev/shm where present; the adapter config is written once), the server reloads
that adapter in place through vLLM's own `/v1/load_lora_adapter` (`load_inplace`), and its prefix cache is
reset so no KV computed with the old adapter is reused. The next generation uses the new adapter.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from grpo_plugin.sync.base import PrefixCacheReset, SyncResult
from grpo_plugin.sync.storage import SyncDir


class LoraSync:
    mode = "lora_sync"

    def __init__(self, client, *, adapter_name: str, sync_dir: str | None = None):
        self.client = client
        self.adapter_name = adapter_name
        self.storage = SyncDir("lora", sync_dir)
        self._model = None
        self._tensors = None
        self._reset = PrefixCacheReset(client, "lora")

    needs_initial_push = True  # the adapter must exist on the server before the first rollout

    @property
    def generation_model(self) -> str:
        return self.adapter_name

    @property
    def adapter_dir(self) -> Path:
        return self.storage.path

    def prepare(self, trainer) -> None:
        model = trainer.accelerator.unwrap_model(trainer.model)
        if not hasattr(model, "peft_config"):
            raise ValueError(
                "grpo.sync=lora_sync: the trainer's model has no LoRA adapter. Set `adapter: lora` in the config."
            )
        self._model = model
        self._tensors = self._adapter_tensors(model)
        # Config once (vLLM reads adapter_config.json next to the weights); weights on every push.
        model.peft_config["default"].save_pretrained(str(self.adapter_dir))

    @staticmethod
    def _adapter_tensors(model) -> dict | None:
        """PEFT's adapter state-dict names, resolved once to the live parameters (the optimizer updates them
        in place, so each push reads current values without walking the whole model again). None if any
        entry is not a live parameter: then every push asks PEFT again."""
        from peft import get_peft_model_state_dict

        by_ptr = {p.data_ptr(): p for p in model.parameters()}
        out = {}
        for key, t in get_peft_model_state_dict(model).items():
            if t.data_ptr() not in by_ptr:
                return None
            out[key] = by_ptr[t.data_ptr()]
        return out

    def _write_weights(self) -> None:
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        tensors = self._tensors if self._tensors is not None else get_peft_model_state_dict(self._model)
        sd = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
        tmp = self.adapter_dir / "adapter_model.safetensors.tmp"
        save_file(sd, str(tmp))
        os.replace(tmp, self.adapter_dir / "adapter_model.safetensors")  # the server never sees a half-written file

    def push(self, step: int) -> SyncResult:
        """Write, then load in place with the prefix-cache reset beside it."""
        t0 = time.perf_counter()
        self._write_weights()
        self._reset.around(lambda: self.client.load_lora_adapter(self.adapter_name, str(self.adapter_dir),
                                                                 inplace=True))
        return SyncResult(step=step, sync_ms=(time.perf_counter() - t0) * 1e3)

    def close(self) -> None:
        self._reset.close()
        self.storage.close()
