"""`grpo.sync: lora_sync` — hot-swap the trained LoRA adapter into the running vLLM server.

Per push: the adapter tensors (only those, a few MB at most) are written as one safetensors file into a new
version directory on fast storage (/dev/shm where present), and the server loads it under a NEW name,
`<adapter_name>-v<N>`, through vLLM's own `/v1/load_lora_adapter`; generation requests name that version. The
version before it stays loaded (a request admitted just before the push may still name it); the one before that
is unloaded and its directory removed — once no rollout holds a lease on it (sync/gate.py; with
`trl.async_prefetch` a prefetched rollout may still sample with it): a busy version is retired at a later push.
`keep` versions stay loaded: `grpo.max_policy_lag` + 1, at least 2.

Why a new name per version and not a reload in place: vLLM re-reads an adapter that was reloaded in place from
disk on every request (vLLM PR #41482), and it keys its prefix cache on the adapter, so a new name also makes the
prefix-cache reset unnecessary (no KV computed with older weights can match a new adapter).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from pathlib import Path

from peft import get_peft_model_state_dict
from safetensors.torch import save_file

from grpo_plugin.config.storage import SyncDir
from grpo_plugin.server.client import ServerError
from grpo_plugin.sync.base import SyncResult
from grpo_plugin.sync.gate import PolicyGate

LOG = logging.getLogger("grpo_plugin")
CONFIG = "adapter_config.json"


class LoraSync:
    mode = "lora_sync"
    needs_initial_push = True  # the adapter must exist on the server before the first rollout
    starts_server = False
    writes_in_place = False  # every push is a new adapter name; rollouts on older versions go on
    hands_files = True  # each version's adapter directory
    reads = "trainable"  # the adapter: under ZeRO-3 only it is gathered for a push (sync/ranks.py)

    def __init__(self, client, *, adapter_name: str, sync_dir: str | None = None, gate: PolicyGate | None = None,
                 keep: int = 2, serve_last_after_close: bool = False, announce: bool = False):
        """`serve_last_after_close`: others generate on the server too (Atropos environments, which the launcher
        stops after the trainer): the last version stays loaded when the run ends, so their requests keep
        being answered by the final policy instead of failing until they are stopped. `announce`: tell the server
        each new version's name (`/grpo/policy`), so that OpenAI-route requests naming the base model sample the
        policy (in_vllm/routes.py); without other clients no fence is needed for it (the server fence announces
        otherwise)."""
        self.client, self.announce = client, announce
        self.serve_last_after_close = serve_last_after_close
        self.adapter_name = adapter_name
        self.gate = gate or PolicyGate()
        self.keep = max(2, keep)  # versions loaded at once: the newest, and those rollouts may still sample with
        self.storage = SyncDir("lora", sync_dir)
        self._model = None
        self._tensors = None
        self._version = 0
        self._loaded: list[str] = []  # names of the versions the server holds, oldest first

    @property
    def generation_model(self) -> str:
        if not self._loaded:
            raise RuntimeError("grpo.sync=lora_sync: no adapter version has been pushed to the server yet")
        return self._loaded[-1]

    @property
    def adapter_dir(self) -> Path:
        return self.storage.path

    def _version_dir(self, name: str) -> Path:
        return self.adapter_dir / name

    def prepare(self, handle) -> None:
        model = handle.unwrap()
        if not hasattr(model, "peft_config"):
            raise ValueError(
                "grpo.sync=lora_sync: the trainer's model has no LoRA adapter. Set `adapter: lora` in the config."
            )
        self._model = model
        self._tensors = self._adapter_tensors(model)
        # The config once (vLLM reads adapter_config.json next to the weights); each version links to it.
        model.peft_config["default"].save_pretrained(str(self.adapter_dir))

    @staticmethod
    def _adapter_tensors(model) -> dict | None:
        """PEFT's adapter state-dict names, resolved once to the live parameters (the optimizer updates them
        in place, so each push reads current values without walking the whole model again). None if any
        entry is not a live parameter: then every push asks PEFT again."""
        by_ptr = {p.data_ptr(): p for p in model.parameters()}
        out = {}
        for key, t in get_peft_model_state_dict(model).items():
            # sharded (ZeRO-3: an empty placeholder; FSDP2: a DTensor), gathered only around a push: no live
            # full tensor to keep
            if hasattr(t, "to_local") or t.numel() == 0 or t.data_ptr() not in by_ptr:
                return None
            out[key] = by_ptr[t.data_ptr()]
        return out

    def _write_weights(self, target: Path, full: dict | None = None) -> None:
        """A complete adapter directory the server has never seen: the weights and a link to the config. `full`:
        the model's gathered state dict (FSDP2), the adapter is picked out of it."""
        if full is not None:
            tensors = get_peft_model_state_dict(self._model, state_dict=full)
        else:
            tensors = self._tensors if self._tensors is not None else get_peft_model_state_dict(self._model)
        target.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()},
                  str(target / "adapter_model.safetensors"))
        if not (target / CONFIG).exists():
            try:
                os.link(self.adapter_dir / CONFIG, target / CONFIG)
            except OSError:  # a file system without hard links
                shutil.copyfile(self.adapter_dir / CONFIG, target / CONFIG)

    def push(self, step: int, tensors: dict | None = None) -> SyncResult:
        """Write the new version, load it under its own name, then retire the version before the previous one."""
        t0 = time.perf_counter()
        self._version += 1
        name = f"{self.adapter_name}-v{self._version}"
        target = self._version_dir(name)
        self._write_weights(target, tensors)
        try:
            self.client.load_lora_adapter(name, str(target), inplace=False)
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        self._loaded.append(name)
        if self.announce:
            self.client.set_policy(step, name)
        for old in self._loaded[: -self.keep]:
            if not self.gate.in_use(old):  # a rollout still sampling with it keeps it until a later push
                self._loaded.remove(old)
                self._retire(old)
        return SyncResult(step=step, sync_ms=(time.perf_counter() - t0) * 1e3)

    def server_restarted(self) -> None:
        """A fresh server holds no adapter: drop our versions (files included) without asking it to unload."""
        for name in self._loaded:
            shutil.rmtree(self._version_dir(name), ignore_errors=True)
        self._loaded.clear()

    def _retire(self, name: str) -> None:
        try:
            self.client.unload_lora_adapter(name)
        except ServerError as exc:  # the server keeps an idle adapter: its LRU cache evicts it when full
            LOG.warning("grpo_plugin: lora_sync could not unload %s from the server: %s", name, exc)
        shutil.rmtree(self._version_dir(name), ignore_errors=True)

    def close(self) -> None:
        """Unload what this run loaded (a long-lived server would otherwise list it forever), the last version
        aside when others still generate with it (`serve_last_after_close`); a server that is gone or slow is not
        waited for."""
        last = self._loaded[-1:] if self.serve_last_after_close else []
        if self.announce and self._loaded:  # base-named requests sample the base model again
            with contextlib.suppress(ServerError):
                self.client.set_policy(self._version, None)
        for name in self._loaded:
            if name not in last:
                with contextlib.suppress(ServerError):
                    self.client.unload_lora_adapter(name, timeout=5)
        if last:
            LOG.warning("grpo_plugin: lora_sync: the final adapter %s stays loaded on the server for the "
                        "environments still generating; it goes when the server stops", last[0])
        self._loaded.clear()
        self.storage.close()
