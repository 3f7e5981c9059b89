"""Truncated sampling (trl.top_k / top_p / min-p) is said at start-up: the importance-sampling ratio sits below 1 by
the mass the truncation drops (config/defaults.py `truncation_note`)."""

from __future__ import annotations

import logging

import pytest

from grpo_plugin.config.defaults import fill_defaults, truncated_by, truncation_note


@pytest.mark.parametrize(("trl", "found"), [
    ({}, []),
    ({"top_k": 0, "top_p": 1.0, "min_p": 0.0}, []),  # TRL's "off" values
    ({"top_k": -1, "min_p": None}, []),  # vLLM's "off"
    ({"top_k": 20}, ["trl.top_k=20"]),
    ({"top_p": 0.9, "min_p": 0.05}, ["trl.top_p=0.9", "trl.min_p=0.05"]),
    ({"top_k": "x"}, []),  # not a number: validation says so, not this note
])
def test_the_settings_that_truncate(trl, found):
    assert truncated_by(trl) == found
    assert (truncation_note(trl) is None) == (not found)


def test_a_run_with_top_k_is_told_what_its_ratio_means(caplog):
    cfg = {"rl": "grpo", "trl": {"top_k": 20, "temperature": 1.0}}
    with caplog.at_level(logging.WARNING, logger="grpo_plugin"):
        fill_defaults(cfg)
    text = caplog.text
    assert "trl.top_k=20 truncates the distribution vLLM samples from" in text, text
    assert "sampling/importance_sampling_ratio/mean" in text and "not stale weights" in text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="grpo_plugin"):
        fill_defaults({"rl": "grpo", "trl": {"temperature": 1.0}})
    assert "truncates" not in caplog.text
