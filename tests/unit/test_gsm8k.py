"""GSM8K reward and transform, on the real GSM8K files (../shared/data/gsm8k, else the copy in tests/data)."""

from __future__ import annotations

import gzip
import json
import random
import re
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

import pytest

from rewards.gsm8k import (
    accuracy_reward,
    format_reward,
    gold_answer,
    gsm8k_transform,
    parse_number,
)
from tests.conftest import ROOT, axolotl_load_cfg


def _gsm8k_file(split: str) -> Path:
    for candidate in (ROOT.parent / "shared" / "data" / "gsm8k" / f"{split}.jsonl",
                      ROOT / "tests" / "data" / "gsm8k" / f"{split}.jsonl.gz"):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"GSM8K {split} split not found")


def _rows(split: str) -> list[dict]:
    path = _gsm8k_file(split)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return _rows("train") + _rows("test")


def test_every_ground_truth_parses(rows):
    assert len(rows) == 7473 + 1319
    golds = [gold_answer(r["answer"]) for r in rows]
    assert all(re.fullmatch(r"-?\d+(\.\d+)?", g) for g in golds)
    # "#### 1,000,000" style answers lose their separators
    assert gold_answer("... #### 1,000,000") == "1000000"


def test_every_gold_solution_scores_correct_in_every_format(rows):
    golds = [gold_answer(r["answer"]) for r in rows]
    solutions = [r["answer"] for r in rows]
    assert accuracy_reward(solutions, answer=golds) == [1.0] * len(rows)
    for fmt in ("\\boxed{{{g}}}", "The answer is ${g}.", "<answer>{g}</answer>", "so it is {g} apples",
                "Final answer: {g}\n"):
        completions = [[{"role": "assistant", "content": "Let me think. 3 + 4 = 7.\n" + fmt.format(g=g)}]
                       for g in golds]
        assert accuracy_reward(completions, answer=golds) == [1.0] * len(rows), fmt


def test_perturbed_answers_score_wrong(rows):
    rng = random.Random(0)
    golds = [gold_answer(r["answer"]) for r in rows]
    wrong = []
    for r, g in zip(rows, golds):
        value = Fraction(g)
        bad = rng.choice([value + 1, value - 1, value * 10, value + Fraction(1, 2), -value - 1])
        wrong.append(r["answer"].rsplit("####", 1)[0] + f"#### {float(bad) if bad.denominator > 1 else bad}")
    assert accuracy_reward(wrong, answer=golds) == [0.0] * len(rows)


@pytest.mark.parametrize(("completion", "gold", "expected"), [
    ("#### 72", "72", 1.0),
    ("#### 72.0", "72", 1.0),
    ("#### $72", "72", 1.0),
    ("#### 72 clips.", "72", 1.0),
    ("The answer is 1,234.", "1234", 1.0),
    ("The answer is 1234.50 dollars", "1234.5", 1.0),
    ("\\boxed{\\frac{3}{4}}", "0.75", 1.0),
    ("\\boxed{\\dfrac{144}{2}}", "72", 1.0),
    ("<answer> 144/2 </answer>", "72", 1.0),
    ("\\boxed{\\sqrt{4}}", "2", 1.0),  # math-verify reads what the plain parser cannot
    ("\\boxed{2^{3}}", "8", 1.0),
    ("#### \u22125", "-5", 1.0),  # unicode minus
    ("It is 5. No wait, 7.", "7", 1.0),  # no marker: the last number
    ("#### 72", "#### 72", 1.0),  # a raw GSM8K solution as the answer column
    ("#### 73", "72", 0.0),
    ("\\boxed{\\sqrt{9}}", "2", 0.0),
    ("#### 7/0", "7", 0.0),
    ("The answer is unclear", "7", 0.0),
])
def test_answer_extraction_and_equality_in_value(completion, gold, expected):
    assert accuracy_reward([completion], answer=[gold]) == [expected]


