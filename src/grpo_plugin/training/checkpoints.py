"""Checkpoints: which one a run resumes from (the newest COMPLETE one), and the save made when a run must stop.

transformers writes a checkpoint's files one after another and `trainer_state.json` last. A trainer killed
while saving (SIGKILL, the kernel's OOM killer, a lost node) leaves a `checkpoint-N` directory without it, and
axolotl's auto-resume (the highest-numbered `checkpoint-*`) then stops the next run with
"Can't find a valid checkpoint". Before axolotl picks, the plugin settles it here:

- `auto_resume_from_checkpoints` with no explicit `resume_from_checkpoint`: resume from the newest complete
  checkpoint; incomplete ones are moved aside to `incomplete-checkpoint-N` (kept, never deleted) with a warning.
- an explicit `resume_from_checkpoint` that is incomplete: a clear error naming the newest complete one.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

LOG = logging.getLogger("grpo_plugin")

TRAINER_STATE = "trainer_state.json"  # transformers writes it last: its presence marks a finished save
ASIDE_PREFIX = "incomplete-"


class CheckpointError(ValueError):
    """The checkpoint asked for cannot be resumed from."""


def step_of(path: Path) -> int | None:
    head, _, tail = path.name.rpartition("-")
    return int(tail) if head == "checkpoint" and tail.isdigit() else None


def checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """`checkpoint-N` directories of output_dir, lowest step first (what axolotl and transformers glob)."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.glob("checkpoint-*") if p.is_dir() and step_of(p) is not None]
    return sorted(found, key=step_of)


def is_complete(path: str | os.PathLike) -> bool:
    return (Path(path) / TRAINER_STATE).is_file()


@dataclass
class ResumePlan:
    resume_from: str | None  # the checkpoint to resume from (None: start fresh)
    incomplete: list[Path] = field(default_factory=list)  # to move aside: newer than resume_from, never finished


def plan_resume(output_dir, requested: str | None, auto: bool) -> ResumePlan:
    """Pure decision (reads the directory, changes nothing). Raises CheckpointError for an explicit incomplete
    checkpoint."""
    found = checkpoints(output_dir)
    complete = [p for p in found if is_complete(p)]
    newest = str(complete[-1]) if complete else None
    if requested:
        req = Path(requested)
        if req.is_dir() and not is_complete(req):
            hint = (f"resume from {newest} (the newest complete one)" if newest
                    else "no complete checkpoint exists in output_dir: remove resume_from_checkpoint to start fresh")
            raise CheckpointError(
                f"resume_from_checkpoint: {req} is incomplete (no {TRAINER_STATE}: the run was stopped while "
                f"saving it); {hint}.")
        return ResumePlan(str(req))
    if not auto:
        return ResumePlan(None)
    last_step = step_of(complete[-1]) if complete else -1
    return ResumePlan(newest, [p for p in found if not is_complete(p) and step_of(p) > last_step])


def move_aside(path: Path) -> Path:
    """checkpoint-N -> incomplete-checkpoint-N (-2, -3 … when taken): out of every `checkpoint-*` glob, kept."""
    target = path.with_name(ASIDE_PREFIX + path.name)
    n = 2
    while target.exists():
        target = path.with_name(f"{ASIDE_PREFIX}{path.name}-{n}")
        n += 1
    path.rename(target)
    return target


def settle_resume(cfg, rank: int = 0) -> str | None:
    """Set cfg.resume_from_checkpoint to what axolotl should resume from, before its own pick. Every rank decides
    the same; only rank 0 moves incomplete checkpoints aside. Returns the checkpoint (or None)."""
    plan = plan_resume(cfg.get("output_dir") or "./", cfg.get("resume_from_checkpoint"),
                       bool(cfg.get("auto_resume_from_checkpoints")))
    if plan.incomplete:
        names = ", ".join(p.name for p in plan.incomplete)
        if rank == 0:
            moved = ", ".join(move_aside(p).name for p in plan.incomplete)
            LOG.warning("grpo_plugin: %s never finished saving (the last run stopped mid-save); kept as %s. "
                        "Resuming from %s.", names, moved, plan.resume_from or "scratch (no complete checkpoint)")
    if plan.resume_from is not None:
        cfg["resume_from_checkpoint"] = plan.resume_from
    elif plan.incomplete:
        # nothing complete to resume from: stop axolotl's auto-resume from picking the incomplete one
        cfg["auto_resume_from_checkpoints"] = False
    return plan.resume_from


def save_after_failure(trainer) -> str:
    """A run that cannot go on (its vLLM server lost for good) saves what it trained: weights, optimizer,
    scheduler, RNG and trainer state into output_dir/checkpoint-<step>, as axolotl's periodic checkpoints do.
    Returns the message saying where and how to resume (or why nothing was saved)."""
    step = trainer.state.global_step
    if step == 0:
        return "Nothing was trained yet (step 0): nothing to save."
    if trainer.accelerator.num_processes > 1:
        return ("With several trainer processes the run is not saved here: resume from the last periodic "
                "checkpoint (`save_steps`) with `auto_resume_from_checkpoints: true`.")
    path = Path(trainer.args.output_dir) / f"checkpoint-{step}"
    try:
        trainer._save_checkpoint(trainer.model, trial=None)
        # what a periodic save triggers too (e.g. the Atropos spool releases the batches it covers)
        trainer.control = trainer.callback_handler.on_save(trainer.args, trainer.state, trainer.control)
    except Exception as exc:  # the original error is the one to report; say the save failed too
        return f"Saving step {step} to {path} failed as well: {type(exc).__name__}: {exc}"
    LOG.warning("grpo_plugin: saved step %d to %s before stopping", step, path)
    return (f"Nothing trained is lost: step {step} (weights, optimizer and trainer state) was saved to {path}. "
            f"To continue, bring the vLLM server (or the Atropos run-api) back and run `axolotl train` again with "
            f"`resume_from_checkpoint: {path}` (or `auto_resume_from_checkpoints: true`); the resumed run "
            "pushes these weights to the server and verifies them before its first rollout.")
