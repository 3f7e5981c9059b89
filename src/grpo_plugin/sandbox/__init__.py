"""Running model-written code for rewards, with the kernel as the boundary: a fork server in a bubblewrap jail
(jail.py, zygote.py, template.py), every program and judge process confined by the kernel (confine.py), the
program's process running the program and answering calls (child.py), the tests run whole in a judge process
(judge.py) that exchanges plain values with it (codec.py); driven from the trainer by `Sandbox` (host.py) with the
test formats of suites.py. What it protects against: docs/code.md."""

from grpo_plugin.sandbox.host import Limits, Sandbox, SandboxError, SandboxUnavailable
from grpo_plugin.sandbox.suites import AssertSuite, CallSuite, ProgramResult, StdioSuite

__all__ = ["AssertSuite", "CallSuite", "Limits", "ProgramResult", "Sandbox", "SandboxError", "SandboxUnavailable",
           "StdioSuite"]
