"""What the vLLM server would refuse in every generation request is found before the model loads
(config/request_check.py), by the installed vLLM's own request model and sampling parameters."""

from __future__ import annotations

import pytest

from grpo_plugin.config.request_check import request_of, request_problems

pytest.importorskip("vllm.entrypoints.openai.completion.protocol")


def test_a_request_the_server_accepts_passes():
    trl = {"num_generations": 8, "max_completion_length": 16, "temperature": 0.7, "top_p": 0.9, "top_k": 0,
           "min_p": 0.05, "repetition_penalty": 1.1, "generation_kwargs": {"stop": ["\n\n"], "presence_penalty": 0.5}}
    assert request_problems(trl) == []
    assert "top_k" not in request_of(trl)  # TRL's 0 means off: the plugin sends none


def test_what_the_server_refuses_is_named_by_its_config_key():
    problems = request_problems({"generation_kwargs": {"stop": [str(i) for i in range(26)]}})
    assert len(problems) == 1 and problems[0].startswith("trl.generation_kwargs.stop: the vLLM server refuses it: ")
    assert "at most 4 items" in problems[0]
    problems = request_problems({"top_p": 1.5})
    assert len(problems) == 1 and problems[0].startswith("trl.top_p: the vLLM server refuses it"), problems
    problems = request_problems({"generation_kwargs": {"presence_penalty": "lots"}})
    assert problems and problems[0].startswith("trl.generation_kwargs.presence_penalty: "), problems
