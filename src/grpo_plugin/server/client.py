"""HTTP client for the stock vLLM OpenAI server our serve module runs.

Only vLLM's own endpoints are used: `/health`, `/v1/models`, `/v1/completions` (token-id prompts, sampled
token ids + logprobs, prompt logprobs for the sync probe), `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`
(runtime LoRA), `/reset_prefix_cache` and `/collective_rpc` (dev mode; the worker extension's reload). Every
unexpected reply raises `ServerError` naming the endpoint, the HTTP status and the server's message; a request that
did not get through the connection (refused, reset, dropped, timed out, or an upload the server received corrupted)
raises its subclass `LinkError` (server/recovery.py tells a dead server from a failed link by asking /health).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import requests
from requests.adapters import HTTPAdapter

from grpo_plugin.config.options import GENERATE_FIELDS
from grpo_plugin.config.storage import CORRUPT_UPLOAD_STATUS
from grpo_plugin.server.files import SharedFiles, chunks


class ServerError(RuntimeError):
    """The vLLM server answered something we cannot use (or did not answer)."""


class ServerLost(ServerError):
    """The server stopped answering while a request was in flight (its process exited, or it hung)."""


class LinkError(ServerError):
    """The request did not get through the connection to the server: refused, reset or dropped, timed out, or (an
    upload) received with another sha256 than the trainer sent. The server may be gone, or only the link failed."""


class CorruptUpload(LinkError):
    """The server received an upload whose bytes do not match the trainer's sha256, and kept nothing of it."""


# what requests raises when a request did not get through the connection (not an answer of the server's): refused,
# reset, a connect or a body send that timed out (ConnectTimeout is a ConnectionError), a reply cut short. Not a
# read timeout: the request got there and the server took longer than the client waits (a setting, not the link).
_ON_THE_LINK = (requests.ConnectionError, requests.exceptions.ChunkedEncodingError)
CONNECT_S = 20.0  # connecting, and each send of an upload's body: a link that moves nothing this long failed
REPLY_S = 60.0  # an upload's reply once its body is sent (the server hashes and writes as the bytes arrive)
SEND_TRIES = 3  # sends of one file before its failure is raised (server/recovery.py takes it from there)
RESEND_AFTER_S = 1.0  # the wait before the n-th resend: n times this
LOG = logging.getLogger("grpo_plugin")


def request_failed(what: str, base_url: str, exc: requests.RequestException) -> ServerError:
    """The error for a request to the server at `base_url` that raised `exc` (LinkError when it is the link's)."""
    kind = LinkError if isinstance(exc, _ON_THE_LINK) else ServerError
    return kind(f"{what} to the vLLM server at {base_url} failed: {exc}")


# Request fields `generate` decides (options.GENERATE_FIELDS): the sampling settings from its arguments, the rest
# because it reads the reply by them. `extra` (trl.generation_kwargs) may add other fields of vLLM's request, not
# change these.


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    server: int = 0  # which of several servers sampled it (server/group.py)


def _token_id(token: str) -> int:
    # With return_tokens_as_token_ids, vLLM spells each sampled token "token_id:<id>".
    if not token.startswith("token_id:"):
        raise ServerError(f"/v1/completions returned token {token!r} without its id")
    return int(token.split(":", 1)[1])


def in_daemon_thread(fn: Callable[..., Any], *args, **kwargs) -> Future:
    """Run `fn` in a new daemon thread; its result or exception arrives in the returned future. Not a
    ThreadPoolExecutor: the interpreter joins those at exit, waiting out a request nobody waits for any more."""
    future: Future = Future()

    def run() -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # handed to whoever waits on the future
                future.set_exception(exc)

    threading.Thread(target=run, name="grpo-client", daemon=True).start()
    return future


