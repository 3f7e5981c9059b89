"""Code datasets: the transforms, reading code out of completions, HumanEval's conversion, and the dataset check
(`python -m grpo_plugin.codedata.check`) on a file with one row of every kind of problem."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from grpo_plugin.codedata.check import check_file
from grpo_plugin.codedata.extract import as_test_list, extract_code
from grpo_plugin.codedata.humaneval import test_cases as humaneval_tests
from rewards.code import code_execution_reward, code_input_output_transform, code_transform, soft_format_reward


def test_extract_code_takes_the_last_python_block():
    text = "Here:\n```python\nx = 1\n```\nbetter:\n```py\nx = 2\n```\nand a shell line\n```bash\nls\n```"
    assert extract_code(text) == "x = 2\n"
    assert extract_code([{"role": "assistant", "content": "```\ny = 3\n```"}]) == "y = 3\n"  # untagged block
    assert extract_code("def f(): return 1") == "def f(): return 1"  # no block: the whole completion
    assert extract_code(None) == ""


def test_test_cases_as_lists():
    assert as_test_list(["assert 1"]) == ["assert 1"]
    assert as_test_list(json.dumps(["assert 1", "assert 2"])) == ["assert 1", "assert 2"]
    assert as_test_list(None) is None and as_test_list("not json") is None and as_test_list([1]) is None
    assert as_test_list([]) is None and as_test_list(["  "]) is None


def test_transforms_make_chat_prompts_and_keep_tests():
    transform, kwargs = code_transform()
    row = transform({"instruction": "Write f.", "response": "def f(): ...", "test_cases": ["assert f() is None"]})
    assert [m["role"] for m in row["prompt"]] == ["system", "user"] and row["prompt"][1]["content"] == "Write f."
    assert json.loads(row["test_cases"]) == ["assert f() is None"] and row["reference"] == "def f(): ..."
    multi = transform({"instruction": "Write f.", "response": "def f(): return 1", "follow_up": "Now make it 2.",
                       "follow_up_response": "def f(): return 2", "test_cases": ["assert f() == 2"]})
    assert [m["role"] for m in multi["prompt"]] == ["system", "user", "assistant", "user"]
    assert multi["prompt"][-1]["content"] == "Now make it 2." and multi["reference"] == "def f(): return 2"
    io_transform, io_kwargs = code_input_output_transform({"datasets": [{"system_prompt": "Be brief."}]})
    io = io_transform({"input": "Write g.", "output": "def g(): pass"})
    assert io["prompt"][0]["content"] == "Be brief." and json.loads(io["test_cases"]) == []
    assert "input" in io_kwargs["remove_columns"] and "instruction" in kwargs["remove_columns"]


def test_rewards_never_raise_and_score_bad_input_zero():
    good = "```python\ndef add(a, b):\n    return a + b\n```"
    tests = json.dumps(["assert add(1, 2) == 3", "assert add(1, 1) == 3"])
    assert code_execution_reward([good, "```python\ndef add(:\n```", good, good],
                                 test_cases=[tests, tests, None, "garbage"]) == [0.5, 0.0, 0.0, 0.0]
    assert code_execution_reward([good], test_cases=None) == [0.0]  # the column is missing altogether
    assert soft_format_reward([good, "no code", "```python\ndef (\n```",
                               [{"role": "assistant", "content": good}]]) == [1.0, 0.0, 0.0, 1.0]


def test_humaneval_check_becomes_asserts():
    src = "\n\nMETADATA = {}\n\ndef check(candidate):\n    assert candidate(1) == 2\n    assert candidate(0) == 1\n"
    assert humaneval_tests(src, "inc") == ["assert inc(1) == 2", "assert inc(0) == 1"]
    loop = "def check(candidate):\n    for x in range(3):\n        assert candidate(x) == x + 1\n"
    assert humaneval_tests(loop, "inc") is None  # not one assert per test case: left out


ROWS = [
    {"instruction": "add", "response": "```python\ndef add(a, b):\n    return a + b\n```",
     "test_cases": ["assert add(1, 2) == 3"]},                                   # 1 ok
    "{not json",                                                                 # 2
    {"prompt": "add", "solution": "..."},                                        # 3 unknown fields
    {"instruction": "add", "response": "def add(a, b) return a + b", "test_cases": ["assert add(1, 2) == 3"]},  # 4
    {"instruction": "add", "response": "def add(a, b):\n    return a - b", "test_cases": ["assert add(1, 2) == 3",
                                                                                         "assert add(0, 0) == 0"]},  # 5
    {"instruction": "add", "response": "def add(a, b):\n    return a + b", "test_cases": ["assert add(1, 2) =="]},  # 6
    {"instruction": "add", "response": "def add(a, b):\n    return a + b"},       # 7 warning only
    {"input": "add", "output": "def add(a, b):\n    return a + b", "test_cases": ["assert add(2, 2) == 4"]},  # 8 ok
]


@pytest.fixture
def dataset(tmp_path):
    path = tmp_path / "code.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in ROWS))
    return path


def test_dataset_check_reports_every_problem_by_line(dataset):
    report = check_file(dataset, progress=open("/dev/null", "w"))  # noqa: SIM115
    by_line = {p["line"]: p for p in report["problems"]}
    assert set(by_line) == {2, 3, 4, 5, 6, 7}
    assert "not valid JSON" in by_line[2]["errors"][0]
    assert "no prompt field" in by_line[3]["errors"][0]
    assert "does not parse" in by_line[4]["errors"][0]
    assert [e.split(" (")[0] for e in by_line[5]["errors"]] == ["the reference fails its test 0"]  # test 1 passes
    assert "test 0 does not parse" in by_line[6]["errors"][0]
    assert by_line[7]["errors"] == [] and "no test_cases" in by_line[7]["warnings"][0]
    assert (report["rows"], report["ok"], report["rows_with_errors"], report["references_run"]) == (8, 3, 5, 3)


def test_dataset_check_command_exit_status(dataset, tmp_path):
    out = subprocess.run([sys.executable, "-m", "grpo_plugin.codedata.check", str(dataset)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 1 and "line 5: ERROR the reference fails its test 0" in out.stdout
    assert "8 rows, 3 ok, 5 with errors, 1 with warnings" in out.stdout
    clean = tmp_path / "clean.jsonl"
    clean.write_text(json.dumps(ROWS[0]) + "\n")
    ok = subprocess.run([sys.executable, "-m", "grpo_plugin.codedata.check", str(clean), "--json"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and json.loads(ok.stdout)["ok"] == 1


def test_sandbox_limits_come_from_the_environment(monkeypatch):
    import rewards.code as code

    monkeypatch.setattr(code, "_SANDBOX", None)
    for key, value in {"GRPO_SANDBOX_TIMEOUT_S": "1.5", "GRPO_SANDBOX_MEMORY_MB": "256", "GRPO_SANDBOX_SCRATCH_MB": "1",
                       "GRPO_SANDBOX_WORKERS": "1"}.items():
        monkeypatch.setenv(key, value)
    sb = code.sandbox()
    try:
        assert (sb.limits.wall_s, sb.limits.memory_mb, sb.limits.scratch_mb, sb.workers) == (1.5, 256, 1, 1)
        # the scratch space is 1 MiB: the second 600 KiB file does not fit
        res = sb.run([("n = 0\ntry:\n    for k in range(5):\n        open(f'f{k}', 'wb').write(b'x' * (600 << 10))\n"
                       "        n += 1\nexcept OSError:\n    pass\n", ["assert n == 1"])])[0]
        assert res.passed == [True], res
    finally:
        sb.close()
