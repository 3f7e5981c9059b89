"""Inside each vLLM worker: the base a delta push applies to (`grpo.delta_anchor_every`, sync/delta_push.py).

After a full push the trainer marks as an anchor, the worker keeps that checkpoint's tensors on CPU (checkpoint
naming, the file's dtype: one copy of the model) with the anchor's digest (delta/chain.py). A delta is applied only
when it names that digest as its base and the file read here moves the digest to the one the trainer computed; it
is checked whole before a bit is written (DeltaRefused otherwise: the held base stays as it was). The rebuilt full
tensors are then loaded by the worker extension exactly as a full push's are (vLLM's `reload_weights`, from the
tensors instead of the file, and the same refresh), so the served weights are bit-identical to a full push.
"""

from __future__ import annotations

from pathlib import Path


class DeltaRefused(RuntimeError):
    """This worker does not hold the base the delta is for, or the delta does not fit it: nothing applied."""


class HeldBase:
    def __init__(self):
        self.tensors: dict | None = None
        self.digest: str | None = None

    def hold(self, weights_dir: str, digest: str) -> dict:
        """Keep the checkpoint in `weights_dir` (the one just reloaded) as the base of `digest`."""
        from safetensors.torch import load_file

        self.drop()
        tensors = {}
        for path in sorted(Path(weights_dir).glob("*.safetensors")):
            tensors.update(load_file(str(path)))
        self.tensors, self.digest = tensors, digest
        return {"held": digest, "held_bytes": sum(t.numel() * t.element_size() for t in tensors.values())}

    def drop(self) -> None:
        self.tensors, self.digest = None, None

    def advance(self, delta_dir: str, base: str, digest: str) -> dict:
        """Apply the delta in `delta_dir` to the held base (in place) and hold the result as `digest`; the new
        tensors. DeltaRefused: the base is not `base`, the file does not move it to `digest`, or it does not fit."""
        from grpo_plugin.delta import chain, codec, wire

        if self.digest is None:
            raise DeltaRefused("this server holds no base for a delta (it was restarted or is new, or its last "
                               "full push was not an anchor)")
        if base != self.digest:
            raise DeltaRefused(f"the delta is for base {base[:12]}…, this server holds {self.digest[:12]}…")
        try:
            delta, named, sha = wire.read(Path(delta_dir) / wire.FILE_NAME)
        except (OSError, codec.DeltaMismatch) as exc:
            raise DeltaRefused(f"the delta file cannot be read: {exc}") from exc
        if named != self.digest:
            raise DeltaRefused(f"the delta file is for base {named[:12]}…, this server holds {self.digest[:12]}…")
        if chain.next_digest(self.digest, sha) != digest:
            raise DeltaRefused(f"the delta file read here (sha256 {sha[:12]}…) does not lead to the trainer's "
                               f"version {digest[:12]}…: it is not the file the trainer wrote")
        try:
            codec.apply(self.tensors, delta, inplace=True)  # checked whole first: refused, nothing written
        except codec.DeltaMismatch as exc:
            raise DeltaRefused(f"the delta does not fit the held base: {exc}") from exc
        self.digest = digest
        return self.tensors


__all__ = ["DeltaRefused", "HeldBase"]
