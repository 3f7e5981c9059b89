"""The step recorder: what happened during each optimizer step, as one line of `<output_dir>/grpo_metrics.jsonl`
(the files of docs/config.md's `metrics` key; metrics.py writes the file, summarises and plots), and the run summary
at the end.

The trainer tells the recorder, on its main thread, as things happen:
- `synced(result)`: the weight sync done for this step (sync/session.py), or None;
- `took(rollout, synced_version)`: a rollout is taken for training (its record: producers/rollout.py);
- `scored(rewards)`: the rewards of the rollout's real rows;
- `add_loss(value)`: the loss of each micro-batch.
`StepMetricsCallback` closes each step's record at `on_step_end`, records each evaluation from its logs
(`on_log`: `<output_dir>/grpo_eval.jsonl`) and writes the summary at `on_train_end`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from transformers import TrainerCallback

from grpo_plugin.config import runtime
from grpo_plugin.reporting.metrics import (
    MetricsWriter,
    eval_record,
    listening_pid,
    optimizer_name,
    report,
    rss_mb,
    server_summary,
    summarize,
)
from grpo_plugin.server import managed
from grpo_plugin.server.group import replicas_of

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from grpo_plugin.config.schema import GRPOSettings
    from grpo_plugin.producers.rollout import Rollout
    from grpo_plugin.sync.base import SyncResult
    from grpo_plugin.sync.session import SyncSession


@dataclass
class _Step:
    """What one optimizer step gathers (a fresh one per step)."""

    sync: SyncResult | None = None
    rollout_ms: float = 0.0  # the trainer's wait for rollouts
    generate_ms: float = 0.0  # generating them
    server_rows: list[int] | None = None  # completions each server sampled, summed over the step's rollouts
    rollout_fields: dict = field(default_factory=dict)  # the last rollout's own fields (Atropos: batch, lag)
    losses: list[float] = field(default_factory=list)


class StepRecorder:
    def __init__(self):
        self.step = _Step()
        # kept across steps: a step trained on an earlier rollout's micro-batches reports that rollout's figures
        self.rollout_version: int | None = None  # the policy version that sampled the last rollout taken
        self.reward_stats: tuple[float, float] | None = None  # (mean, std) of the last rollout scored
        self.last: dict | None = None  # the last step's record

    def synced(self, result: SyncResult | None) -> None:
        self.step.sync = result

    def took(self, rollout: Rollout, synced_version: int | None) -> None:
        """`synced_version`: what the server held when the rollout was taken (its version when the producer does
        not know it: Atropos reports its own policy lag instead)."""
        step = self.step
        step.rollout_ms += rollout.wait_ms
        step.generate_ms += rollout.generate_ms
        self.rollout_version = synced_version if rollout.policy_version is None else rollout.policy_version
        rows = rollout.server_rows
        if rows:
            step.server_rows = [a + b for a, b in zip(step.server_rows or [0] * len(rows), rows)]
        step.rollout_fields = rollout.step_fields()

    def scored(self, rewards: torch.Tensor, rollout: Rollout | None = None) -> None:
        """`rollout`: its record, which scoring may have completed (Atropos: the on-policy check)."""
        self.reward_stats = (rewards.mean().item(), rewards.std().item() if rewards.numel() > 1 else 0.0)
        if rollout is not None:
            self.step.rollout_fields = rollout.step_fields()

    def add_loss(self, value: float) -> None:
        self.step.losses.append(value)

    def record(self, step: int, step_ms: float, *, mode: str, outages: list[dict]) -> dict:
        """Close the step: its record (and a fresh tally for the next one). `outages`: the server outages
        recovered during the step (server/recovery.py)."""
        s, self.step = self.step, _Step()
        sync = s.sync
        reward_mean, reward_std = self.reward_stats or (None, None)
        rec = {
            "step": step,
            "reward_mean": reward_mean,
            "reward_std": reward_std,
            "loss": sum(s.losses) / len(s.losses) if s.losses else None,
            "sync_mode": mode,
            "sync_ms": round(sync.sync_ms, 3) if sync else 0.0,
            "sync_logprob_diff": sync.logprob_diff if sync else None,
            "rollout_ms": round(s.rollout_ms, 3),  # the trainer's wait for rollouts
            "generate_ms": round(s.generate_ms, 3),  # generating them (overlapped when prefetched)
            "step_ms": round(step_ms, 3),
            "policy_lag": (step - 1 - self.rollout_version) if self.rollout_version is not None else None,
            "trainer_rss_mb": round(rss_mb(), 1),
            "verify_ms": round(sync.verify_ms, 3) if sync else 0.0,
            "sync_pushed": bool(sync and sync.pushed),
            "server_rows": s.server_rows,  # completions sampled by each server
            # each server's probe |Δlogp| (one entry per server)
            "sync_server_diffs": (sync.server_diffs or [sync.logprob_diff]) if sync and sync.logprob_diff is not None
            else None,
        }
        rec["server_outages"] = len(outages)
        rec["server_down_s"] = round(sum(o["down_s"] for o in outages), 3)
        if outages:
            rec["server_outage_detail"] = outages
        rec.update(s.rollout_fields)  # Atropos: policy_lag from the ledger, batch, rejected groups
        self.last = rec
        return rec

    def log_fields(self) -> dict:
        """The sync figures shown next to axolotl's reward and loss in the per-step log (and wandb etc.)."""
        rec = self.last
        if rec is None:
            return {}
        out = {"grpo/sync_ms": rec["sync_ms"]}
        if rec["sync_logprob_diff"] is not None:
            out["grpo/sync_logprob_diff"] = rec["sync_logprob_diff"]
        out["grpo/rollout_ms"] = rec["rollout_ms"]
        out["grpo/policy_lag"] = rec["policy_lag"]
        if "atropos_rejected_groups" in rec:
            out["grpo/atropos_rejected_groups"] = rec["atropos_rejected_groups"]
        return out


