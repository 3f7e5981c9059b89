"""HTTP client for the Atropos run-api (atroposlib's `run-api`), the trainer's side of it.

Facts it is built on (docs/atropos.md): `/register` does not reset anything (a second call only adds a
requester), `/reset_data` does (GET, plain text); the first `/batch` marks the trainer as started, which is what
lets environments register; `/batch` answers `{"batch": [groups]}`, `{"batch": null}` (none ready) or, before
any `/register`, `{"status": "error", "message": ...}`. Every unexpected reply raises `AtroposError` naming the
endpoint, the status and the body.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson
import requests


class AtroposError(RuntimeError):
    """The run-api did not answer, or answered something the trainer cannot use."""


class NotRegisteredError(AtroposError):
    """The run-api has no trainer registration (it was restarted, or /reset_data was called)."""


@dataclass
class BatchReply:
    """One `/batch` reply: its groups, and the bytes as received (the spool keeps them)."""

    groups: list
    raw: bytes


def _loads(content: bytes):
    """JSON → Python objects: orjson, else the json module, which also reads NaN / Infinity."""
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return json.loads(content)


def parse_batch(raw: bytes, source: str = "GET /batch") -> BatchReply | None:
    """A `/batch` reply → BatchReply, or None when it holds no batch (raises AtroposError when unusable)."""
    try:
        body = _loads(raw)
    except ValueError as exc:
        raise AtroposError(f"{source} returned non-JSON: {raw[:200]!r}") from exc
    if not isinstance(body, dict):
        raise AtroposError(f"{source} answered {str(body)[:200]}")
    if body.get("status") == "error":
        raise NotRegisteredError(f"{source}: {body.get('message')}")
    batch = body.get("batch")
    if batch is None:
        return None
    if not isinstance(batch, list):
        raise AtroposError(f"{source} answered a {type(batch).__name__} batch: {str(batch)[:200]}")
    return BatchReply(batch, raw)


class AtroposAPI:
    def __init__(self, url: str, timeout: float = 60.0):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()

    def _request(self, method: str, path: str, **kwargs) -> requests.Response:
        try:
            resp = self.session.request(method, f"{self.url}{path}", timeout=self.timeout, **kwargs)
        except requests.RequestException as exc:
            raise AtroposError(f"{method} {path} to the Atropos run-api at {self.url} failed: {exc}") from exc
        if resp.status_code != 200:
            hint = ""
            if path == "/batch" and resp.status_code >= 500:
                hint = (" (the run-api could not send a batch: most often a group holding a NaN or infinite score, "
                        "which its JSON encoder refuses, and that batch is lost at the API; fix the environment's "
                        "scoring. See the run-api's log)")
            raise AtroposError(f"{method} {path} -> HTTP {resp.status_code}: {resp.text[:300]}{hint}")
        return resp

    def _json(self, method: str, path: str, **kwargs) -> Any:
        resp = self._request(method, path, **kwargs)
        try:
            return _loads(resp.content)
        except ValueError as exc:
            raise AtroposError(f"{method} {path} returned non-JSON: {resp.text[:200]!r}") from exc

    # ---- lifecycle ------------------------------------------------------------------------------
    def reachable(self) -> bool:
        try:
            return self.session.get(f"{self.url}/", timeout=5).status_code == 200
        except requests.RequestException:
            return False

    def reset(self) -> None:
        """Forget queue, environments, step counter and registration (run-api's `GET /reset_data`)."""
        resp = self._request("GET", "/reset_data")
        if "reset" not in resp.text.lower():
            raise AtroposError(f"GET /reset_data answered {resp.text[:200]!r}, not a reset confirmation")

    def register(self, *, batch_size: int, max_token_len: int, starting_step: int, num_steps: int,
                 checkpoint_dir: str, save_checkpoint_interval: int, wandb_project: str = "",
                 wandb_group: str = "") -> int:
        body = self._json("POST", "/register", json={
            "wandb_group": wandb_group, "wandb_project": wandb_project, "batch_size": int(batch_size),
            "max_token_len": int(max_token_len), "checkpoint_dir": checkpoint_dir,
            "save_checkpoint_interval": int(save_checkpoint_interval), "starting_step": int(starting_step),
            "num_steps": int(num_steps)})
        if not isinstance(body, dict) or "uuid" not in body:
            raise AtroposError(f"POST /register answered {str(body)[:200]}, not a registration")
        return body["uuid"]

    # ---- data -----------------------------------------------------------------------------------
    def batch(self) -> BatchReply | None:
        """The next batch, or None when none is ready."""
        try:
            resp = self._request("GET", "/batch")
        except AtroposError as exc:
            if "HTTP 5" in str(exc) and self._lost_registration():
                raise NotRegisteredError("GET /batch: the run-api was reset (/reset_data) and holds no trainer "
                                         "registration") from exc
            raise
        return parse_batch(resp.content)

    def _lost_registration(self) -> bool:
        """After /reset_data and before the next /register, the run-api's /batch fails with HTTP 500 and /info
        reports batch_size -1."""
        try:  # a new connection: uvicorn closes the one a 500 was sent on
            return int(requests.get(f"{self.url}/info", timeout=self.timeout).json().get("batch_size", -1)) < 0
        except (requests.RequestException, AttributeError, TypeError, ValueError):
            return False

    # ---- diagnosis while waiting ----------------------------------------------------------------
    def info(self) -> dict:
        return self._json("GET", "/info")

    def status(self) -> dict:
        return self._json("GET", "/status")

    def latest_example(self) -> dict:
        return self._json("GET", "/latest_example")

    def env_registered(self, env_id: int = 0) -> bool:
        """Whether environment `env_id` has registered (`/status-env` is a GET with a JSON body that answers
        500 for an unknown id)."""
        try:
            resp = self.session.get(f"{self.url}/status-env", json={"env_id": env_id}, timeout=self.timeout)
        except requests.RequestException as exc:
            raise AtroposError(f"GET /status-env failed: {exc}") from exc
        return resp.status_code == 200
