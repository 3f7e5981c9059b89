"""Rollouts written by user code: TRL's `rollout_func` (axolotl's `trl.rollout_func: module.function`), multi-turn
agents included, trained with the plugin's weight sync.

The producer calls `rollout_func(prompts, trainer)` as TRL does: `prompts` is this process's slice of the batch, one
entry per completion to make (each prompt `num_generations` times in a row), `trainer` the trainer. The call runs
inside one lease on the policy gate (sync/gate.py): every generation it makes samples with one pinned weight
version, so the version of every model-written token is known (the rollout's `policy_version`: policy lag and the
importance-sampling correction hold for every turn), and no push lands in the middle of a rollout.

The function generates through `trainer.grpo_generation` (`AgentGeneration`): token ids in, `Completion`s (token ids,
the server's sampling logprobs, finish reason) out, with the pinned weights (in lora_sync, the adapter version; the
run's sampling settings unless a call overrides them), or through the server's OpenAI routes
(`grpo_generation.base_url`, naming `grpo_generation.model`), as NeMo Gym's agents do. Its output is checked
(agent_output.py) and becomes the rollout axolotl scores: `env_mask` becomes axolotl's `tool_mask` (environment
tokens get no gradient, count in no normalisation, no length metric, no importance ratio, yet every later token
still attends to them), extra fields go to the reward functions with their row.

Faults: a function that raises, or returns what cannot be trained, stops the run with a `RolloutFuncError` naming
the row, the field and the function (the trainer saves what it trained first); one that does not return within
`grpo.rollout_timeout` seconds too. A server lost during the call (its own calls fail, or the function fails and the
server no longer answers) is recovered like a single-turn rollout, and the call is made again.
"""

from __future__ import annotations

import threading
import time
from urllib.parse import quote

import torch
from trl.trainer.utils import pad

from grpo_plugin.config.server import LEASE_PREFIX
from grpo_plugin.producers.agent_onpolicy import RowCheck
from grpo_plugin.producers.agent_output import (
    COMPLETIONS_KEY,
    ENVIRONMENTS_KEY,
    METRICS_KEY,
    PRIVATE_KEYS,
    PROMPTS_KEY,
    RolloutFuncError,
    check_output,
    model_turns,
    unknown_model_tokens,
)
from grpo_plugin.producers.completion_tensors import rollout_tensors
from grpo_plugin.producers.local import LocalRolloutProducer, deferred_rollout
from grpo_plugin.producers.rollout import Rollout
from grpo_plugin.server.client import ServerError, ServerLost
from grpo_plugin.server.group import replicas_of


class AgentGeneration:
    """What a rollout_func generates with (`trainer.grpo_generation`). Within a training rollout every call samples
    with the version the rollout is pinned to; otherwise (evaluation) each call leases the current one."""

    def __init__(self, client, sampling: dict, *, gate=None, lease=None, min_version=None, timeout=None):
        self._client, self._sampling = client, sampling
        self._gate, self._lease, self._min_version, self._timeout = gate, lease, min_version, timeout
        self.generated: list[tuple[int, ...]] = []  # every completion returned, for the origin count
        self.server_rows = [0] * len(replicas_of(client))  # completions each server sampled (several servers)
        self.calls = 0
        self._lock = threading.Lock()

    @property
    def model(self) -> str:
        """The model name that samples the weights being trained (the adapter version in lora_sync): name it in
        OpenAI-route requests."""
        return self._lease.model if self._lease is not None else self._gate.model

    @property
    def base_url(self) -> str:
        """The (first) server's URL, for OpenAI-compatible clients: `{base_url}/v1/completions`. Within a training
        rollout it pins the rollout's version: every model name a client finds there (the base's, the served name,
        the adapter's) samples the weights the rollout's lease holds (in_vllm/routes.py)."""
        url = replicas_of(self._client)[0].base_url
        return f"{url}{LEASE_PREFIX}{quote(self._lease.model, safe='')}" if self._lease is not None else url

    def generate(self, prompt_ids: list[list[int]], n: int = 1, **sampling) -> list[list]:
        """`n` completions per token-id prompt (`server.client.Completion`: `token_ids`, `logprobs`,
        `finish_reason`), sampled with the run's settings (`max_tokens`, `temperature`, `top_p`, ... override them
        for this call)."""
        if not prompt_ids or not all(isinstance(p, (list, tuple)) and p for p in prompt_ids):
            raise ValueError("grpo_generation.generate: give a list of non-empty token-id lists")
        prompts, settings = [list(p) for p in prompt_ids], {**self._sampling, **sampling}
        if self._lease is not None:
            groups = self._client.generate(prompts, model=self._lease.model, n=n, **settings)
        else:
            with self._gate.lease(self._min_version() if self._min_version else None, self._timeout) as lease:
                groups = self._client.generate(prompts, model=lease.model, n=n, **settings)
        with self._lock:
            self.calls += 1
            self.generated.extend(tuple(c.token_ids) for g in groups for c in g)
            for c in (c for g in groups for c in g):
                self.server_rows[c.server] += 1
        return groups