class StepMetricsCallback(TrainerCallback):
    """Times each step, closes its record, writes it (rank 0, `grpo.metrics`), and the summary at the end."""

    def __init__(self, recorder: StepRecorder, session: SyncSession, settings: GRPOSettings, *, output_dir: str,
                 write: bool, base_model: str | None, model: Callable[[], object], optimizer: Callable[[], object]):
        """`write`: this process writes the metrics (rank 0, metrics on). `base_model` (the config's), else
        `model()`'s own name, and `optimizer()`: the trainer's, named in the summary at the end."""
        self.recorder, self.session, self.settings, self.base_model = recorder, session, settings, base_model
        self.writer = MetricsWriter(output_dir) if write else None
        self.model, self.optimizer = model, optimizer
        self._t0 = 0.0
        self._server_peak = 0.0
        self._unmanaged_pids: list[int] | None = None
        self._ended = False

    def _server_pids(self) -> list[int]:
        """The server processes whose memory the summary reports: ours if managed, else the ports' listeners."""
        procs = managed.servers()
        if procs:
            return [p.pid for p in procs if p.pid]
        if self._unmanaged_pids is None:
            # a server on another host is not measured (a local process on the same port is not that server)
            urls = [urlparse(c.base_url) for c in replicas_of(self.session.client)]
            ports = [u.port for u in urls if u.port and runtime.is_local(u.hostname)]
            self._unmanaged_pids = [pid for pid in (listening_pid(p) for p in ports) if pid]
        return self._unmanaged_pids

    def on_step_begin(self, args, state, control, **kwargs):
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        rec = self.recorder.record(state.global_step, (time.perf_counter() - self._t0) * 1e3,
                                   mode=self.session.mode, outages=self.session.guard.new_outages())
        pids = self._server_pids()
        if pids:  # RSS summed over the servers (with ipc the shared file counts once per server)
            self._server_peak = max(self._server_peak, sum(rss_mb(pid, tree=True) for pid in pids))
        if self.writer is not None:
            self.writer.write(rec)

    def on_log(self, args, state, control, logs=None, **kwargs):
        """An evaluation's logs (TRL's `eval_*` figures, evaluation during training): one line of
        grpo_eval.jsonl, the summary's `eval` list and the eval curve."""
        rec = eval_record(state.global_step, logs or {})
        if rec is not None and self.writer is not None:
            self.writer.write_eval(rec)

    def on_train_end(self, args, state, control, **kwargs):
        """The summary (grpo_summary.json, the curves) and its report on stdout: at the end of the run, or when it
        is interrupted (GRPOPluginTrainer.train), once."""
        if self.writer is None or self._ended:
            return
        self._ended = True
        tolerance = self.session.tolerance if self.settings.verify_sync else None
        records = self.writer.records
        summary = summarize(
            records, mode=self.session.mode, tolerance=tolerance,
            model=str(self.base_model or getattr(self.model(), "name_or_path", "")),
            server_peak_rss_mb=round(self._server_peak, 1) if self._server_peak else None,
            extra={"sync_interval": self.settings.sync_interval, "optimizer": optimizer_name(self.optimizer()),
                   "servers": server_summary(records, [c.base_url for c in replicas_of(self.session.client)],
                                             tolerance, self.session.transports()),
                   **atropos_summary(records, self.settings), **agent_summary(records)},
        )
        self.writer.finish(summary, title=f"grpo_plugin · {self.session.mode}")
        print(report(self.writer.dir), flush=True)


