"""A call that failed on the link to a vLLM server that still answers /health: the connection dropped, was reset
or stalled (a link down for a few seconds, a keep-alive connection the server closed meanwhile), or an upload
arrived corrupted more times than the client resends it (server/client.py `send_file`).

Nothing is restarted for it: the server kept running, but what it holds after a push cut short is not known (a
file may have arrived and its load not, or a reload or delta may have been applied with its reply lost), so the
guard (server/recovery.py) treats it as a recovery whose server needs no bringing back: the trainer's current
weights are pushed again in full (a delta push starts again from an anchor) and verified by the probe, and the
failed call is redone. Bounded: `LINK_TRIES` link faults in a row, with no call getting through between them,
end the run with the last cause.
"""

from __future__ import annotations

import sys

from grpo_plugin.server.client import LinkError

LINK_TRIES = 3  # link faults in a row (no call through between them) before the run stops
PREFIX = "the link to the vLLM server failed: "  # how a link fault's cause begins (one string: several ranks agree)


def is_link_fault(why: str) -> bool:
    return why.startswith(PREFIX)


class LinkFaults:
    """How many link faults in a row the run has met (pure bookkeeping, with the messages)."""

    def __init__(self, limit: int = LINK_TRIES):
        self.limit, self.in_a_row = limit, 0

    def reason(self, exc: BaseException, chain: list[BaseException]) -> str | None:
        """Why the failed call counts as a link fault (the server answered /health after it), or None. `chain`:
        `exc` and the exceptions it was raised from (server/recovery.py walks it once)."""
        return f"{PREFIX}{exc}" if any(isinstance(e, LinkError) for e in chain) else None

    def meet(self, step: int, during: str, why: str) -> str | None:
        """One more in a row: None and a message saying what is done, or (past the limit) why the run stops."""
        self.in_a_row += 1
        if self.in_a_row > self.limit:
            return (f"the {during} at step {step} failed on the link to the vLLM server {self.in_a_row} times in a "
                    f"row, each time with the server still answering /health; the last: {why[len(PREFIX):]}. Check "
                    "the network between the trainer and the server (a proxy, a flapping link, an MTU mismatch).")
        print(f"[grpo_plugin] step {step}: the {during} failed on the link to the vLLM server "
              f"({why[len(PREFIX):]}); the server still answers /health, so it is not restarted: the trainer's "
              f"current weights go to it again in full and are verified (link fault {self.in_a_row} of at most "
              f"{self.limit} in a row)", file=sys.stderr, flush=True)
        return None

    def passed(self) -> None:
        """A call got through: the count starts again."""
        self.in_a_row = 0


__all__ = ["LINK_TRIES", "LinkFaults", "is_link_fault"]
