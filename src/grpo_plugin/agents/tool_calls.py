"""Running the model's tool calls: the rows of a batch at once, each row's calls in order (an environment's methods
share its state), every call with a timeout. A call that raises, names no tool, has arguments the tool does not
take, or does not return in time becomes an error the model reads in its next turn (as TRL does) and is counted per
tool; it never stops the run. A call that hung is left behind in a daemon thread, and the environment it belongs to
is not used again.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from grpo_plugin.agents.chat_format import MALFORMED, UNKNOWN, tool_message
from grpo_plugin.producers.agent import in_thread

OUTCOMES = ("ok", "error", "unknown", "timeout", "malformed")


class ToolStats:
    """Calls per tool and outcome, and each tool's first error text, since the last `take()` (thread-safe)."""

    def __init__(self):
        self._counts: Counter = Counter()
        self._first: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def add(self, tool: str, outcome: str, text: str | None = None) -> None:
        with self._lock:
            self._counts[(tool, outcome)] += 1
            if text is not None:
                self._first.setdefault((tool, outcome), text)

    def take(self) -> tuple[Counter, dict[tuple[str, str], str]]:
        """(calls per (tool, outcome), the first error text per (tool, outcome) that failed)."""
        with self._lock:
            counts, first, self._counts, self._first = self._counts, self._first, Counter(), {}
        return counts, first


def awaited(value):
    """What user code returned, a coroutine (an async tool, reset or get_reward) run to its end."""
    return asyncio.run(value) if inspect.iscoroutine(value) else value


def _call(fn, arguments: dict, timeout: float):
    """`fn(**arguments)` (a coroutine function: run to its end) in a daemon thread, waited for `timeout` s.
    Returns (finished, value, error)."""
    return in_thread(lambda: awaited(fn(**arguments)), timeout, "grpo-tool-call")


class ToolRunner:
    """Runs a batch's tool calls; `timeout`: seconds one call may take."""

    def __init__(self, timeout: float, max_rows_at_once: int = 32):
        self.timeout, self.max_rows_at_once = timeout, max_rows_at_once

    def run_row(self, calls: list[tuple[str, dict]], tools: dict, malformed: str | None,
                stats: ToolStats) -> tuple[list[dict], bool, int]:
        """One row's calls in order -> (the tool messages, whether a call hung, how many failed)."""
        messages, hung, failed = [], False, 0
        if malformed:
            stats.add(MALFORMED, "malformed", malformed)
            failed += 1
            messages.append(tool_message(MALFORMED, {"error": malformed}))
        for name, arguments in calls:
            fn = tools.get(name)
            if fn is None:  # counted under one label: the metrics' keys never hold what the model made up
                failed += 1
                known = ", ".join(sorted(tools)) or "none"
                text = f"Tool {name} not found (tools: {known})."
                stats.add(UNKNOWN, "unknown", text)
                messages.append(tool_message(name, {"error": text}))
                continue
            finished, value, error = _call(fn, arguments, self.timeout)
            if not finished:
                hung, failed = True, failed + 1
                text = f"Tool {name} did not return within {self.timeout:g} s."
                stats.add(name, "timeout", text)
                messages.append(tool_message(name, {"error": text}))
            elif error is not None:
                text = f"{type(error).__name__}: {error}"
                stats.add(name, "error", text)
                failed += 1
                messages.append(tool_message(name, {"error": text}))
            else:
                stats.add(name, "ok")
                messages.append(tool_message(name, value))
        return messages, hung, failed

    def run(self, rows: list[tuple[list[tuple[str, dict]], dict, str | None]],
            stats: ToolStats) -> list[tuple[list[dict], bool, int]]:
        """Every row's calls, rows at once: (calls, the row's tools by name, malformed reason) per row."""
        if len(rows) <= 1:
            return [self.run_row(*row, stats) for row in rows]
        with ThreadPoolExecutor(max_workers=min(self.max_rows_at_once, len(rows)),
                                thread_name_prefix="grpo-tool-row") as pool:
            return list(pool.map(lambda row: self.run_row(*row, stats), rows))
