"""Is a rollout function's rollout on-policy? The check the trainer makes when it scores one (lag 0 only).

A `trl.rollout_func` returns each model token's sampling logprob; the trainer scores the same tokens with the
weights the step trains, at `trl.temperature`. For a rollout sampled with those very weights (policy lag 0) the two
agree to within numerics (fp32: ~1e-7 nats per token; a bf16 server against an fp32 trainer: ~1e-2). A larger gap
means the tokens did not come from the policy the trainer believes sampled them: another model (an OpenAI-route
request naming a model the run does not train, another server), truncated sampling (top_p / top_k / min_p the
trainer does not apply), another temperature. The importance-sampling correction would then train on a wrong
ratio, silently. Per step: every lag-0 row's mean gap over its model tokens (every rank's rows); a row over
`grpo.offpolicy_reject` stops the run (`grpo.offpolicy_action: stop`, the default: a checkpoint is saved first) or
trains nothing (`drop`: its advantage is zeroed, counted as `agent_offpolicy_rows`).
Rollouts sampled at an older version (prefetched: lag 1) are not compared: their gap is the policy's own change.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from grpo_plugin.atropos.onpolicy import row_gaps
from grpo_plugin.producers.agent_output import RolloutFuncError, row_label

CAUSES = ("another model sampled it (an OpenAI-route request naming a model this run does not train, or another "
          "server: generate through trainer.grpo_generation, or post to its base_url naming its model), truncated "
          "sampling (top_p / top_k / min_p the trainer does not apply), or another temperature than "
          "trl.temperature")


@dataclass
class RowCheck:
    """One rollout's check; `step()` is the version the trainer trains when it scores the rollout."""

    name: str  # the rollout function, as errors name it
    reject: float | None  # nats per token; None: never
    action: str  # "stop" | "drop"
    step: Callable[[], int]
    prompts: list  # this rank's rows' prompts, for messages
    first_row: int = 0  # several trainer ranks: this rank's first row in the batch (gathered in rank order)
    said: set = field(default_factory=set)  # what was said once already (shared by the producer's checks)

    def apply(self, data: dict, advantages, version: int | None, gather: Callable[[list], list] = list) -> dict:
        """After the trainer scored the rollout (`data`: this rank's rows; `version`: the weights that sampled it):
        the step's fields; raises on a row over the threshold with action stop. `gather` (a collective)
        concatenates every rank's row gaps."""
        if self.reject is None or version is None or self.step() != version:
            return {}
        if data.get("old_per_token_logps") is None or data.get("sampling_per_token_logps") is None:
            self._once("nologps", f"{self.name}: the lag-0 logprob check needs the trainer's logprobs of the "
                                  "rollout, which it computes with trl.vllm_importance_sampling_correction: "
                                  "not checked")
            return {}
        mask = data["completion_mask"]
        if data.get("tool_mask") is not None:
            mask = mask * data["tool_mask"]
        mine = row_gaps(data["old_per_token_logps"], data["sampling_per_token_logps"], mask)
        gaps = list(gather(mine))
        over = [i for i, g in enumerate(gaps) if not math.isnan(g) and g > self.reject]
        known = [g for g in gaps if not math.isnan(g)]
        fields = {"agent_logprob_gap_lag0": round(max(known), 6) if known else None,
                  "agent_offpolicy_rows": len(over) if self.action == "drop" else 0}
        if not over:
            return fields
        worst = max(over, key=lambda i: gaps[i])
        local = worst - self.first_row
        where = row_label(self.prompts, local) if 0 <= local < len(self.prompts) else f"row {worst}"
        what = (f"{self.name}: {len(over)} of {len(gaps)} rows sampled at the weights this step trains (policy "
                f"version {version}) differ from the trainer's logprobs by more than grpo.offpolicy_reject="
                f"{self.reject:g} nats/token ({where}: {gaps[worst]:.3g}). Likely: {CAUSES}.")
        if self.action == "stop":
            raise RolloutFuncError(what + " Set grpo.offpolicy_action: drop to train on without those rows.")
        rows = [i - self.first_row for i in over if 0 <= i - self.first_row < len(mine)]
        advantages[rows] = 0
        self._once("drop", what + " Their advantages are zeroed (counted per step as agent_offpolicy_rows; said "
                                  "once).")
        return fields

    def _once(self, key: str, line: str) -> None:
        if key not in self.said:
            self.said.add(key)
            print(f"[grpo_plugin] {line}", file=sys.stderr, flush=True)
