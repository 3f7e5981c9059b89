"""Running model-written code for rewards: a fork server with per-program limits and an unforgeable result
channel (zygote.py, which runs outside the trainer), driven from the trainer side by `Sandbox` (host.py); test
statements made strict against fake equality by asserts.py. What it protects against: docs/code.md."""

from grpo_plugin.sandbox.host import Limits, ProgramResult, Sandbox, SandboxError, SandboxUnavailable

__all__ = ["Limits", "ProgramResult", "Sandbox", "SandboxError", "SandboxUnavailable"]
