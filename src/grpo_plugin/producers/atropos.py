"""Atropos rollouts: pre-scored groups from Atropos environments, pulled from the run-api (`grpo.atropos:`).

A DataProducer on axolotl's protocol. Environments generate against the trainer's vLLM server (its `/generate`
route, in_vllm/routes.py), score the completions and post groups to the run-api; this producer registers the
trainer there, fetches batches in the background (atropos/fetcher.py), keeps every fetched batch on disk until a
checkpoint covers it (atropos/spool.py), tensorises them (atropos/group_tensors.py) and hands axolotl *deferred*
rollouts: axolotl's main thread then computes the policy logprobs with the current weights and the
importance-sampling ratio against the environments' `inference_logprobs` (which corrects for the batch's policy
lag), and TRL/axolotl's PPO-clip loss trains on it. The environments' scores reach axolotl's reward path
through `env_score` (so `reward` in the logs and metrics is theirs); the advantages are this producer's.

Registration: a fresh run calls `/reset_data` (grpo.atropos.reset_on_start) and `/register`; a resumed run
does not reset, replays the spooled batches its checkpoint does not cover, and registers with the step it
resumes at. The fetcher's first `/batch` is what lets environments register.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from axolotl.core.trainers.grpo.async_trainer import BaseDataProducer, RolloutDataset
from transformers import TrainerCallback

from grpo_plugin.atropos.api import AtroposAPI, AtroposError, BatchReply
from grpo_plugin.atropos.fetcher import AtroposTimeout, BatchFetcher
from grpo_plugin.atropos.group_tensors import TensorBatch, tensorize, warm_up
from grpo_plugin.atropos.onpolicy import Origin
from grpo_plugin.atropos.spool import Spool
from grpo_plugin.config import lookups
from grpo_plugin.config.checks import atropos_batch_size, evaluates
from grpo_plugin.config.import_paths import import_callable
from grpo_plugin.config.runtime import world_size
from grpo_plugin.producers.rollout import ROLLOUT_KEY, TEMPERATURES, AtroposBatch, PolicyLag, Rollout
from grpo_plugin.producers.spec import GenerationSpec
from grpo_plugin.server.client import VLLMServerClient
from grpo_plugin.server.process import Progress, wait_until


def env_score(prompts=None, completions=None, atropos_score=None, **kwargs) -> list[float | None]:
    """The reward function of grpo.atropos runs (the plugin names it in trl.reward_funcs): the environment's
    score of each sequence. Padding rows (see AtroposProducer) have no score (None: NaN to axolotl). Rows of the
    local eval set (`test_datasets`: no environment scored them) get the sum of `grpo.atropos.eval_reward_funcs`."""
    if atropos_score is not None:
        return list(atropos_score)
    funcs = _eval_reward_funcs()
    if not funcs:
        raise ValueError("grpo_plugin.producers.atropos.env_score is the reward of grpo.atropos runs; it reads the "
                         "environments' scores and cannot score rollouts generated from `datasets:` (an eval set "
                         "needs grpo.atropos.eval_reward_funcs)")
    scores = [0.0] * len(completions)
    for fn in funcs:
        for i, v in enumerate(fn(prompts=prompts, completions=completions, **kwargs)):
            scores[i] = None if v is None or scores[i] is None else scores[i] + float(v)
    return scores


def _eval_reward_funcs() -> list:
    # a reward function named by path: axolotl hands it no config, so it reads the one this process loaded
    atropos = lookups.loaded_run().grpo.atropos
    return [import_callable(p) for p in (atropos.eval_reward_funcs if atropos else None) or []]


def placeholder_dataset(cfg):
    """axolotl's trainer needs a train dataset; with Atropos the prompts come from the environments, so the
    plugin's load_datasets hook returns one placeholder row per sequence of a step. An eval set, when the config
    asks for evaluation, is `test_datasets` prepared by axolotl's own loader (as the train set of a run whose
    datasets they are)."""
    # here: the plugin's load_datasets hook imports this module on axolotl's config path, before the trainer's
    from axolotl.common.datasets import TrainDatasetMeta
    from datasets import Dataset

    rows = max(1, atropos_batch_size(cfg)) * world_size()  # every rank's share of a step
    eval_dataset = None
    if evaluates(cfg) and cfg.get("test_datasets"):
        from axolotl.loaders import load_tokenizer  # (as above; and only a config with test_datasets needs them)
        from axolotl.utils.data.rl import prepare_preference_datasets

        test_cfg = copy.deepcopy(cfg)
        test_cfg["datasets"], test_cfg["test_datasets"], test_cfg["val_set_size"] = cfg["test_datasets"], None, 0
        eval_dataset, _ = prepare_preference_datasets(test_cfg, load_tokenizer(cfg))
    return TrainDatasetMeta(train_dataset=Dataset.from_dict({"prompt": ["(rollouts come from Atropos)"] * rows}),
                            eval_dataset=eval_dataset, total_num_steps=int(cfg.get("max_steps") or 0) or None)


def _unusable(timeout: float, reasons: list[str]) -> str:
    return (f"no usable Atropos batch within {timeout:.0f} s (grpo.atropos.wait_timeout): {len(reasons)} batch(es) "
            f"arrived, every group of each rejected (the last one's: {reasons[-1]}). Fix the environment's groups "
            "(each rejection is logged above; docs/atropos.md#bad-payloads).")


def _say(msg: str) -> None:
    print(f"[grpo_plugin] atropos: {msg}", file=sys.stderr, flush=True)


def rank_rows(sequences: int, local_batch: int, num_processes: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which of a batch's `sequences` rows rank `rank` trains, and which of them are real. The step's
    `local_batch x num_processes` rows are the batch's in order, then (when rejected groups left it short) copies of
    its rows that train nothing (mask 0, advantage 0, no score), so axolotl's per-step split keeps every real row;
    each rank takes a contiguous `local_batch` of them, in rank order."""
    rows = torch.arange(rank * local_batch, (rank + 1) * local_batch)
    return rows % sequences, rows < sequences


