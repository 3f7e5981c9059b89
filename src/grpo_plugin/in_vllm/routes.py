"""Routes the grpo_plugin adds to the stock vLLM OpenAI server, through vLLM's own `--middleware` flag
(the serve module and the managed server pass `--middleware grpo_plugin.in_vllm.routes.grpo_routes`).

- `POST /generate` — the token-level route Atropos environments call with `server_type: vllm`
  (atroposlib's VLLMServer / ManagedServer): body `{"prompt": {"prompt_token_ids": [...]} | "text", "logprobs": k,
  "n", "max_tokens", "temperature", ...vLLM SamplingParams}`; reply `{"text": [...], "finish_reasons": [...],
  "token_ids": [[...]], "prompt_token_ids": [...], "logprobs": [[[{id: lp}, ...] per token] per completion],
  "prompt_logprobs": [...] (if asked), "policy_version": v}`. The sampled token is always the first entry of
  its position (atroposlib reads the first key as the token id). Generation uses the CURRENT policy: the model
  the trainer announced (in `lora_sync` its adapter), else the base model.
- `POST /grpo/policy {"version": int, "model": str|null}` / `GET /grpo/policy` — the trainer announces the
  policy version the server now computes with (inside its sync fence) and the model name that serves it.
- vLLM's OpenAI routes (`/v1/completions`, `/v1/chat/completions`) that name the BASE model while the trainer has
  announced an adapter (Atropos with `lora_sync`: environments and their evals often name the base model) are
  served by that adapter: the request's `model` is replaced before vLLM reads it. Without this they sampled the
  base model (off-policy data), and on vLLM-CPU a batch mixing base-named rows with adapter rows gives the base
  rows an adapter (rows without a LoRA index slot -1): a mix of base and policy. Requests naming an adapter, or
  sent while no adapter is announced, pass unchanged.
- `POST /grpo/policy_versions {"fingerprints": [...]}` → `{"versions": [int|null, ...]}` — which version
  produced each sequence `/generate` returned (in_vllm/ledger.py).
- `POST /grpo/sees`, `PUT /grpo/files/<dir>/<file>`, `DELETE /grpo/files/<dir>` — whether this server reads the
  trainer's sync directory, and the weights sent over HTTP when it does not (in_vllm/uploads.py).

State lives in this API-server process (vLLM's default of one API server; `--api-server-count > 1` would
split it). Logprobs are what the server was started with: our servers use `--logprobs-mode processed_logprobs`,
i.e. after temperature, as the trainer scores them.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from grpo_plugin.in_vllm import uploads
from grpo_plugin.in_vllm.ledger import Ledger

POLICY: dict[str, Any] = {"version": None, "model": None}
LEDGER = Ledger()


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def grpo_routes(request: Request, call_next):
    """vLLM `--middleware` function: answers our routes, passes everything else to vLLM."""
    path, method = request.url.path, request.method
    if path == "/generate" and method == "POST":
        return await _generate(request)
    if path == "/grpo/policy":
        return await _policy(request) if method == "POST" else JSONResponse(dict(POLICY, ledger_size=len(LEDGER)))
    if path == "/grpo/policy_versions" and method == "POST":
        return await _policy_versions(request)
    if path == "/grpo/sees" and method == "POST":
        return await uploads.sees(request)
    if path.startswith(uploads.PREFIX):
        return await uploads.files(request)
    if path in OPENAI_ROUTES and method == "POST" and POLICY["model"] is not None:
        await _serve_the_policy(request)
    return await call_next(request)


OPENAI_ROUTES = ("/v1/completions", "/v1/chat/completions")


async def _serve_the_policy(request: Request) -> None:
    """A request naming the base model is served by the announced adapter: its body's `model` replaced. Starlette
    replays a body the middleware has read (`request._body`) to vLLM's handler; anything not a JSON object naming
    a base model is left for vLLM to answer."""
    raw = await request.body()
    try:
        body = json.loads(raw)
    except ValueError:
        return
    if not isinstance(body, dict):
        return
    name, served = body.get("model"), _served(request)
    if name is None or (isinstance(name, str) and name in served and served[name] is None):  # the base model
        body["model"] = POLICY["model"]
        request._body = json.dumps(body).encode()


async def _json_body(request: Request) -> dict | JSONResponse:
    try:
        body = await request.json()
    except ValueError as exc:
        return _error(400, f"{request.url.path}: the body is not JSON ({exc})")
    if not isinstance(body, dict):
        return _error(400, f"{request.url.path}: the body must be a JSON object")
    return body


async def _policy(request: Request) -> JSONResponse:
    body = await _json_body(request)
    if isinstance(body, JSONResponse):
        return body
    version, model = body.get("version"), body.get("model")
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        return _error(400, f"/grpo/policy: `version` must be an integer >= 0, got {version!r}")
    if model is not None:
        known = _served(request)
        if model not in known:
            return _error(404, f"/grpo/policy: model {model!r} is not served here (served: {sorted(known)})")
    POLICY.update(version=version, model=model)
    return JSONResponse(dict(POLICY))


async def _policy_versions(request: Request) -> JSONResponse:
    body = await _json_body(request)
    if isinstance(body, JSONResponse):
        return body
    fps = body.get("fingerprints")
    if not isinstance(fps, list) or not all(isinstance(x, str) for x in fps):
        return _error(400, "/grpo/policy_versions: `fingerprints` must be a list of strings")
    return JSONResponse({"versions": LEDGER.lookup(fps)})


def _served(request: Request) -> dict[str, Any]:
    """Served model name → LoRARequest (None for a base model)."""
    models = request.app.state.openai_serving_models
    served: dict[str, Any] = {p.name: None for p in models.base_model_paths}
    served.update(models.lora_requests)
    return served


async def _generate(request: Request) -> JSONResponse:
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    body = await _json_body(request)
    if isinstance(body, JSONResponse):
        return body
    prompt = body.pop("prompt", None)
    if isinstance(prompt, dict) and isinstance(prompt.get("prompt_token_ids"), list):
        ids = prompt["prompt_token_ids"]
        if not ids or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            return _error(400, "/generate: prompt.prompt_token_ids must be a non-empty list of token ids")
        engine_prompt: Any = {"prompt_token_ids": ids}
    elif isinstance(prompt, str) and prompt:
        engine_prompt = prompt
    else:
        return _error(400, "/generate: `prompt` must be {\"prompt_token_ids\": [...]} or a non-empty string")
    if body.pop("stream", False):
        return _error(400, "/generate: streaming is not supported by the grpo_plugin server")
    served = _served(request)
    name = body.pop("model", None) or POLICY["model"]
    if name is None:
        lora = None
    elif name in served:
        lora = served[name]
    else:
        return _error(404, f"/generate: model {name!r} is not served here (served: {sorted(served)})")
    if "output_kind" in body:
        return _error(400, "/generate: `output_kind` is set by the server")
    try:
        # FINAL_ONLY: one output holding all n completions (cumulative outputs of parallel sampling arrive per
        # child, so the last one may not hold them all)
        params = SamplingParams(**body, output_kind=RequestOutputKind.FINAL_ONLY)
    except Exception as exc:  # TypeError (unknown key), vLLM's validation errors (bad value)
        return _error(400, f"/generate: bad sampling parameters: {exc}")

    version = POLICY["version"]  # the policy this request is admitted under (announced inside the sync fence)
    final = None
    try:
        async for out in request.app.state.engine_client.generate(
                engine_prompt, params, f"grpo-generate-{uuid.uuid4().hex}", lora_request=lora):
            final = out
    except Exception as exc:
        from vllm.exceptions import VLLMClientError

        if isinstance(exc, (VLLMClientError, ValueError, TypeError)):  # the request's fault (prompt too long, ...)
            return _error(400, f"/generate: {exc}")
        raise
    if final is None:
        return _error(500, "/generate: the engine returned no output")

    prompt_ids = list(final.prompt_token_ids or [])
    outputs = final.outputs
    if version is not None:
        LEDGER.record([prompt_ids + list(o.token_ids) for o in outputs], version)
    reply: dict[str, Any] = {
        "text": [o.text for o in outputs],
        "finish_reasons": [o.finish_reason for o in outputs],
        "token_ids": [list(o.token_ids) for o in outputs],
        "prompt_token_ids": prompt_ids,
        "policy_version": version,
        "model": name,
    }
    if params.logprobs is not None:
        reply["logprobs"] = [_sampled_first(o.token_ids, o.logprobs) for o in outputs]
    if params.prompt_logprobs is not None:
        reply["prompt_logprobs"] = [
            None if pos is None else {str(t): lp.logprob for t, lp in pos.items()}
            for pos in (final.prompt_logprobs or [])
        ]
    return JSONResponse(reply)


def _sampled_first(token_ids, logprobs) -> list[list[dict[str, float]]]:
    """Per token: [{sampled_id: lp}, {other_id: lp}, ...] (atroposlib reads the first entry as the token)."""
    out = []
    for tok, pos in zip(token_ids, logprobs or [], strict=True):
        entries = [{str(tok): pos[tok].logprob}]
        entries += [{str(t): lp.logprob} for t, lp in pos.items() if t != tok]
        out.append(entries)
    return out