def completion_request(prompts: list[list[int]], *, model: str, n: int, max_tokens: int, temperature: float = 1.0,
                       top_p: float = 1.0, top_k: int | None = None, min_p: float | None = None,
                       repetition_penalty: float | None = None, seed: int | None = None,
                       extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """vLLM's /v1/completions request for token-id prompts, asking for the sampled token ids and their logprobs.
    `extra`: more fields of the request (its sampling parameters: stop_token_ids, presence_penalty, ...), none of
    GENERATE_FIELDS."""
    clash = sorted(set(extra or ()) & set(GENERATE_FIELDS))
    if clash:
        raise ValueError(f"generate(extra=...) may not set {clash}: generate() decides these request fields")
    payload: dict[str, Any] = {
        "model": model,
        "prompt": prompts,
        "n": n,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
    }
    optional = {"top_k": top_k, "min_p": min_p, "repetition_penalty": repetition_penalty, "seed": seed}
    payload.update({k: v for k, v in optional.items() if v is not None})
    payload.update(extra or {})
    return payload


def completions_of(body: Any, num_prompts: int, n: int) -> list[list[Completion]]:
    """A /v1/completions reply as `n` Completions per prompt, in the prompts' order."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or len(choices) != num_prompts * n:
        raise ServerError(
            f"/v1/completions returned {len(choices) if isinstance(choices, list) else choices!r} "
            f"choices for {num_prompts} prompts x n={n}"
        )
    out: list[list[Completion]] = [[None] * n for _ in range(num_prompts)]  # type: ignore[list-item]
    seen = [0] * num_prompts
    for ch in sorted(choices, key=lambda c: c["index"]):
        p, k = divmod(ch["index"], n)
        lp = ch.get("logprobs") or {}
        tokens, token_lps = lp.get("tokens"), lp.get("token_logprobs")
        if tokens is None or token_lps is None or len(tokens) != len(token_lps):
            raise ServerError(f"/v1/completions choice {ch['index']} has no per-token logprobs")
        out[p][k] = Completion(
            token_ids=[_token_id(t) for t in tokens],
            logprobs=[float(x) if x is not None and math.isfinite(x) else -1e4 for x in token_lps],
            finish_reason=ch.get("finish_reason"),
        )
        seen[p] += 1
    if any(s != n for s in seen):
        raise ServerError(f"/v1/completions returned an uneven number of choices per prompt: {seen}")
    return out


class VLLMServerClient:
    """`watch`: optional liveness check, called every `watch_every` seconds while a request is in flight; a
    reason (str) it returns ends the wait with ServerLost, so a hung server is noticed long before the request's
    own timeout. The abandoned request finishes in its thread when the server answers or is stopped; that thread
    is a daemon, so it never holds the process at exit (a server killed by its user can keep our connection open
    in its graceful shutdown until the request's own timeout: minutes)."""

    def __init__(self, base_url: str, timeout: float = 300.0):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        # seeded sampling sends a batch's prompts as concurrent requests: keep their connections (urllib3's default
        # pool of 10 drops the rest after each request)
        self.session.mount("http://", HTTPAdapter(pool_maxsize=64))
        self.watch: Callable[[], str | None] | None = None
        self.watch_every = 2.0
        self.health_timeout = 5.0
        self.files = SharedFiles()  # how a sync's files reach this server (server/files.py: shared or sent)
        self._adapter_dirs: dict[str, str] = {}  # adapter name -> the trainer's directory it was loaded from

    def fork(self) -> VLLMServerClient:
        """The same server on a new HTTP session (for another thread)."""
        other = VLLMServerClient(self.base_url, timeout=self.timeout)
        other.files = self.files
        return other

    # -- plumbing -------------------------------------------------------------------------------
    def _send(self, path: str, payload: dict[str, Any], timeout: float) -> requests.Response:
        url = f"{self.base_url}{path}"
        if self.watch is None:
            return self.session.post(url, json=payload, timeout=timeout)
        pending = in_daemon_thread(self.session.post, url, json=payload, timeout=timeout)
        while True:
            try:
                return pending.result(timeout=self.watch_every)
            except FutureTimeout:
                why = self.watch()
                if why:
                    raise ServerLost(f"POST {path} to the vLLM server at {self.base_url}: {why}") from None

    def _post(self, path: str, payload: dict[str, Any], timeout: float | None = None) -> requests.Response:
        try:
            resp = self._send(path, payload, timeout or self.timeout)
        except requests.RequestException as exc:
            raise request_failed(f"POST {path}", self.base_url, exc) from exc
        if resp.status_code != 200:
            raise ServerError(f"POST {path} -> HTTP {resp.status_code}: {resp.text[:500]}")
        return resp

    def _get_json(self, path: str, params: dict[str, Any] | None = None, timeout: float = 30) -> Any:
        try:
            resp = self.session.get(f"{self.base_url}{path}", params=params, timeout=timeout)
        except requests.RequestException as exc:
            raise request_failed(f"GET {path}", self.base_url, exc) from exc
        if resp.status_code != 200:
            raise ServerError(f"GET {path} -> HTTP {resp.status_code}: {resp.text[:300]}")
        return self._json(resp, path)

    def _json(self, resp: requests.Response, path: str) -> Any:
        try:
            return resp.json()
        except ValueError as exc:
            raise ServerError(f"{path} returned non-JSON: {resp.text[:200]!r}") from exc

    # -- health / models ------------------------------------------------------------------------
    def healthy(self) -> bool:
        try:
            return self.session.get(f"{self.base_url}/health", timeout=self.health_timeout).status_code == 200
        except requests.RequestException:
            return False

    def models(self) -> list[str]:
        return [m["id"] for m in self._models()]

    def _models(self) -> list[dict]:
        data = self._get_json("/v1/models").get("data")
        if not isinstance(data, list):
            raise ServerError(f"GET /v1/models returned no model list: {str(data)[:300]}")
        return data

    def base_model(self) -> str:
        """The name the server serves its base model under (the entry that is not a LoRA adapter)."""
        for m in self._models():
            if m.get("parent") is None:
                return m["id"]
        raise ServerError(f"the vLLM server at {self.base_url} lists no base model in /v1/models")

    # -- generation -----------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], *, n: int, seeds: list[int] | None = None,
                 **sampling: Any) -> list[list[Completion]]:
        """Sample `n` completions per token-id prompt. Returns one list of `n` Completions per prompt. `sampling`:
        completion_request's settings. `seeds`: one per prompt (grpo.seeded_sampling): each prompt goes in a
        request of its own with its seed (vLLM gives the i-th of its `n` samples seed + i), all at once."""
        payload = completion_request(prompts, n=n, **sampling)
        if seeds is None:
            return self._complete(payload, len(prompts), n)
        if "seed" in payload or len(seeds) != len(prompts):
            raise ValueError(f"generate(seeds=...): one seed per prompt ({len(prompts)}), and no `seed`")
        pending = [in_daemon_thread(self._complete, {**payload, "prompt": [p], "seed": s}, 1, n)
                   for p, s in zip(prompts, seeds)]
        return [f.result()[0] for f in pending]

    def _complete(self, payload: dict[str, Any], num_prompts: int, n: int) -> list[list[Completion]]:
        return completions_of(self._json(self._post("/v1/completions", payload), "/v1/completions"), num_prompts, n)

    def prompt_logprobs(self, token_ids: list[int], *, model: str) -> list[float]:
        """Logprob of token t given tokens < t, for t = 1..len-1 (the sync probe)."""
        payload = {
            "model": model,
            "prompt": [token_ids],
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 0,
        }
        body = self._json(self._post("/v1/completions", payload), "/v1/completions")
        try:
            entries = body["choices"][0]["prompt_logprobs"]
        except (KeyError, IndexError, TypeError) as exc:
            raise ServerError(f"/v1/completions gave no prompt_logprobs: {str(body)[:300]}") from exc
        if entries is None or len(entries) != len(token_ids):
            raise ServerError("/v1/completions prompt_logprobs do not cover the probe")
        out = []
        for tok, entry in zip(token_ids[1:], entries[1:]):
            item = entry.get(str(tok)) if isinstance(entry, dict) else None
            if item is None:
                raise ServerError(f"prompt_logprobs lack the probe token {tok}")
            out.append(float(item["logprob"] if isinstance(item, dict) else item))
        return out

    # -- weight sync ----------------------------------------------------------------------------
    def load_lora_adapter(self, name: str, path: str, *, inplace: bool = False) -> None:
        """`path`: the trainer's adapter directory (sent first to a server that cannot read it)."""
        served = self.files.server_path(self, path)
        self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": served, "load_inplace": inplace})
        self._adapter_dirs[name] = path

    def unload_lora_adapter(self, name: str, *, timeout: float | None = None) -> None:
        self._post("/v1/unload_lora_adapter", {"lora_name": name}, timeout=timeout)
        local = self._adapter_dirs.pop(name, None)
        if local is not None:
            self.files.forget(self, local)

    # -- files for a server that cannot read the sync directory (server/files.py, in_vllm/uploads.py) -------
    def sees(self, path: str, nonce: str) -> tuple[bool, str]:
        """Whether the server reads the file `path` (holding `nonce`) the trainer wrote: (yes, why not)."""
        try:
            body = self._json(self._post("/grpo/sees", {"path": path, "nonce": nonce}, timeout=60), "/grpo/sees")
        except ServerError as exc:
            if "HTTP 404" in str(exc):
                raise ServerError(f"the vLLM server at {self.base_url} has no grpo_plugin routes (/grpo/sees): it "
                                  "was not started by `axolotl vllm-serve <config.yaml>` or grpo.managed_server "
                                  f"(or by an older grpo_plugin). Server reply: {exc}") from exc
            raise
        return bool(body.get("sees")), str(body.get("why", ""))

    def send_file(self, name: str, path, sha256: str) -> tuple[str, int]:
        """Stream the file `path` to the server as `<dir>/<file>` (`name`): (the server's directory, bytes). A
        send that failed on the link (LinkError: the connection refused, reset or stalled, or the bytes arrived
        corrupted: the server kept nothing) is made again, SEND_TRIES times in all, RESEND_AFTER_S apart, each
        retry logged; the last failure is raised. A body that moves nothing for CONNECT_S seconds fails (the
        socket's timeout while sending): a dropped link is not waited out for the request's whole timeout."""
        attempt = 1
        while True:
            try:
                return self._send_file_once(name, path, sha256)
            except LinkError as exc:
                if attempt >= SEND_TRIES:
                    raise
                LOG.warning("grpo_plugin: sending %s to the vLLM server at %s failed (%s); sending it again in %g s "
                            "(try %d of %d)", name, self.base_url, exc, RESEND_AFTER_S * attempt, attempt + 1,
                            SEND_TRIES)
                time.sleep(RESEND_AFTER_S * attempt)
                attempt += 1

    def _send_file_once(self, name: str, path, sha256: str) -> tuple[str, int]:
        where = f"/grpo/files/{name}"
        try:
            resp = self.session.put(f"{self.base_url}{where}", data=chunks(path),
                                    timeout=(CONNECT_S, min(self.timeout, REPLY_S)),
                                    headers={"X-GRPO-SHA256": sha256, "Content-Type": "application/octet-stream"})
        except requests.ReadTimeout as exc:  # the server answers an upload as soon as its last bytes are in
            raise LinkError(f"PUT {where} to the vLLM server at {self.base_url}: no reply within "
                            f"{min(self.timeout, REPLY_S):g} s of the last byte sent ({exc})") from exc
        except requests.RequestException as exc:
            raise request_failed(f"PUT {where}", self.base_url, exc) from exc
        if resp.status_code == CORRUPT_UPLOAD_STATUS:
            raise CorruptUpload(f"PUT {where} to the vLLM server at {self.base_url} -> HTTP {resp.status_code}: "
                                f"{resp.text[:500]}")
        if resp.status_code != 200:
            raise ServerError(f"PUT {where} -> HTTP {resp.status_code}: {resp.text[:500]}")
        body = self._json(resp, where)
        return str(body["path"]), int(body["bytes"])

    def delete_sent(self, name: str) -> bool:
        """Remove the directory `name` sent earlier from the server: whether it was there."""
        try:
            resp = self.session.delete(f"{self.base_url}/grpo/files/{name}", timeout=60)
        except requests.RequestException as exc:
            raise request_failed(f"DELETE /grpo/files/{name}", self.base_url, exc) from exc
        if resp.status_code != 200:
            raise ServerError(f"DELETE /grpo/files/{name} -> HTTP {resp.status_code}: {resp.text[:300]}")
        return bool(self._json(resp, f"/grpo/files/{name}").get("removed"))

    def reset_prefix_cache(self) -> None:
        """vLLM answers HTTP 200 with `{"success": false}` when running requests still hold KV blocks (e.g. an
        Atropos environment generating during a sync): that is a failed reset, and old KV could be reused."""
        resp = self._post("/reset_prefix_cache", {}, timeout=min(self.timeout, 60.0))  # milliseconds when healthy
        body = self._json(resp, "/reset_prefix_cache") if resp.content else {}
        if isinstance(body, dict) and body.get("success") is False:
            raise ServerError("POST /reset_prefix_cache -> success: false: requests were still running on the "
                              "server, so KV computed with the old weights could be reused. Generation must be "
                              "paused around a weight sync when other clients use the server.")

    def pause(self, *, mode: str = "wait", clear_cache: bool = True) -> None:
        """vLLM's dev-mode `/pause`: `wait` lets in-flight requests finish, queues new ones until `/resume`;
        `clear_cache` drops the prefix cache once drained."""
        self._post(f"/pause?mode={mode}&clear_cache={str(clear_cache).lower()}", {})

    def resume(self) -> None:
        self._post("/resume", {})

    def interrupt(self) -> None:
        """End every generation request on the server now (vLLM's `/pause?mode=abort`, then `/resume`): each
        returns what it sampled so far, finish reason "abort" (streaming's in-flight updates, sync/gate.py)."""
        try:
            self.pause(mode="abort", clear_cache=False)
        except ServerError as exc:
            if "HTTP 404" in str(exc):
                raise ServerError(f"the vLLM server at {self.base_url} has no /pause route: "
                                  "trl.streaming_partial_batch interrupts the rollouts in flight at each push through "
                                  "vLLM's /pause?mode=abort, which a server serves in dev mode only "
                                  "(VLLM_SERVER_DEV_MODE=1). Start it with "
                                  "`axolotl vllm-serve <config.yaml>` (or grpo.managed_server: true), or remove "
                                  f"trl.streaming_partial_batch. Server reply: {exc}") from exc
            raise
        self.resume()

    # -- policy versions (grpo_plugin's routes, in_vllm/routes.py) -----------------------------------
    def set_policy(self, version: int, model: str | None) -> None:
        """Tell the server which policy version it now computes with, and the model name that serves it."""
        try:
            self._post("/grpo/policy", {"version": int(version), "model": model})
        except ServerError as exc:
            if "HTTP 404" in str(exc) and "is not served" not in str(exc):
                raise ServerError(f"the vLLM server at {self.base_url} has no grpo_plugin routes (/grpo/policy): it "
                                  "was not started by `axolotl vllm-serve <config.yaml>` or grpo.managed_server. "
                                  f"Server reply: {exc}") from exc
            raise

    def policy_versions(self, fingerprints: list[str]) -> list[int | None]:
        """The policy version that produced each sequence the server's /generate returned (None: unknown)."""
        body = self._json(self._post("/grpo/policy_versions", {"fingerprints": fingerprints}),
                          "/grpo/policy_versions")
        versions = body.get("versions") if isinstance(body, dict) else None
        if not isinstance(versions, list) or len(versions) != len(fingerprints):
            raise ServerError(f"/grpo/policy_versions returned {str(body)[:200]} for {len(fingerprints)} sequences")
        return versions

    def server_info(self) -> dict:
        """vLLM's dev-mode `/server_info` (the engine's config as JSON)."""
        return self._get_json("/server_info", params={"config_format": "json"}, timeout=60)

    def worker_extension(self) -> str | None:
        """The `--worker-extension-cls` the server's workers were started with (None if none)."""
        config = self.server_info().get("vllm_config")
        if not isinstance(config, dict):
            raise ServerError("/server_info has no vllm_config")
        return (config.get("parallel_config") or {}).get("worker_extension_cls") or None

    def collective_rpc(self, method: str, kwargs: dict[str, Any] | None = None,
                       timeout: float | None = None, paths: dict[str, str] | None = None) -> list[Any]:
        """Call `method` on every vLLM worker (dev mode `/collective_rpc`); one result per worker. `paths`: more
        keyword arguments that are directories of the trainer's (this server gets its own path to each)."""
        kwargs = {**(kwargs or {}), **{k: self.files.server_path(self, v) for k, v in (paths or {}).items()}}
        payload: dict[str, Any] = {"method": method, "kwargs": kwargs}
        if timeout is not None:
            payload["timeout"] = timeout
        resp = self._post("/collective_rpc", payload, timeout=timeout)
        if not resp.content:
            return []
        results = self._json(resp, "/collective_rpc").get("results")
        if not isinstance(results, list):
            raise ServerError(f"/collective_rpc {method} returned no results: {resp.text[:300]}")
        return results