def wait_bound(settings, num_processes: int, ddp_timeout: int, say: bool = True) -> float:
    """How long rank 0 waits for a batch (0: forever). With several ranks the others wait for it in a collective,
    which the distributed timeout (`ddp_timeout`) ends with the backend's error instead of the reason: the wait is
    kept a minute under it (said when the config asked for longer)."""
    wait = float(settings.wait_timeout)
    if num_processes == 1:
        return wait
    bound = float(max(1, ddp_timeout - 60))
    if 0 < wait <= bound:
        return wait
    if say and "wait_timeout" in settings.model_fields_set:
        _say(f"grpo.atropos.wait_timeout {wait:g} s with {num_processes} trainer ranks: the other ranks wait for "
             f"rank 0's batch in a collective that ends at ddp_timeout ({ddp_timeout} s), so rank 0 waits at most "
             f"{bound:g} s. Raise ddp_timeout to wait longer.")
    return bound


@dataclass
class PreparedBatch:
    seq: int
    meta: dict
    tensors: TensorBatch
    versions: list[int | None] | None  # per kept sequence: the version that generated it (None: unknown); None:
    # the ledger did not answer
    env_ids: list[int | None]  # per kept sequence: the env_id of its group
    prompts: list[str]
    completions: list[str]
    completion_ids: list[list[int]]
    groups_received: int


@dataclass
class _Taken:
    """The batch a step trains, as rank 0 took it from the fetcher (what every rank needs of it)."""

    item: PreparedBatch
    rejected: int  # groups refused, this batch's and those of batches skipped because every group was refused
    wait_ms: float
    queued: int

    def without_tokens(self) -> _Taken:
        """What the other ranks are sent: the raw tokens stay here (the tensors carry them)."""
        tensors = dataclasses.replace(self.item.tensors, tokens=None, lengths=None)
        return dataclasses.replace(self, item=dataclasses.replace(self.item, tensors=tensors))


@dataclass
class _Failed:
    """Rank 0 could not take a batch: what the other ranks raise."""

    kind: str
    text: str


