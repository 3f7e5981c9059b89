"""One shared-memory file holding every weight of the server's model, and its manifest — both sides.

Server side (`export`, inside vLLM's worker): every parameter storage is copied once into
`<dir>/weights-<pid>.bin` (mapped with `torch.from_file(..., shared=True)`), then the parameters are re-pointed
at it (tied parameters stay tied), and a manifest is written atomically next to it:
`{file, nbytes, pid, model, params: {vLLM name: {dtype, shape, stride, offset, nbytes[, alias_of]}},
hf: {HF name: {source, start, rows}}}` (the HF → vLLM map from layout.py).

Trainer side (`map_manifest`): maps the same file and returns {vLLM name: tensor view}. Writing through a view
is writing the server's weights.

A second server on the same weights (`adopt`, inside its worker): waits for the first server's manifest, maps
its file and re-points its own parameters at it — its own loaded copy is freed. N servers + the trainer: one copy.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import time
from pathlib import Path

import torch

from grpo_plugin.ipc.layout import hf_layout

MANIFEST = "manifest.json"
_ALIGN = 64


def export(model, export_dir: Path, model_name: str = "", hf_config=None) -> dict:
    """Move every parameter storage of `model` into one shared file; returns the manifest (also written)."""
    export_dir.mkdir(parents=True, exist_ok=True)
    named = list(model.named_parameters(remove_duplicate=False))
    first_name: dict[int, str] = {}
    entries: dict[str, dict] = {}
    offset = 0
    for name, p in named:
        key = p.data_ptr()
        if key in first_name:
            entries[name] = dict(entries[first_name[key]], alias_of=first_name[key])
            continue
        if not p.is_contiguous():
            raise RuntimeError(f"grpo ipc export: parameter {name} is not contiguous")
        if p.device.type != "cpu":
            raise RuntimeError(f"grpo ipc export: parameter {name} is on {p.device}; only CPU is supported")
        first_name[key] = name
        nbytes = p.numel() * p.element_size()
        entries[name] = {"dtype": str(p.dtype).removeprefix("torch."), "shape": list(p.shape),
                         "stride": list(p.stride()), "offset": offset, "nbytes": nbytes}
        offset += -(-nbytes // _ALIGN) * _ALIGN
    path = export_dir / f"weights-{os.getpid()}.bin"
    buf = torch.from_file(str(path), shared=True, size=max(offset, 1), dtype=torch.uint8)
    views = {}
    with torch.no_grad():
        for name, p in named:  # copy every storage once; re-point only after all copies are done
            e = entries[name]
            if "alias_of" in e:
                continue
            view = buf[e["offset"]: e["offset"] + e["nbytes"]].view(p.dtype).view(p.shape)
            view.copy_(p.data)
            views[name] = view
        for name, p in named:
            p.data = views[entries[name].get("alias_of", name)]
    _trim()
    manifest = {"file": str(path), "nbytes": offset, "pid": os.getpid(), "model": model_name, "params": entries}
    if hf_config is not None:
        try:
            manifest["hf"] = hf_layout(hf_config, {n: e["shape"] for n, e in entries.items()})
        except ValueError as exc:  # reported to the trainer, which refuses to attach; the server still serves
            manifest["hf_error"] = str(exc)
    tmp = export_dir / f".{MANIFEST}.{os.getpid()}"
    tmp.write_text(json.dumps(manifest))
    os.replace(tmp, export_dir / MANIFEST)
    return manifest


def _trim() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # give the dropped weights' pages back


def adopt(model, export_dir: Path, timeout: float = 900.0) -> dict:
    """Make every parameter of `model` a view of the weight file another server exported into `export_dir` (its
    manifest is waited for up to `timeout` s). Any parameter whose name, dtype or shape differs is an error naming
    it (the servers must be started from one config). Returns the manifest, with this worker's pid and the
    exporter's as `owner_pid`."""
    path = export_dir / MANIFEST
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"grpo ipc: no weight file was exported into {export_dir} within {timeout:.0f} s "
                               "(the first server of grpo.num_servers exports it)")
        time.sleep(0.5)
    manifest = json.loads(path.read_text())
    views = map_manifest(manifest)
    named = list(model.named_parameters(remove_duplicate=False))
    problems = []
    for name, p in named:
        v = views.get(name)
        if v is None:
            problems.append(f"{name}: not among the first server's weights")
        elif v.dtype != p.dtype or tuple(v.shape) != tuple(p.shape):
            problems.append(f"{name}: {p.dtype} {tuple(p.shape)} here, {v.dtype} {tuple(v.shape)} shared")
    missing = sorted(set(views) - {n for n, _ in named})
    problems += [f"{n}: only in the first server's weights" for n in missing]
    if problems:
        raise RuntimeError("grpo ipc: this server's model does not match the shared weights of the first server "
                           "(start every server from one config):\n  " + "\n  ".join(problems[:20]))
    with torch.no_grad():
        for name, p in named:
            p.data = views[name]
    _trim()
    return dict(manifest, pid=os.getpid(), owner_pid=manifest["pid"])


def map_manifest(manifest: dict) -> dict[str, torch.Tensor]:
    """Trainer side: map the exported file; {vLLM name: shared view}. Aliases (tied) share one view."""
    path = Path(manifest["file"])
    if not path.exists():
        raise FileNotFoundError(
            f"{path} does not exist on this machine: grpo.sync=ipc needs the vLLM server on the same host as "
            "the trainer (and the same /dev/shm)."
        )
    size = path.stat().st_size
    if size < manifest["nbytes"]:
        raise ValueError(f"{path} holds {size} bytes, the manifest says {manifest['nbytes']}")
    buf = torch.from_file(str(path), shared=True, size=max(manifest["nbytes"], 1), dtype=torch.uint8)
    tensors, made = {}, {}
    for name, e in manifest["params"].items():
        source = e.get("alias_of", name)
        if source not in made:
            se = manifest["params"][source]
            flat = buf[se["offset"]: se["offset"] + se["nbytes"]].view(getattr(torch, se["dtype"]))
            made[source] = flat.as_strided(se["shape"], se.get("stride") or _contiguous(se["shape"]))
        tensors[name] = made[source]
    return tensors


def _contiguous(shape: list[int]) -> list[int]:
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= s
    return list(reversed(stride))
