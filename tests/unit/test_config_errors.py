"""A config the plugin refuses: every problem in one pass, printed as one block without a traceback
(config/errors.py, args.py `every_problem`)."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import yaml
from pydantic import ValidationError

from grpo_plugin.config.errors import block
from tests.conftest import ROOT
from tests.unit.test_args import base_cfg, load  # noqa: F401  (base_cfg: a fixture)

BIN = __import__("pathlib").Path(sys.executable).parent


def _three_problems(cfg: dict) -> dict:
    """A typo in grpo:, one in trl:, and a reward function that does not exist: three checks that used to stop at
    the first."""
    cfg = copy.deepcopy(cfg)
    cfg["grpo"]["sync_intervall"] = 2
    cfg["trl"]["num_generation"] = 4
    cfg["trl"]["reward_funcs"] = ["rewards.toy.no_such_reward"]
    return cfg


def test_every_problem_is_found_in_one_pass(base_cfg, tmp_path):  # noqa: F811
    with pytest.raises(ValidationError) as err:
        load(_three_problems(base_cfg), tmp_path)
    text = str(err.value)
    assert "grpo_plugin found 3 problem(s) in the config" in text, text
    assert "did you mean grpo.sync_interval" in text
    assert "Did you mean trl.num_generations?" in text
    assert "no_such_reward" in text


def test_the_block_names_every_problem_and_no_frame(base_cfg, tmp_path):  # noqa: F811
    with pytest.raises(ValidationError) as err:
        load(_three_problems(base_cfg), tmp_path)
    text = block(err.value)
    assert text is not None and text.startswith("[grpo_plugin] the config cannot be used"), text
    items = [line for line in text.splitlines() if line.startswith("  - ")]
    assert len(items) == 3, text
    assert "Traceback" not in text and 'File "' not in text
    assert block(ValueError("not a config error")) is None  # anything else keeps its traceback


def test_axolotl_train_prints_the_block_and_exits_non_zero_without_a_traceback(base_cfg, tmp_path):  # noqa: F811
    """As the user runs it (one process: accelerate's launcher adds its own report of the failed subprocess)."""
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_three_problems(base_cfg)))
    env = {**__import__("os").environ, "PATH": f"{BIN}:{__import__('os').environ.get('PATH', '')}"}
    proc = subprocess.run([str(BIN / "axolotl"), "train", str(path), "--launcher", "python"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "[grpo_plugin] the config cannot be used; nothing was loaded" in proc.stderr, proc.stderr[-3000:]
    assert "did you mean grpo.sync_interval" in proc.stderr and "trl.num_generations" in proc.stderr


@pytest.mark.parametrize(("key", "says"), [
    ("delta", "nothing in axolotl's config replaces it"),  # TRL settings, not typos: no "did you mean"
    ("top_entropy_quantile", "nothing in axolotl's config replaces it"),
    ("shuffle_dataset", "nothing in axolotl's config replaces it"),
    ("max_prompt_length", "Instead: shorten or filter long prompts in the dataset transform"),
    ("num_generation", "Did you mean trl.num_generations?"),  # a typo still gets its guess
])
def test_a_refused_trl_key_says_what_to_use_instead_or_that_nothing_does(key, says):
    from grpo_plugin.config.checks import trl_problems

    (problem,) = trl_problems({key: 1})
    assert problem.startswith(f"trl.{key}: ") and says in problem, problem
    if key != "num_generation":
        assert "Did you mean" not in problem, problem