class AtroposProducer(BaseDataProducer):
    """With several trainer ranks, rank 0 alone talks to the run-api (registration, fetcher, spool, the server's
    ledger) and hands each step's batch to every rank (`spec.broadcast_object`, on the main thread where every rank
    produces at the same point); each rank trains its contiguous share of the batch's rows (`rank_rows`)."""

    def __init__(self, config, *, settings, args, spec: GenerationSpec, sequence_len: int, wandb: tuple[str, str]):
        """`settings`: grpo.atropos; `args`: the trainer's TrainingArguments (batch sizes, checkpoints, steps);
        `sequence_len`: the config's (the longest sequence unless grpo.atropos.max_token_len says otherwise);
        `wandb`: the config's wandb_project and wandb_run_id, handed to the run-api."""
        super().__init__(config)
        self.settings, self.args, self.spec, self.wandb = settings, args, spec, wandb
        self.max_token_len = settings.max_token_len or sequence_len
        self.leads = spec.process_index == 0
        self.local_batch = args.per_device_train_batch_size * args.steps_per_generation
        self.global_batch = self.local_batch * spec.num_processes
        self.api = AtroposAPI(settings.url, timeout=settings.request_timeout)
        self.fetcher: BatchFetcher | None = None
        self.spool: Spool | None = None
        self._saving = True
        self._version_warned = False
        self._offpolicy_warned: set = set()  # environments the on-policy check already warned about
        self.wait_timeout = wait_bound(settings, spec.num_processes, int(args.ddp_timeout), say=self.leads)

    # ---- axolotl's DataProducer protocol ----------------------------------------------------------
    def produce(self, model, global_step, **kwargs) -> RolloutDataset:
        taken, failure = None, None
        if self.leads:
            try:
                taken = self._take(global_step)
            except Exception as exc:
                if self.spec.num_processes == 1:
                    raise
                failure = exc
        if self.spec.num_processes > 1:
            taken = self._share(taken, failure)
        item = taken.item
        output, advantages = self._rollout(item)
        output[ROLLOUT_KEY] = Rollout(
            wait_ms=taken.wait_ms, advantages=advantages, real_rows=item.tensors.num_sequences,
            lag=self._lag(item, global_step),
            batch=AtroposBatch(seq=item.seq, groups=item.tensors.num_groups, rejected_groups=taken.rejected,
                               padding_rows=self.global_batch - item.tensors.num_sequences, queued=taken.queued),
            origin=Origin(step=global_step, env_ids=item.env_ids, groups=item.tensors.group_index.tolist(),
                          versions=item.versions, warn=self.settings.offpolicy_warn,
                          reject=self.settings.offpolicy_reject, warned=self._offpolicy_warned,
                          first_row=self.spec.process_index * self.local_batch))
        return RolloutDataset(output)

    def _take(self, global_step: int) -> _Taken:
        """Rank 0: the next batch with something to train (batches whose every group was refused are skipped,
        within the same wait_timeout), marked consumed by this step in the spool."""
        if self.fetcher is None:
            self._start(global_step)
        t0 = time.perf_counter()
        rejected, unusable = 0, []  # batches whose groups were all rejected count toward the same wait_timeout
        timeout = self.wait_timeout  # 0: wait forever
        while True:
            waited = time.perf_counter() - t0
            if timeout and unusable and waited > timeout:
                raise AtroposTimeout(_unusable(timeout, unusable))
            try:
                item: PreparedBatch = self.fetcher.get(max(1e-3, timeout - waited) if timeout else 0.0,
                                                       f"waiting for an Atropos batch from {self.settings.url}")
            except AtroposTimeout:
                if not unusable:
                    raise
                raise AtroposTimeout(_unusable(timeout, unusable)) from None
            rejected += len(item.tensors.rejections)
            if item.tensors.num_sequences:
                break
            unusable.append(str(item.tensors.rejections[0]) if item.tensors.rejections else "no group")
            _say(f"batch {item.seq}: every group was rejected; nothing to train on, fetching the next one")
            self.spool.discard(item.seq)
        self.spool.mark_consumed(item.seq, global_step)
        if not self._saving:  # no checkpoint will ever cover it: nothing to resume from
            self.spool.release(global_step + self.spool.span)
        return _Taken(item=item, rejected=rejected, wait_ms=(time.perf_counter() - t0) * 1e3,
                      queued=self.fetcher.queued)

    def _share(self, taken: _Taken | None, failure: BaseException | None) -> _Taken:
        """Several ranks: rank 0's batch, or why it has none, on every rank."""
        if self.leads:
            sent = _Failed(type(failure).__name__, str(failure)) if failure is not None else taken.without_tokens()
        got = self.spec.broadcast_object(sent if self.leads else None)
        if failure is not None:
            raise failure
        if isinstance(got, _Failed):
            kind = AtroposTimeout if got.kind == AtroposTimeout.__name__ else AtroposError
            raise kind(f"trainer rank 0, which fetches every rank's Atropos batch, stopped: {got.kind}: {got.text}")
        return taken if self.leads else got

    # ---- start-up -------------------------------------------------------------------------------
    def _start(self, global_step: int) -> None:
        """Rank 0: the spool, the run-api (reached, reset or resumed, registered) and the fetcher thread."""
        spec, args = self.spec, self.args
        span = max(1, (args.steps_per_generation * args.num_iterations) // args.gradient_accumulation_steps)
        self._saving = str(getattr(args.save_strategy, "value", args.save_strategy)) != "no"
        root = self.settings.spool_dir or str(Path(args.output_dir) / "atropos_spool")
        self.spool = Spool(root, span=span)
        if not self.api.reachable():
            waited = wait_until(self.api.reachable, self.wait_timeout or 1e12,
                                Progress(f"waiting for the Atropos run-api at {self.settings.url}"),
                                lambda _: "not up yet — start it with `run-api --port N`", ready="connected",
                                poll=1.0)
            if waited is None:
                raise AtroposError(f"the Atropos run-api at {self.settings.url} did not answer within "
                                   f"{self.wait_timeout:.0f} s. Start it with `run-api --port "
                                   f"{self.settings.url.rsplit(':', 1)[-1]}`.")
        if global_step == 0:
            dropped = self.spool.clear()
            if dropped:
                _say(f"a fresh run: discarded {dropped} batch(es) an earlier run left in {root}")
            if self.settings.reset_on_start:
                self.api.reset()
            replay: list[int] = []
        else:
            replay = self.spool.resume(global_step)
            _say(f"resuming at step {global_step}: {len(replay)} spooled batch(es) are trained first "
                 f"(from {root}), then new ones from the run-api")
        self._register(global_step + len(replay))
        self._scale = {True: "group", False: "none"}.get(spec.scale_rewards, spec.scale_rewards)
        self._temperature = float(spec.temperature or 1.0)
        self._version_client = VLLMServerClient(spec.client.base_url, timeout=30)
        self.fetcher = BatchFetcher(
            self.api, self.spool, self._prepare, capacity=self.settings.prefetch, batch_size=self.global_batch,
            poll_interval=self.settings.poll_interval, max_backoff=self.settings.max_backoff,
            meta=self._fetch_meta, reregister=lambda: self._register(spec.step()), warm_up=warm_up)
        self.fetcher.start(replay)
        spec.add_callback(_SpoolRelease(self))

    def _register(self, starting_step: int) -> None:
        args = self.args
        interval = int(args.save_steps) if self._saving and float(args.save_steps).is_integer() else -1
        self.api.register(batch_size=self.global_batch, max_token_len=self.max_token_len, starting_step=starting_step,
                          num_steps=int(args.max_steps), checkpoint_dir=str(args.output_dir),
                          save_checkpoint_interval=interval, wandb_project=self.wandb[0], wandb_group=self.wandb[1])
        info = self.api.info()
        if int(info.get("batch_size", -1)) != self.global_batch:
            raise AtroposError(
                f"the run-api at {self.settings.url} forms batches of {info.get('batch_size')} sequences (it keeps "
                f"the first registration it got) but this trainer takes {self.global_batch} per step. Restart the "
                "run-api, or let the trainer reset it (grpo.atropos.reset_on_start: true, a fresh run).")
        _say(f"registered with the run-api at {self.settings.url}: {self.global_batch} sequences per batch, "
             f"starting at step {starting_step} of {int(args.max_steps)}")

    # ---- the fetcher thread's work --------------------------------------------------------------
    def _fetch_meta(self) -> dict:
        return {"fetch_step": int(self.spec.step()), "synced_version": self.spec.synced_version()}

    def _lookup_versions(self, fingerprints: list[str]) -> list[int | None] | None:
        """The policy version that generated each sequence, from the server's ledger (None: unknown); None when
        the server does not answer."""
        if not fingerprints:
            return []
        try:
            return self._version_client.policy_versions(fingerprints)
        except Exception as exc:  # the lag falls back to a lower bound; training goes on
            if not self._version_warned:
                self._version_warned = True
                _say(f"cannot look up which policy generated the batches ({exc}); policy_lag is reported as a "
                     "lower bound (from the weights the server held when the batch was fetched)")
            return None

    def _prepare(self, seq: int, meta: dict, reply: BatchReply) -> PreparedBatch:
        t = tensorize(reply.groups, pad_token_id=self.spec.pad_token_id,
                      vocab_size=self.spec.vocab_size, max_len=self.max_token_len, scale_rewards=self._scale,
                      default_temperature=self._temperature)
        for r in t.rejections:
            _say(f"batch {seq}: rejected {r} — the rest of the batch trains")
        versions = self._lookup_versions(t.fingerprints())
        completion_ids = [row[:n].tolist() for row, n in zip(t.completion_ids, t.completion_lengths.tolist())]
        prompt_ids = [row[m.bool()].tolist() for row, m in zip(t.prompt_ids, t.prompt_mask)]
        tok = self.spec.tokenizer
        env_ids = [reply.groups[g].get("env_id") for g in t.group_index.tolist()]
        return PreparedBatch(seq=seq, meta=meta, tensors=t, versions=versions, env_ids=env_ids,
                             prompts=tok.batch_decode(prompt_ids, skip_special_tokens=True),
                             completions=tok.batch_decode(completion_ids, skip_special_tokens=True),
                             completion_ids=completion_ids, groups_received=len(reply.groups))

    # ---- the rollout axolotl trains on ------------------------------------------------------------
    def _rollout(self, item: PreparedBatch) -> tuple[dict[str, Any], torch.Tensor]:
        """This rank's rows of the batch as the rollout dict axolotl scores, and this producer's advantages of
        them."""
        t = item.tensors
        S, B = t.num_sequences, self.global_batch
        if S > B:
            raise AtroposError(f"batch {item.seq} holds {S} sequences but this trainer takes {B} per step: the run-api "
                               "was registered with another batch size. Restart it (or reset it: "
                               "grpo.atropos.reset_on_start: true on a fresh run).")
        idx, real = rank_rows(S, self.local_batch, self.spec.num_processes, self.spec.process_index)
        device = self.spec.device
        cmask = t.completion_mask[idx] * real.unsqueeze(1).long()  # attended to (a masked turn too)
        adv = t.advantages[idx] * (real.view(-1, *([1] * (t.advantages.dim() - 1)))).float()
        scores = [float(t.scores[i]) if r else None for i, r in zip(idx.tolist(), real.tolist())]
        prompts = [item.prompts[i] for i in idx.tolist()]
        completions = [item.completions[i] for i in idx.tolist()]
        return {
            "prompt_ids": t.prompt_ids[idx].to(device),
            "prompt_mask": t.prompt_mask[idx].to(device),
            "completion_ids": t.completion_ids[idx].to(device),
            "completion_mask": cmask.to(device),
            "tool_mask": t.train_mask[idx].to(device),
            "sampling_per_token_logps": t.sampling_logps[idx].to(device),
            "advantages": torch.zeros(len(idx), device=device),  # axolotl's, from env_score; replaced by ours
            TEMPERATURES: t.temperatures[idx].to(device),
            # TRL's loss normaliser: the tokens every rank trains this step (the whole batch's, which every rank has)
            "num_items_in_batch": t.train_mask.sum().to(device),
            # deferred scoring: axolotl computes policy logprobs, the IS ratio and the reward metrics
            "_pending_policy_logps": True,
            "_deferred_inputs": [{"prompt": p, "atropos_score": s} for p, s in zip(prompts, scores)],
            "_deferred_prompts": prompts,
            "_deferred_completions": completions,
            "_deferred_completion_ids_list": [item.completion_ids[i] for i in idx.tolist()],
            "_rank0_only": False,
        }, adv.to(device)

    @staticmethod
    def _lag(item: PreparedBatch, step: int) -> PolicyLag:
        """Optimizer steps between the weights that generated the batch and the weights it trains: from the
        server's ledger when it knows the sequences, else a lower bound from the weights the server held when
        the batch was fetched. A sequence generated by weights newer than `step` (from before a resume to an
        earlier checkpoint) has no meaningful lag and is left out."""
        known = [step - v for v in item.versions or () if v is not None and v <= step]
        if known:
            return PolicyLag(max=max(known), mean=round(statistics.fmean(known), 3), source="ledger")
        synced = item.meta.get("synced_version")
        lag = step - synced if synced is not None and synced <= step else None
        return PolicyLag(max=lag, mean=lag, source="fetch_lower_bound")

    # ---- checkpoints and the end ----------------------------------------------------------------
    def on_checkpoint(self, global_step: int) -> None:
        if self.spool is not None:
            self.spool.release(global_step)

    def shutdown(self) -> None:
        """The run is over: the fetcher stops (what it fetched and nothing trained stays in the spool)."""
        if self.fetcher is None:
            return
        self.fetcher.stop()
        pending, consumed = self.spool.counts()
        if pending:
            _say(f"{pending} fetched batch(es) were not trained; they stay in {self.spool.root} and a run resumed "
                 "from this output_dir trains them first")
        self.fetcher = None


class _SpoolRelease(TrainerCallback):
    def __init__(self, producer: AtroposProducer):
        self.producer = producer

    def on_save(self, args, state, control, **kwargs):
        self.producer.on_checkpoint(state.global_step)
