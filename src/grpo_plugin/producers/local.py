"""Local rollouts: prompts from the training dataset, completions sampled on our vLLM server.

A DataProducer on axolotl's protocol (it reuses axolotl's GRPODataProducer for prompt sampling and rank
sharding). `produce()` returns a *deferred* rollout: token ids, masks and the server's sampling logprobs;
axolotl's trainer then computes rewards (`trl.reward_funcs`), group advantages, the policy logprobs and the
vLLM importance-sampling ratio on the main thread, and TRL's loss trains on it.

Every generation holds a lease on the policy gate (sync/gate.py): it samples with the version the lease pins
(recorded in the rollout's record, producers/rollout.py) and, for a rollout to be trained at step g, waits until the
server holds at least version g - `grpo.max_policy_lag`. With `trl.async_prefetch` this runs in axolotl's
background thread (producers/prefetch.py); the same code runs on the main thread otherwise.

Every request carries the configured sampling: `trl.num_generations`, `max_completion_length`, `temperature`,
`top_p`, `top_k`, `min_p`, `repetition_penalty`, and `trl.generation_kwargs` as further fields of vLLM's request.
"""

from __future__ import annotations

import threading
import time

import torch
from axolotl.core.trainers.grpo.async_trainer import GRPODataProducer, RolloutDataset
from trl.data_utils import is_conversational

from grpo_plugin.config.views import TRLView
from grpo_plugin.producers.completion_tensors import rollout_tensors
from grpo_plugin.producers.rollout import ROLLOUT_KEY, Rollout
from grpo_plugin.producers.seeds import seeded
from grpo_plugin.producers.spec import GenerationSpec
from grpo_plugin.server.group import replicas_of


class LocalRolloutProducer(GRPODataProducer):
    """Generates each rollout on the vLLM server with the model the current WeightSync serves. Everything it needs
    comes in its GenerationSpec; the trainer it is given (`set_trainer`) serves axolotl's prompt sampler only."""

    def __init__(self, *args, spec: GenerationSpec, max_policy_lag: int, lag_timeout: float, **kwargs):
        """`spec.guard`: the run's ServerGuard (server/recovery.py); a rollout that loses the server goes through
        it."""
        super().__init__(*args, **kwargs)
        self.spec = spec
        self.max_policy_lag = max_policy_lag
        self.lag_timeout = lag_timeout

    def _next_inputs(self) -> list[dict]:
        if self._prompt_dl is None:
            self._init_prompt_dataloader()
        try:
            return next(self._prompt_iter)
        except StopIteration:
            self._prompt_iter = iter(self._prompt_dl)
            return next(self._prompt_iter)

    def produce(self, model, global_step, *, skip_policy_logps=False, processing_class=None,
                accelerator=None, args=None, _rank0_only=False, **kwargs):
        spec = self.spec
        inputs = self._next_inputs()
        prompts = [x["prompt"] for x in inputs]
        prompt_ids, images, _ = spec.tokenize_prompts(prompts)
        if images is not None:
            raise ValueError("grpo_plugin: multimodal prompts are not supported by the local producer")
        g = spec.num_generations
        if len(prompt_ids) % g:
            raise ValueError(f"got {len(prompt_ids)} prompts, not a multiple of num_generations={g}")
        unique = [list(p) for p in prompt_ids[::g]]

        t0 = time.perf_counter()
        min_version = global_step - self.max_policy_lag

        sampling = {**spec.sampling, **seeded(spec.seeds, "train", global_step, unique)}

        def generate():
            # one lease per attempt: a redo after a recovery samples with the version the restore published
            with spec.gate.lease(min_version, timeout=self.lag_timeout) as lease:
                return lease.version, spec.client.generate(unique, model=lease.model, n=g, **sampling)

        # through the trainer's ServerGuard: on the main thread a lost server is brought back with the current
        # weights and the rollout generated again; in the prefetch thread the failure reaches the main thread
        version, groups = spec.guard.run("rollout", generate)
        rollout_ms = (time.perf_counter() - t0) * 1e3
        completions_flat = [c for group in groups for c in group]
        completion_ids = [c.token_ids for c in completions_flat]
        server_rows = [0] * len(replicas_of(spec.client))  # several servers: how many each one sampled
        for c in completions_flat:
            server_rows[c.server] += 1
        sampling_lps = [c.logprobs for c in completions_flat]

        tensors = rollout_tensors(
            prompt_ids, completion_ids, sampling_lps, pad_token_id=spec.pad_token_id,
            stop_token_ids=list(spec.stop_token_ids), mask_truncated=spec.mask_truncated, device=spec.device)
        n_tokens = torch.tensor(sum(len(c) for c in completion_ids), device=spec.device)
        # read by the trainer when it consumes this rollout (main thread): which weights sampled it, how long
        # generating took, how long the trainer waited for it (the prefetcher replaces the wait)
        record = Rollout(wait_ms=rollout_ms, generate_ms=rollout_ms, policy_version=version, server_rows=server_rows,
                         completion_tokens=int(n_tokens))
        return deferred_rollout(spec, tensors, n_tokens, inputs, prompts, completion_ids, record)


