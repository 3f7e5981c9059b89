"""compat/: the version guard, the host adapter, and the one stack table everything reads."""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
import tomllib

import pytest
import torch
from packaging.requirements import Requirement

from grpo_plugin.compat import host as host_mod
from grpo_plugin.compat.host import HOSTS, UnsupportedHostError, check_host_versions
from grpo_plugin.compat.stacks import STACKS, stack_for
from tests.conftest import ROOT


def test_the_installed_host_is_a_supported_stack():
    found = check_host_versions()
    assert found.axolotl == md.version("axolotl")
    assert found.trl.split(".")[:2] == md.version("trl").split(".")[:2]


@pytest.mark.parametrize("axolotl, trl", [("0.21.0", "1.16.0"), ("0.20.0", "1.13.0"), ("0.19.0", "1.14.1"),
                                          ("0.22.0", "1.14.1")])
def test_unsupported_pairs_are_refused_naming_installed_and_supported(axolotl, trl):
    with pytest.raises(UnsupportedHostError) as err:
        check_host_versions(axolotl, trl)
    msg = str(err.value)
    assert f"axolotl {axolotl} with trl {trl}" in msg
    for s in STACKS.values():
        assert f"axolotl {s.axolotl} with trl {s.trl} (Python {s.python})" in msg


def test_supported_pairs_map_to_their_stack():
    assert stack_for("0.21.0", "1.14.1").name == "current"
    assert stack_for("0.21.0", "1.14.2").name == "current"  # a TRL patch release keeps its API
    assert stack_for("0.19.0", "1.9.0").name == "legacy"


def test_register_refuses_an_unsupported_host_before_touching_the_config(monkeypatch):
    from grpo_plugin.plugin import GRPOPlugin

    real = host_mod.installed_version
    monkeypatch.setattr(host_mod, "installed_version", lambda d: "1.16.0" if d == "trl" else real(d))
    cfg = {"rl": "grpo", "grpo": {"sync": "lora_sync"}}
    with pytest.raises(UnsupportedHostError, match="trl 1.16.0"):
        GRPOPlugin().register(cfg)
    assert "trainer_cls" not in cfg


def test_host_adapter_returns_what_each_host_unpacks():
    logps, ent, aux = torch.zeros(2, 3), torch.ones(2, 3), torch.tensor(0.5)
    assert len(HOSTS["legacy"].logps_result(logps, ent, aux)) == 2
    assert HOSTS["legacy"].logps_result(logps, ent, aux, evaluating=True)[2] is aux  # TRL 1.9's eval path: 3
    assert HOSTS["current"].logps_result(logps, ent, aux)[2] is aux
    for result in ((logps, ent), (logps, ent, aux)):
        out = HOSTS["current"].split_logps(result)
        assert len(out) == 3 and out[0] is logps and out[1] is ent


def test_install_script_reads_the_table_through_the_shell():
    script = ROOT / "src" / "grpo_plugin" / "compat" / "stacks.py"
    for name, s in STACKS.items():
        for machine in ("cpu", "cuda"):
            out = subprocess.run(
                ["bash", "-c", f'eval "$("{sys.executable}" "{script}" shell {name} {machine})"; '
                 'echo "$PYTHON_VERSION|$TORCH_VERSION|$VLLM_DIST|$DEEPSPEED_SPEC"'],
                capture_output=True, text=True, check=True).stdout.strip()
            plan = s.vllm(machine)
            assert out == f"{s.python}|{plan.torch}|{plan.requirement}|deepspeed{s.deepspeed}"
    bad = subprocess.run([sys.executable, str(script), "shell", "newest", "cpu"], capture_output=True, text=True)
    assert bad.returncode != 0 and "unknown stack 'newest'" in bad.stderr


def test_pyproject_agrees_with_the_table_and_has_no_axolotl_entry_point():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    axolotl = [Requirement(r) for r in project["dependencies"] if r.startswith("axolotl")]
    deepspeed = [Requirement(r) for r in project["optional-dependencies"]["deepspeed"]]
    for s in STACKS.values():
        env = {"python_version": s.python}
        assert [str(r.specifier) for r in axolotl if r.marker.evaluate(env)] == [f"=={s.axolotl}"]
        assert [r.specifier for r in deepspeed if r.marker.evaluate(env)] == [Requirement(f"x{s.deepspeed}").specifier]
    # axolotl 0.21 runs the register(cfg) of every `axolotl.plugins` entry point for EVERY config; ours sets
    # trainer_cls, so it must only run when a config lists the plugin
    assert "axolotl.plugins" not in project.get("entry-points", {})


def test_the_plugin_freezes_the_collector_as_the_processs_last_exit_step():
    """GRPOPlugin.register() makes gc.freeze() the last exit step (compat/quick_exit.py): the host's exit handlers,
    registered after it, still run before it with the collector untouched; only the teardown that follows sees a
    frozen heap (the ~15 s final collection of a trainer process skipped)."""
    code = """if True:
        import atexit, gc
        start = gc.get_freeze_count()  # (the interpreter's own start-up may freeze a few hundred)
        atexit.register(lambda: print("teardown sees frozen objects:", gc.get_freeze_count() > start, flush=True))
        from grpo_plugin.plugin import GRPOPlugin
        GRPOPlugin().register({})
        GRPOPlugin().register({})  # registered once per process, however often the host calls register()
        atexit.register(lambda: print("host handler sees frozen objects:", gc.get_freeze_count() > start,
                                      flush=True))
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "AXOLOTL_DO_NOT_TRACK": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [x for x in out.stdout.splitlines() if "sees frozen" in x]
    assert lines == ["host handler sees frozen objects: False", "teardown sees frozen objects: True"], out.stdout
