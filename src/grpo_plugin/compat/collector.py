"""Python's cycle collector, kept off the ~0.9 M long-lived objects of a trainer process.

Once torch, transformers, TRL, peft, axolotl and vLLM's client side are imported a trainer process holds ~0.9 M
Python objects (modules, classes, functions) that live until it ends. Every full collection walks all of them:
~1.5 s each on a 2-core CPU machine. The host runs several: axolotl's model loader calls `gc.collect()` three times
after each load, and CPython collects everything once more at interpreter exit (15-17 s here after every
`axolotl train`, with every file written and the server stopped; 2 s with the objects frozen).

`gc.freeze()` moves the objects that exist at that moment to a permanent generation the collector skips; what is
created later (the model, the batches) is collected as usual, and reference counting still frees everything as
before. The one cost: cyclic garbage that already exists when freezing is not reclaimed (a one-off, small).
"""

from __future__ import annotations

import atexit
import gc

_registered = False


def freeze_loaded() -> None:
    """Freeze what is loaded now (called before the model loads: the host's imports are done)."""
    gc.freeze()


def freeze_at_exit() -> None:
    """Make `gc.freeze()` the process's last exit step, once per process. atexit runs handlers last-in first-out:
    registered early, it runs after every handler the host registers later (logging's flush, accelerate's,
    wandb's), right before the interpreter's teardown."""
    global _registered
    if not _registered:
        atexit.register(gc.freeze)
        _registered = True
