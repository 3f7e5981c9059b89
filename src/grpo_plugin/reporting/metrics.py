"""Per-step metrics file, end-of-run summary and plot (the files of docs/config.md's `metrics` key).

`<output_dir>/grpo_metrics.jsonl`  one JSON object per optimizer step
`<output_dir>/grpo_summary.json`   medians and totals at the end
`<output_dir>/grpo_curves.png`     reward and sync-time curves
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path

import psutil

STEP_FIELDS = (
    "step", "reward_mean", "reward_std", "loss", "sync_mode", "sync_ms", "sync_logprob_diff",
    "rollout_ms", "step_ms", "policy_lag", "trainer_rss_mb",
)


def rss_mb(pid: int | None = None, *, tree: bool = False) -> float:
    """Resident memory of a process (and, with `tree`, of all its descendants) in MiB."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)] if tree else [root]
    except psutil.Error:
        return 0.0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def listening_pid(port: int) -> int | None:
    """PID of the process listening on a local TCP port (read-only: used to measure the server's memory)."""
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return conn.pid
    except (psutil.Error, OSError):
        pass
    return None


def _median(xs: Iterable[float | None]) -> float | None:
    vals = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(vals) if vals else None


def summarize(records: Sequence[dict], *, mode: str, model: str, tolerance: float | None,
              server_peak_rss_mb: float | None = None, extra: dict | None = None) -> dict:
    """Medians and totals of the per-step records (pure)."""
    syncs = [r for r in records if r.get("sync_logprob_diff") is not None or r.get("sync_ms")]
    diffs = [r["sync_logprob_diff"] for r in syncs if r.get("sync_logprob_diff") is not None]
    # a sync that found the server already on the trainer's weights is verified but pushed nothing
    pushes = [r for r in syncs if r.get("sync_pushed", True)]
    n = len(records)
    k = max(1, n // 5)
    first = [r["reward_mean"] for r in records[:k] if r.get("reward_mean") is not None]
    last = [r["reward_mean"] for r in records[-k:] if r.get("reward_mean") is not None]
    out = {
        "mode": mode,
        "model": model,
        "steps": n,
        "num_syncs": len(pushes),
        "num_verified_without_push": len(syncs) - len(pushes),
        "all_syncs_verified": bool(syncs) and len(diffs) == len(syncs)
        and (tolerance is None or all(d <= tolerance for d in diffs)),
        "verify_tolerance": tolerance,
        "sync_logprob_diff_max": max(diffs) if diffs else None,
        "sync_logprob_diff_median": _median(diffs),
        "sync_ms_median": _median(r.get("sync_ms") for r in pushes),
        "sync_ms_total": sum(r.get("sync_ms") or 0.0 for r in records),
        "rollout_ms_median": _median(r.get("rollout_ms") for r in records),
        "rollout_ms_total": sum(r.get("rollout_ms") or 0.0 for r in records),
        "step_ms_median": _median(r.get("step_ms") for r in records),
        "step_ms_total": sum(r.get("step_ms") or 0.0 for r in records),
        "loss_median": _median(r.get("loss") for r in records),
        "policy_lag_max": max((r.get("policy_lag") or 0 for r in records), default=None),
        "reward_mean_first_20pct": statistics.fmean(first) if first else None,
        "reward_mean_last_20pct": statistics.fmean(last) if last else None,
        "trainer_peak_rss_mb": max((r.get("trainer_rss_mb") or 0.0 for r in records), default=None),
        "server_peak_rss_mb": server_peak_rss_mb,
    }
    if extra:
        out.update(extra)
    return out


def eval_record(step: int, logs: dict) -> dict | None:
    """An evaluation's figures from the logs TRL writes for it (`eval_reward`, `eval_rewards/<fn>/mean`,
    `eval_loss`, completion lengths, ...), None for logs of anything else (pure)."""
    figures = {k.removeprefix("eval_"): v for k, v in logs.items()
               if k.startswith("eval_") and isinstance(v, (int, float)) and not isinstance(v, bool)}
    if "reward" not in figures and "loss" not in figures:
        return None
    return {"step": step, "reward": figures.pop("reward", None), **figures}


def server_summary(records: Sequence[dict], urls: Sequence[str], tolerance: float | None,
                   transports: Sequence[str | None] = ()) -> list[dict]:
    """Per server (pure): completions it sampled, syncs it took part in (every sync goes to every server), how
    many of them its own probe verified within `tolerance` (None: verification was off), and how a push's files
    reached it (`transports`: "shared", "network"; None for ipc)."""
    syncs = [r for r in records if r.get("sync_logprob_diff") is not None or r.get("sync_ms")]
    rows = [r.get("server_rows") for r in records]
    out = []
    for i, url in enumerate(urls):
        diffs = [(r.get("sync_server_diffs") or [])[i:i + 1] for r in syncs]
        out.append({
            "url": url,
            "rollouts": sum(x[i] for x in rows if x and len(x) > i),
            "syncs": len(syncs),
            "syncs_verified": sum(1 for d in diffs if d and d[0] is not None and tolerance is not None
                                  and d[0] <= tolerance),
            "weight_transport": transports[i] if i < len(transports) else None,
        })
    return out


def plot(records: Sequence[dict], path: str | Path, title: str = "", evals: Sequence[dict] = ()) -> Path:
    """The reward per step (and the eval reward at each evaluation) over the sync pauses."""
    import matplotlib  # here: ~0.4 s of imports, for the plot at the end of a run only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in records]
    mean = [r.get("reward_mean") for r in records]
    std = [r.get("reward_std") or 0.0 for r in records]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    ax1.plot(steps, mean, label="reward mean", color="tab:blue")
    ax1.fill_between(steps, [m - s for m, s in zip(mean, std, strict=True)],
                     [m + s for m, s in zip(mean, std, strict=True)], alpha=0.2, color="tab:blue")
    if evals:
        ax1.plot([e["step"] for e in evals], [e["reward"] for e in evals], "s--", ms=5, color="tab:green",
                 label="eval reward")
    ax1.set_ylabel("reward")
    ax1.legend(loc="upper left")
    ax1.set_title(title)
    sync_steps = [r["step"] for r in records if r.get("sync_ms")]
    ax2.plot(sync_steps, [r["sync_ms"] for r in records if r.get("sync_ms")], "o-", ms=3,
             color="tab:orange", label="sync pause (ms)")
    ax2.set_ylabel("sync ms")
    ax2.set_xlabel("optimizer step")
    ax2.legend(loc="upper left")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


class MetricsWriter:
    """Appends one line per step (flushed at once, so a crash loses nothing already written).

    A resumed run keeps the lines of the steps before the one it resumes at (a run that crashed after its
    last checkpoint re-does the steps after it: their old lines are replaced); a fresh run starts the file over.
    The decision waits for the first record, whose step says where this run starts."""

    def __init__(self, output_dir: str | Path):
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "grpo_metrics.jsonl"
        self.records: list[dict] = []
        self.eval_path = self.dir / "grpo_eval.jsonl"
        self.evals: list[dict] = []  # this process's evaluations
        self.kept_from_earlier_run = 0
        self._started = False

    def _earlier_records(self, first_step: int) -> list[dict]:
        if not self.path.exists():
            return []
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a crash
                continue
            if isinstance(rec, dict) and isinstance(rec.get("step"), int) and rec["step"] < first_step:
                kept.append(rec)
        return kept

    def write(self, record: dict) -> None:
        missing = [f for f in STEP_FIELDS if f not in record]
        if missing:
            raise KeyError(f"metrics record lacks {missing}")
        if not self._started:
            self._started = True
            self.records = self._earlier_records(record["step"])
            self.kept_from_earlier_run = len(self.records)
            self.path.write_text("".join(json.dumps(r) + "\n" for r in self.records))
        self.records.append(record)
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def write_eval(self, record: dict) -> None:
        """One evaluation (`eval_record`), appended to grpo_eval.jsonl and kept for the summary and the plot."""
        if not self.evals:
            self.eval_path.write_text("")
        self.evals.append(record)
        with self.eval_path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def finish(self, summary: dict, *, title: str = "") -> None:
        if self.evals:
            summary = {**summary, "eval": self.evals}
        (self.dir / "grpo_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        if self.records:
            plot(self.records, self.dir / "grpo_curves.png", title=title,
                 evals=[e for e in self.evals if e.get("reward") is not None])


def report(output_dir: str | Path) -> str:
    """A short human summary of a finished run (what the demo prints at the end)."""
    d = Path(output_dir)
    s = json.loads((d / "grpo_summary.json").read_text())
    recs = [json.loads(x) for x in (d / "grpo_metrics.jsonl").read_text().splitlines() if x.strip()]
    bars = "▁▂▃▄▅▆▇█"
    rewards = [r["reward_mean"] or 0.0 for r in recs]
    lo, hi = min(rewards, default=0.0), max(rewards, default=0.0)
    every = max(1, len(rewards) // 60)
    spark = "".join(bars[int((x - lo) / (hi - lo) * 7) if hi > lo else 0] for x in rewards[::every])

    def f(x, fmt):
        return "n/a" if x is None else format(x, fmt)

    return "\n".join([
        f"grpo_plugin run summary ({d})",
        f"  mode {s['mode']} · {s['steps']} steps · {s['num_syncs']} syncs"
        f" · all verified: {s['all_syncs_verified']}",
        f"  reward mean, first 20% of steps: {f(s['reward_mean_first_20pct'], '.3f')}"
        f"  →  last 20%: {f(s['reward_mean_last_20pct'], '.3f')}",
        f"  reward per step: {spark}",
        f"  sync pause median {f(s['sync_ms_median'], '.1f')} ms"
        f" · probe |Δlogp| max {f(s['sync_logprob_diff_max'], '.1e')}"
        f" (tolerance {f(s['verify_tolerance'], '.0e')})",
        f"  step median {f(s['step_ms_median'], '.0f')} ms · rollout median {f(s['rollout_ms_median'], '.0f')} ms"
        f" · trainer peak RSS {f(s['trainer_peak_rss_mb'], '.0f')} MiB"
        f" · server peak RSS {f(s['server_peak_rss_mb'], '.0f')} MiB",
        *_atropos_lines(s.get("atropos"), f),
        *([f"  agent: {a['turns_mean']:.2f} model turns per rollout · model tokens {a['model_tokens']}"
           f" · environment tokens {a['env_tokens']} (not trained) · truncated {a['truncated']}"
           f" · of unknown origin {a['unknown_origin_tokens']}"] if (a := s.get("agent")) else []),
        *([f"  tools: {a['tool_calls']} calls, {a['tool_failures']} failed"
           f" ({a.get('tool_raised', 0)} raised, {a.get('tool_timeouts', 0)} timed out)"
           f" · results left out for the budget {a.get('tool_results_dropped', 0)} · rollouts calling a tool"
           f" {a['tool_call_rate_first_20pct']:.0%} (first 20% of steps) → {a['tool_call_rate_last_20pct']:.0%}"
           f" (last 20%) · " + ", ".join(f"{t} {v['calls']} ({v['failures']} failed: {v.get('raised', 0)} raised,"
                                         f" {v.get('timeouts', 0)} timed out)" for t, v in a["per_tool"].items())]
          if (a := s.get("agent")) and "tool_calls" in a else []),
        *(["  eval reward: " + " → ".join(f"{f(e.get('reward'), '.3f')} (step {e['step']})" for e in s["eval"])]
          if s.get("eval") else []),
        f"  files: {d / 'grpo_metrics.jsonl'}, {d / 'grpo_summary.json'}, {d / 'grpo_curves.png'}",
    ])


def _atropos_lines(a: dict | None, f) -> list[str]:
    if not a:
        return []
    return [
        f"  atropos: {a['batches_trained']} batches from {a['url']} · rejected groups {a['rejected_groups']}"
        f" · padding rows {a['padding_rows']}",
        f"  policy lag mean {f(a['policy_lag_mean'], '.2f')} · max {f(a['policy_lag_max'], 'd')}"
        f" ({', '.join(a['policy_lag_source']) or 'no source'})",
        *(f"  env {env}: {e['rows']} rows over {e['steps']} steps · reward {f(e['reward_mean_first_20pct'], '.3f')}"
          f" → {f(e['reward_mean_last_20pct'], '.3f')}" for env, e in (a.get("envs") or {}).items()),
    ]


def optimizer_name(optimizer) -> str | None:
    """The optimizer that stepped (accelerate wraps it): its class, and for bitsandbytes' the state bits and paging
    (its AdamW class serves adamw_bnb_8bit and paged_adamw_8bit alike), e.g. "bitsandbytes AdamW 8-bit paged"."""
    inner = getattr(optimizer, "optimizer", optimizer)
    if inner is None:
        return None
    name = type(inner).__name__
    if type(inner).__module__.startswith("bitsandbytes"):
        bits = getattr(getattr(inner, "args", None), "optim_bits", None)
        paged = " paged" if getattr(inner, "is_paged", False) else ""
        name = f"bitsandbytes {name}" + (f" {bits}-bit" if bits else "") + paged
    return name
