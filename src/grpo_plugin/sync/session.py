"""One run's weight sync, as the trainer drives it: which weights the server holds, and getting the trainer's there.

The session owns, for the whole run:
- the policy gate (sync/gate.py): which version the server generates with, and who may write weights meanwhile;
- the mode's `WeightSync` (one per `grpo.sync`, sync/__init__.py), prepared with a `ModelHandle`, never the trainer;
- the server guard (server/recovery.py): a server lost during a push, a rollout or a verification is brought back,
  and `restore` puts the trainer's current weights on the new one;
- the post-sync probe (sync/verify.py), run at once or deferred (its server half overlaps the next rollout);
- the version counter: `synced_version`, the optimizer step whose weights the server holds.

Its lifecycle: built before the host trainer (the producers need the gate and the guard), `attach` once the model
is loaded, `maybe_push` before each rollout (axolotl's `_maybe_sync_vllm_weights`), `finish_verification` before
each optimizer step and before a rollout sampled with an unverified version is scored, `close` at the end.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from accelerate.utils import broadcast_object_list
from transformers import TrainerCallback

from grpo_plugin.config.lookups import DEFAULT_TOLERANCE
from grpo_plugin.config.schema import GRPOSettings
from grpo_plugin.config.storage import sync_root
from grpo_plugin.server import files
from grpo_plugin.server.group import replicas_of
from grpo_plugin.server.rank_agreement import RankAgreement, agreement_timeout
from grpo_plugin.server.recovery import ServerGuard, ServerUnrecoverable
from grpo_plugin.sync import build_weight_sync
from grpo_plugin.sync.base import ModelHandle, SyncResult
from grpo_plugin.sync.gate import PolicyGate
from grpo_plugin.sync.verify import DeferredVerifier, ProbeVerifier

if TYPE_CHECKING:
    from grpo_plugin.sync.ranks import LeadFollow, OneCopy


class SyncSession:
    def __init__(self, settings: GRPOSettings, client, *, world_size: int, overlapped: bool,
                 step: Callable[[], int], on_result: Callable[[SyncResult | None], None],
                 max_model_len: int | None, streaming: bool = False):
        """`world_size`: the trainer's processes (with several, every rank joins a recovery: `attach` joins them;
        not for ipc nor Atropos, whose lost server ends the run: `recovers_on_ranks`). `overlapped`: generation
        overlaps training (prefetch, Atropos): the probe's server half then runs beside the next rollout.
        `step()`: the trainer's global step. `on_result(result)`: the sync done for the current step, for the
        step's metrics (None on the ranks that did not push). `max_model_len`: the server's (vllm.max_model_len; None:
        the model's), which bounds the probe. `streaming`: rollouts stream (producers/streaming.py): a push
        interrupts the rollouts in flight instead of waiting for them (sync/gate.py)."""
        self.settings, self.client, self.on_result, self.overlapped = settings, client, on_result, overlapped
        self.max_model_len = max_model_len
        # rollouts lease a version; in-place writes exclude them (streaming: interrupt them)
        self.gate = PolicyGate(interrupt=client.interrupt if streaming else None)
        self.weight_sync = build_weight_sync(settings, client, self.gate)
        self.guard = ServerGuard(
            client, restore=self.restore, step=step, max_restarts=settings.server_restarts,
            restart_window_s=settings.server_restart_window, hang_timeout_s=settings.server_hang_timeout,
            wait_timeout_s=settings.server_timeout, starts_itself=self.weight_sync.starts_server,
            enabled=world_size == 1 or self.recovers_on_ranks() is None)
        self.synced_version: int | None = None  # global_step whose weights the server holds
        self.forget_prefetched: Callable[[], None] = lambda: None  # rollouts a lost server may have sampled
        self.model: ModelHandle | None = None
        self.ranks: OneCopy | LeadFollow | None = None
        self.verifier: ProbeVerifier | None = None
        self.deferred: DeferredVerifier | None = None
        self.tolerance: float | None = None
        self.closed = False

    def recovers_on_ranks(self) -> str | None:
        """With several trainer ranks: None when they recover a lost server together, else why they cannot."""
        if self.weight_sync.mode == "ipc":
            return ("grpo.sync: ipc with several trainer ranks keeps no recovery: rank 0's model is the shared copy "
                    "a new server would have to re-map under DDP")
        if self.settings.atropos is not None:
            return ("Atropos with several trainer ranks keeps no recovery: rank 0 alone feeds the ranks from the "
                    "run-api, whose environments generate on the server")
        return None

    @property
    def mode(self) -> str:
        return self.weight_sync.mode

    def transports(self) -> list[str | None]:
        """How a push's files reach each server ("shared", "network"); None for a mode that hands none (ipc)."""
        return [c.files.kind if self.weight_sync.hands_files else None for c in replicas_of(self.client)]

    def attach(self, model: ModelHandle, ranks: OneCopy | LeadFollow, tokenizer) -> None:
        """The trainer's model is loaded: prepare the mode on it and build the probe (its tolerance follows the
        model's dtype unless grpo.verify_tolerance says otherwise). `ranks`: who reads the weights for a push
        (sync/ranks.py)."""
        self.model, self.ranks = model, ranks
        if model.num_processes > 1 and self.guard.enabled:  # every rank, at once: the agreement's group is made
            s = self.settings
            self.guard.join_ranks(RankAgreement.over_trainer(agreement_timeout(
                s.server_hang_timeout, s.request_timeout, s.server_timeout)))
        elif model.num_processes > 1 and model.is_main:
            print(f"[grpo_plugin] a lost vLLM server ends this run: {self.recovers_on_ranks()} (resume from a "
                  "periodic checkpoint: save_steps, auto_resume_from_checkpoints: true)", flush=True)
        if model.is_main and self.weight_sync.hands_files:  # rank 0 pushes: how its files reach each server
            for c, how in zip(replicas_of(self.client), files.choose(replicas_of(self.client),
                                                                      sync_root(self.settings.sync_dir),
                                                                      self.settings.weight_transport)):
                c.files = how
        # before prepare(): a pending verification is finished before ipc's fence takes the gate for the step
        model.add_callback(_FinishVerification(self))
        self.weight_sync.prepare(model)
        unwrapped = model.unwrap()
        dtype = next(unwrapped.get_input_embeddings().parameters()).dtype
        self.tolerance = self.settings.verify_tolerance or DEFAULT_TOLERANCE.get(str(dtype).removeprefix("torch."),
                                                                                  1e-4)
        lengths = [x for x in (getattr(unwrapped.config, "max_position_embeddings", None),
                               self.max_model_len) if x]
        probe_ids = tokenizer(self.settings.probe_text, add_special_tokens=False)["input_ids"]
        # environments name the base model on the OpenAI routes: in lora_sync the adapter must answer those too
        self.verifier = ProbeVerifier(self.client, probe_ids, self.tolerance, self.mode,
                                      max_len=min(lengths) if lengths else None, forward=ranks.logprobs,
                                      context=lambda: getattr(self.weight_sync, "verify_context", ""),
                                      also_base=self.settings.atropos is not None and self.mode == "lora_sync")
        self.deferred = DeferredVerifier(self.verifier, self.gate)

    # ---- the push before a rollout ------------------------------------------------------------
    def maybe_push(self, step: int, *, force: bool = False) -> None:
        """Every `grpo.sync_interval` steps (`force`: now, unless the server holds `step`'s weights): push (rank 0,
        every rank joining a sharded gather), verify, publish."""
        last = self.synced_version
        if last is not None and (step == last or (step - last < self.settings.sync_interval and not force)):
            return
        result, lost = None, None
        if self.model.is_main:  # one push per sync, whatever the number of ranks
            with self.ranks.leading():  # sharded weights: the other ranks join each gather and probe forward
                self.finish_verification()  # (normally done already, before the last optimizer step)
                # a server lost during the push is brought back by the guard, whose restore IS this push (several
                # ranks: after the push, with every rank: the restore is theirs too)
                if self.guard.agreement is None:
                    result = self.guard.run("weight push", lambda: self._sync_now(step, last), redo=False)
                else:
                    result, lost = self.guard.attempt(lambda: self._sync_now(step, last))
        else:
            self.ranks.follow(self.model.unwrap())
        lost = self.guard.agree("weight push", lost)
        if lost is not None:
            result = self.guard.recover("weight push", lost, redo=False)
        else:
            self._publish(step)
        self.on_result(result)

    def _publish(self, step: int) -> None:
        """No rank generates before the push is done and verified; every rank's producer then samples with the
        model name rank 0's push serves (a push already published it inside its write on rank 0)."""
        served = self.weight_sync.generation_model if self.model.is_main else None
        if self.model.num_processes > 1:
            served = broadcast_object_list([served], from_process=0)[0]
        self.gate.publish(step, served)
        self.synced_version = step

    def bring_current(self, step: int) -> None:
        """Evaluation at `step` scores the policy of `step`: the server gets this step's weights now, whatever
        `grpo.sync_interval` says, verified before anything is sampled with them. Every rank calls it (with
        several ranks a push is collective)."""
        self.maybe_push(step, force=True)
        if self.model.is_main:
            self.finish_verification()

    def _sync_now(self, step: int, last: int | None) -> SyncResult:
        result = None
        if last is None:  # a policy another run announced (one that died holding it) is not this run's
            self.client.set_policy(step, None)
        if last is None and not self.weight_sync.needs_initial_push:
            result = self._initial_check(step)
        if result is None:
            # generation overlapped with training: the probe's server half too. Synchronous runs keep it before
            # the rollout: their rollouts are then reproducible (the probe never shares a batch with one)
            # (sharded weights: the probe's forward needs every rank, so it runs inside the sync; several ranks
            # recovering together: a lost server must be found inside the push, where every rank agrees on it)
            defer = self.overlapped and not self.ranks.sharded and self.guard.agreement is None
            result = self._push(step, verify=self.settings.verify_sync, defer=defer)
        if self.settings.atropos is not None and not result.pushed:
            # verified, not pushed: the server already computes with these weights; a push announces its
            # version inside the sync fence instead
            self.client.set_policy(step, self.weight_sync.generation_model)
        return result

    def _initial_check(self, step: int) -> SyncResult | None:
        """The server started on the trainer's initial weights: verify instead of pushing. None (push) if the
        probe disagrees, e.g. because the model was changed at load."""
        result = self.verifier.measure_into(self.model.unwrap(), self.weight_sync.generation_model,
                                            SyncResult(step=step, sync_ms=0.0, pushed=False))
        return result if result.logprob_diff <= self.tolerance else None

    def _push(self, step: int, *, verify: bool, defer: bool = False) -> SyncResult:
        """Push (excluding every generation when the mode writes the served weights in place), publish the
        version, verify it: now, or (`defer`) with the server's half in the background while generation goes on
        (sync/verify.py), finished by `finish_verification`."""
        with self.gate.writing(self.weight_sync.writes_in_place):
            with self.ranks.gathered(self.model.unwrap(), self.weight_sync.reads) as full:
                result = self.weight_sync.push(step, full)
            self.gate.publish(step, self.weight_sync.generation_model)
        if verify and defer:
            self.deferred.start(result)
        elif verify:
            self.verifier.verify(self.model.unwrap(), self.weight_sync.generation_model, result)
        return result

    # ---- verification and recovery ------------------------------------------------------------
    def finish_verification(self) -> bool:
        """Finish the pending verification of the last push (main thread, before the weights change again).
        A mismatch raises SyncVerificationError. A server lost meanwhile is recovered like anywhere else (the
        restore pushes and verifies the current weights on the new server) and the prefetched rollouts, which
        the lost server may have sampled with the unverified version, are forgotten: returns True then."""
        if self.deferred.version is None:
            return False
        try:
            self.deferred.finish(self.model.unwrap())
            return False
        except Exception as exc:
            why = self.guard.is_lost(exc) if self.guard.enabled else None
            if why is None:
                raise
            self.guard.recover("verification of the pushed weights", why, redo=False)
            self.forget_prefetched()
            return True

    def must_resample(self, version: int | None) -> bool:
        """Before a rollout sampled with `version` is scored: finish the verification pending on that version.
        True when its server was lost meanwhile: the rollout must be sampled again."""
        pending = self.deferred.version
        return pending is not None and version is not None and version >= pending and self.finish_verification()

    def restore(self) -> SyncResult:
        """After the server was lost and replaced (server/recovery.py): put the trainer's CURRENT weights on it
        and verify them with the probe (always, whatever verify_sync says: a recovered run must be provably on
        the trained weights). Several ranks: every rank joins it (rank 0 pushes, the others follow its gathers),
        then each learns whether it passed."""
        step = self.guard.step()
        self.deferred.discard()  # the server it asked is gone; this push verifies the current weights itself
        self.weight_sync.server_restarted()
        result = self._push(step, verify=True) if self.guard.agreement is None else self._restore_on_ranks(step)
        self.synced_version = step
        self.on_result(result)
        return result

    def _restore_on_ranks(self, step: int) -> SyncResult | None:
        """Several ranks: rank 0 pushes and verifies (the others follow its gathers and probe forwards); every
        rank then learns whether that passed (else each stops, saying why) and gets the model name it serves."""
        result, error = None, None
        try:
            if self.model.is_main:
                with self.ranks.leading():
                    result = self._push(step, verify=True)
            else:
                self.ranks.follow(self.model.unwrap())
        except Exception as exc:  # noqa: BLE001 - every rank hears of it at the agreement below
            error = f"{type(exc).__name__}: {exc}"
        failed = self.guard.agreement.any(error, f"the restore of the weights (step {step})")
        if failed:
            raise ServerUnrecoverable(f"putting the trainer's weights back on the restarted server failed: {failed}")
        self._publish(step)
        return result

    # ---- the end --------------------------------------------------------------------------------
    def stop_generation(self) -> None:
        """No new rollout starts (one waiting for a version that will not come gives up)."""
        self.gate.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.stop_generation()
        with contextlib.suppress(Exception):
            self.weight_sync.close()
        if self.deferred is not None:
            self.deferred.close()


class _FinishVerification(TrainerCallback):
    """No optimizer step while a published version is unverified: the pending verification of the last push is
    finished before the update changes the weights it must be measured against."""

    def __init__(self, session: SyncSession):
        self.session = session

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.session.finish_verification()


__all__ = ["SyncSession"]