def deferred_rollout(spec: GenerationSpec, tensors: dict, n_tokens: torch.Tensor, inputs: list[dict], prompts: list,
                     completion_ids: list[list[int]], record: Rollout,
                     completions: list | None = None) -> RolloutDataset:
    """A sampled rollout as axolotl's deferred scoring takes it: the tensors, the completions for the reward
    functions (decoded, unless given: a tool loop's messages), `n_tokens` (the tokens the loss normalises by: this
    rank's, summed over the ranks here on the main thread) and the rollout's record. axolotl computes rewards,
    advantages, policy logps and the IS ratio."""
    if completions is None:
        texts = spec.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        completions = [[{"role": "assistant", "content": t}] for t in texts] if is_conversational(inputs[0]) else texts
    output = {
        **tensors,
        "num_items_in_batch": n_tokens,
        "advantages": torch.zeros(len(completion_ids), device=spec.device),
        "_pending_policy_logps": True,
        "_deferred_inputs": inputs,
        "_deferred_prompts": prompts,
        "_deferred_completions": completions,
        "_deferred_completion_ids_list": completion_ids,
        "_rank0_only": False,
        ROLLOUT_KEY: record,
    }
    if threading.current_thread() is threading.main_thread():
        sum_over_ranks(output, spec)
    else:  # a prefetch thread: no collective here (it would interleave with the training step's)
        output[ITEMS_LOCAL] = True
    return RolloutDataset(output)


ITEMS_LOCAL = "_grpo_items_local"  # `num_items_in_batch` and the record still count this rank's rollout only


def sum_over_ranks(data: dict, spec: GenerationSpec) -> None:
    """`num_items_in_batch` (TRL's loss normalizer): the completion tokens of every rank's rollout; and the record's
    counts (completions per server, the agent figures) over every rank's rollout. Collectives: main thread only,
    every rank at the same point (before its rollout is scored)."""
    data.pop(ITEMS_LOCAL, None)
    if spec.num_processes > 1:
        data["num_items_in_batch"] = spec.gather(data["num_items_in_batch"]).sum()
        record = data[ROLLOUT_KEY]
        record.add_other_ranks(spec.gather_object([(record.server_rows, record.agent)]))


def sampling_kwargs(trainer, extra: dict | None) -> dict:
    """What every generation request of the run samples with (training rollouts and evaluation alike): TRL's
    sampling settings as the trainer holds them, and `trl.generation_kwargs` (`extra`). Read once, when the
    trainer builds its producer's GenerationSpec."""
    return {"max_tokens": trainer.max_completion_length, "temperature": trainer.temperature,
            "top_p": trainer.top_p, "top_k": trainer.top_k if trainer.top_k and trainer.top_k > 0 else None,
            "min_p": trainer.min_p, "repetition_penalty": trainer.repetition_penalty, "extra": extra}


def generation_kwargs(args, trl: TRLView) -> dict:
    """`trl.generation_kwargs`: more fields of each generation request (vLLM's sampling parameters). axolotl (0.19,
    0.21) does not pass this key on to TRL's args, so it is read from the run's config (`trl`) when they lack it."""
    return dict(getattr(args, "generation_kwargs", None) or trl.generation_kwargs or {})
