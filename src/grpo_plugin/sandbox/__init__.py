"""Running model-written code for rewards: a fork server with per-program limits and kernel-enforced confinement
(zygote.py, template.py, child.py: processes outside the trainer), driven from the trainer side by `Sandbox`
(host.py); the test formats (suites.py), each test split between the program's process and the judge (split.py),
and the verdicts made in the trainer from plain values the program's process sent back (judge.py, values.py).
What it protects against: docs/code.md."""

from grpo_plugin.sandbox.host import Limits, Sandbox, SandboxError, SandboxUnavailable
from grpo_plugin.sandbox.suites import AssertSuite, CallSuite, ProgramResult, StdioSuite

__all__ = ["AssertSuite", "CallSuite", "Limits", "ProgramResult", "Sandbox", "SandboxError", "SandboxUnavailable",
           "StdioSuite"]