@pytest.mark.parametrize("odd", ["", None, 42, {"content": None}, [], [{}], [[{"x": 1}]], "💥" * 1000,
                                 "9" * 100_000, "1" * 50 + "/" + "0", "\\boxed{" * 5000, "#### " + "\x00" * 10,
                                 "\\boxed{\\sqrt{\\sqrt{\\sqrt{" * 200])
def test_odd_inputs_score_zero_without_raising(odd):
    assert accuracy_reward([odd], answer=["7"]) == [0.0]
    assert format_reward([odd]) in ([0.0], [0.5], [1.0])


def test_odd_gold_scores_zero():
    assert accuracy_reward(["#### 7", "#### 7"], answer=[None, "no number"]) == [0.0, 0.0]
    assert accuracy_reward(["#### 7"], answer="7") == [1.0]  # a single gold for all completions


def test_format_reward():
    assert format_reward(["work\n#### 72", "work\n####  1,234 \n\n", "\\boxed{3}", "The answer is 4", "72",
                          [{"role": "assistant", "content": "x\n#### 9"}]]) == [1.0, 1.0, 0.5, 0.5, 0.0, 1.0]


def test_safe_in_threads():
    """Reward workers / threads: math-verify must not need signal.alarm (main-thread only)."""
    cases = [("\\boxed{\\sqrt{16}}", "4"), ("\\boxed{2^{5}}", "32"), ("#### 3", "4")] * 20
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda c: accuracy_reward([c[0]], answer=[c[1]])[0], cases))
    assert got == [1.0, 1.0, 0.0] * 20


def test_parse_number():
    assert parse_number("$1,234.50") == Fraction(246_9, 2)
    assert parse_number("\\frac{1}{3}") == Fraction(1, 3)
    assert parse_number("no digits") is None


def test_transform_loads_through_axolotl_and_makes_chat_prompts(tiny_model_dir, tmp_path):
    """`type: rewards.gsm8k_transform` as axolotl 0.19 loads it (its dotted-path loader, its dataset mapping),
    and the deeper path `rewards.gsm8k.gsm8k_transform` fails there — which is why the docs name the first."""
    import yaml
    from axolotl.loaders import load_tokenizer
    from axolotl.prompt_strategies.dpo import load as load_dpo
    from axolotl.utils.data.rl import prepare_preference_datasets

    data = tmp_path / "gsm8k.jsonl"
    rows = _rows("test")[:16]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = {
        "base_model": str(tiny_model_dir), "plugins": ["grpo_plugin.GRPOPlugin"], "rl": "grpo",
        "grpo": {"sync": "restart"},
        "trl": {"num_generations": 4, "max_completion_length": 8,
                "reward_funcs": ["rewards.gsm8k.accuracy_reward", "rewards.gsm8k.format_reward"],
                "reward_weights": [1.0, 0.2]},
        "datasets": [{"path": str(data), "ds_type": "json", "split": "train", "type": "rewards.gsm8k_transform"}],
        "micro_batch_size": 4, "gradient_accumulation_steps": 1, "max_steps": 1, "learning_rate": 1e-5,
        "sequence_len": 512, "output_dir": str(tmp_path / "out"),
        "dataset_prepared_path": str(tmp_path / "prepared"),
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    loaded = axolotl_load_cfg(path)
    train, _ = prepare_preference_datasets(loaded, load_tokenizer(loaded))
    assert len(train) == 16 and "question" not in train.column_names
    by_question = {r["question"]: gold_answer(r["answer"]) for r in rows}
    for example in train:  # axolotl shuffles: match by question
        system, user = example["prompt"]
        assert system["role"] == "system" and user["role"] == "user"
        assert example["answer"] == by_question[user["content"]]
    assert load_dpo("rewards.gsm8k.gsm8k_transform", loaded, dataset_idx=0) is None  # the quirk, documented


def test_transform_system_prompt_override():
    transform, kwargs = gsm8k_transform({"datasets": [{"system_prompt": "Be brief."}]}, dataset_idx=0)
    out = transform({"question": "1+1?", "answer": "x #### 2"})
    assert out["prompt"][0] == {"role": "system", "content": "Be brief."} and out["answer"] == "2"
    assert kwargs == {"remove_columns": ["question"]}