def agent_summary(records: list[dict]) -> dict:
    """The summary's `agent` entry (a rollout_func's run: producers/agent.py), from the records; nothing otherwise."""
    steps = [r for r in records if r.get("agent_model_tokens") is not None]
    if not steps:
        return {}
    return {"agent": {
        "turns_mean": round(sum(r["agent_turns_mean"] for r in steps) / len(steps), 4),
        "model_tokens": sum(r["agent_model_tokens"] for r in steps),
        "env_tokens": sum(r["agent_env_tokens"] for r in steps),
        "truncated": sum(r["agent_truncated"] for r in steps),
        "unknown_origin_tokens": sum(r["agent_unknown_origin_tokens"] for r in steps),
        **tool_summary(steps),
    }}


def tool_summary(steps: list[dict]) -> dict:
    """A tool-calling run's figures (agents/tool_loop.py): calls and failures in all and per tool (of which raised
    and timed out), tool results left out for the budget, and the share of
    rollouts that called a tool, over the first and the last fifth of the steps (nothing for other agent runs)."""
    steps = [r for r in steps if r.get("agent_tool_call_rate") is not None]
    if not steps:
        return {}
    fifth = max(1, len(steps) // 5)
    tools = sorted({k.split("/")[1] for r in steps for k in r if k.startswith("agent_tool/")})
    return {
        "tool_calls": sum(r["agent_tool_calls"] for r in steps),
        "tool_failures": sum(r["agent_tool_failures"] for r in steps),
        "tool_raised": sum(r.get("agent_tool_raised", 0) for r in steps),
        "tool_timeouts": sum(r.get("agent_tool_timeouts", 0) for r in steps),
        "tool_results_dropped": sum(r.get("agent_tool_results_dropped", 0) for r in steps),
        "tool_call_rate_first_20pct": round(sum(r["agent_tool_call_rate"] for r in steps[:fifth]) / fifth, 4),
        "tool_call_rate_last_20pct": round(sum(r["agent_tool_call_rate"] for r in steps[-fifth:]) / fifth, 4),
        "per_tool": {t: {k: sum(r.get(f"agent_tool/{t}/{k}", 0) for r in steps)
                         for k in ("calls", "failures", "raised", "timeouts")} for t in tools},
    }


def atropos_summary(records: list[dict], settings: GRPOSettings) -> dict:
    """The summary's `atropos` entry (nothing when the run's rollouts are not Atropos's), from the records, which
    a resumed run carries over: the whole run, not just this process."""
    if settings.atropos is None:
        return {}
    lags = [r["policy_lag"] for r in records if r.get("policy_lag") is not None]
    return {"atropos": {
        "url": settings.atropos.url,
        "batches_trained": sum(1 for r in records if r.get("atropos_batch") is not None),
        "rejected_groups": sum(r.get("atropos_rejected_groups") or 0 for r in records),
        "padding_rows": sum(r.get("atropos_padding_rows") or 0 for r in records),
        "policy_lag_max": max(lags, default=None),
        "policy_lag_mean": round(sum(lags) / len(lags), 3) if lags else None,
        "policy_lag_source": sorted({r.get("policy_lag_source") for r in records if r.get("policy_lag_source")}),
        # atropos/onpolicy.py: the largest lag-0 logprob gap of any env and step, groups it rejected, sequences
        # this server's /generate never returned
        "logprob_gap_lag0_max": max((r["atropos_logprob_gap_lag0"] for r in records
                                     if r.get("atropos_logprob_gap_lag0") is not None), default=None),
        "offpolicy_rejected_groups": sum(r.get("atropos_offpolicy_rejected_groups") or 0 for r in records),
        "unknown_origin_rows": sum(r.get("atropos_unknown_origin_rows") or 0 for r in records),
        "envs": envs_summary(records),
    }}


def envs_summary(records: list[dict]) -> dict[str, dict]:
    """Per environment (env_id): the rows it had trained, and its mean reward over the first and the last 20% of
    the steps it took part in."""
    steps: dict[str, list[dict]] = {}
    for r in records:
        for env, stats in (r.get("atropos_envs") or {}).items():
            steps.setdefault(env, []).append(stats)
    out = {}
    for env, seen in sorted(steps.items()):
        k = max(1, len(seen) // 5)
        out[env] = {"rows": sum(s["rows"] for s in seen), "steps": len(seen),
                    "reward_mean_first_20pct": _row_mean(seen[:k]), "reward_mean_last_20pct": _row_mean(seen[-k:])}
    return out


def _row_mean(steps: list[dict]) -> float | None:
    """The mean reward per row over steps' {rows, reward_mean}."""
    rows = sum(s["rows"] for s in steps)
    return round(sum(s["reward_mean"] * s["rows"] for s in steps) / rows, 4) if rows else None


__all__ = ["StepMetricsCallback", "StepRecorder", "agent_summary", "atropos_summary", "envs_summary"]