class TrainerView:
    """The trainer as a rollout_func sees it: every attribute the trainer's, `grpo_generation` this rollout's."""

    def __init__(self, trainer, generation: AgentGeneration):
        object.__setattr__(self, "_trainer", trainer)
        object.__setattr__(self, "grpo_generation", generation)

    def __getattr__(self, name):
        return getattr(self._trainer, name)

    def __setattr__(self, name, value):
        setattr(self._trainer, name, value)


def in_thread(func, timeout: float | None, name: str) -> tuple[bool, object, BaseException | None]:
    """`func()` in a daemon thread of its own, waited for at most `timeout` seconds: (finished, value, error). A call
    that does not finish is left behind (a daemon)."""
    box: dict = {}

    def target():
        try:
            box["value"] = func()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = exc

    t = threading.Thread(target=target, name=name, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        return False, None, None
    return True, box.get("value"), box.get("error")


def call_with_timeout(func, args: tuple, timeout: float | None, name: str):
    """`func(*args)` in a thread of its own, waited for at most `timeout` seconds (a hung call is left behind, as
    a daemon: the run stops with a RolloutFuncError)."""
    finished, value, error = in_thread(lambda: func(*args), timeout, "grpo-rollout-func")
    if not finished:
        raise RolloutFuncError(f"{name} did not return within grpo.rollout_timeout={timeout:g} s "
                               f"({len(args[0])} prompt rows): raise grpo.rollout_timeout if its rollouts take longer")
    if error is not None:
        raise error
    return value


def rollout_name(func) -> str:
    """What errors call a rollout function: the config key that made it and, for a user's, its import path (the
    plugin's tool loop: grpo.tools / grpo.environment_factory, never its own module)."""
    return getattr(func, "grpo_label", None) or (
        f"trl.rollout_func {getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', '?')}")


class AgentRolloutProducer(LocalRolloutProducer):
    """The local producer's prompts and rollout record; the rollout itself made by `rollout_func`."""

    def __init__(self, *args, rollout_func, rollout_timeout: float | None, vocab_size: int,
                 offpolicy: tuple[float | None, str], **kwargs):
        """`offpolicy`: grpo.offpolicy_reject and grpo.offpolicy_action (producers/agent_onpolicy.py)."""
        super().__init__(*args, **kwargs)
        self.rollout_func, self.rollout_timeout, self.vocab_size = rollout_func, rollout_timeout, vocab_size
        self.offpolicy = offpolicy
        self._said: set[str] = set()  # the on-policy check's one-time messages, once per run
        self.name = rollout_name(rollout_func)

    def _call(self, prompts: list, generation: AgentGeneration, inputs: list[dict] | None = None):
        spec = self.spec
        view = TrainerView(self._trainer, generation)  # set_trainer (axolotl's prompt sampler reads it too)
        args = (prompts, view, inputs) if getattr(self.rollout_func, "takes_rows", False) else (prompts, view)
        try:
            return call_with_timeout(self.rollout_func, args, self.rollout_timeout, self.name)
        except RolloutFuncError:
            raise
        except Exception as exc:
            if isinstance(exc, ServerError) or isinstance(exc.__cause__ or exc.__context__, ServerError):
                raise  # the guard decides whether the server is lost
            if not spec.client.healthy():  # its own requests (OpenAI routes) failed with the server
                raise ServerLost(f"the vLLM server stopped answering during {self.name}: "
                                 f"{type(exc).__name__}: {exc}") from exc
            raise RolloutFuncError(f"{self.name} raised {type(exc).__name__}: {exc} (rollout of "
                                   f"{len(prompts)} prompt rows)") from exc

    def produce(self, model, global_step, *, skip_policy_logps=False, processing_class=None,
                accelerator=None, args=None, _rank0_only=False, **kwargs):
        spec = self.spec
        inputs = self._next_inputs()
        prompts = [x["prompt"] for x in inputs]
        t0 = time.perf_counter()
        min_version = global_step - self.max_policy_lag

        def rollout():
            with spec.gate.lease(min_version, timeout=self.lag_timeout) as lease:
                generation = AgentGeneration(spec.client, spec.sampling, lease=lease)
                return lease.version, self._call(list(prompts), generation, inputs), generation

        version, out, generation = spec.guard.run("rollout", rollout)
        rollout_ms = (time.perf_counter() - t0) * 1e3
        own = {k: out.pop(k) for k in PRIVATE_KEYS if isinstance(out, dict) and k in out}  # the tool loop's
        held = own.get(ENVIRONMENTS_KEY)
        try:
            rows = check_output(out, prompts, spec.num_generations, self.vocab_size)
        except RolloutFuncError as exc:
            if held is not None:
                held.release()
            raise RolloutFuncError(f"{self.name}: {exc}") from None
        tensors = self._tensors(rows, inputs)
        record = Rollout(wait_ms=rollout_ms, generate_ms=rollout_ms, policy_version=version,
                         server_rows=generation.server_rows if generation.calls else None,
                         agent={**agent_fields(rows, generation, spec.stop_token_ids), **own.get(METRICS_KEY, {})},
                         environments=held,
                         onpolicy_check=RowCheck(self.name, *self.offpolicy, step=spec.step, prompts=prompts,
                                                 first_row=spec.process_index * len(prompts), said=self._said))
        return deferred_rollout(spec, tensors, tensors.pop("num_items_in_batch"), inputs,
                                own.get(PROMPTS_KEY, prompts), rows.completion_ids, record,
                                completions=own.get(COMPLETIONS_KEY))

    def _tensors(self, rows, inputs: list[dict]) -> dict:
        """The rollout's tensors with the env mask as axolotl's `tool_mask`, and `num_items_in_batch`: the model's
        tokens of kept completions (what the loss normalises by). Extra fields go into `inputs`, with their row."""
        spec = self.spec
        for i, inp in enumerate(inputs):
            for key, values in rows.extra.items():
                inp[key] = values[i]
        tensors = rollout_tensors(rows.prompt_ids, rows.completion_ids, rows.logprobs, pad_token_id=spec.pad_token_id,
                                  stop_token_ids=list(spec.stop_token_ids), mask_truncated=spec.mask_truncated,
                                  device=spec.device)
        tensors["tool_mask"] = pad([torch.tensor(rows.model_mask(i) or [0], dtype=torch.long, device=spec.device)
                                    for i in range(len(rows.completion_ids))], padding_value=1, padding_side="right")
        tensors["num_items_in_batch"] = (tensors["completion_mask"] * tensors["tool_mask"]).sum()
        return tensors


def agent_fields(rows, generation: AgentGeneration, stop_token_ids) -> dict:
    """The step's agent metrics: model turns per rollout, model vs environment tokens, completions cut at the
    length limit, model tokens the plugin's handle did not generate (no recorded version), handle calls."""
    n = len(rows.completion_ids)
    masks = [rows.model_mask(i) for i in range(n)]
    model_tokens = sum(sum(m) for m in masks)
    total = sum(len(c) for c in rows.completion_ids)
    stops = set(stop_token_ids)
    return {
        "agent_turns_mean": round(sum(model_turns(m) for m in masks) / max(n, 1), 4),
        "agent_model_tokens": model_tokens,
        "agent_env_tokens": total - model_tokens,
        "agent_truncated": sum(1 for c in rows.completion_ids if not c or c[-1] not in stops),
        "agent_unknown_origin_tokens": unknown_model_tokens(rows, generation.generated),
        "agent_generate_calls": generation.calls,
    }
