"""Facts several layers read, each defined once: how many trainer ranks this launch has, whether a host name is
this machine, whether a URL names a server, and a config value whether the config is still a dict or already a
validated object (axolotl hands both to the plugin's checks)."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlparse

# host names that mean "this machine" (0.0.0.0 and "" as a server binds them)
SERVER_HOST, SERVER_PORT = "127.0.0.1", 8000  # the vLLM server's address when `vllm:` names none
LOCAL_HOSTS = frozenset(("127.0.0.1", "localhost", "0.0.0.0", "::1", ""))


def world_size() -> int:
    """Trainer processes in this launch (torchrun / accelerate's WORLD_SIZE; 1 when not launched by them)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def global_rank() -> int:
    """This trainer process's rank among all of them (torchrun / accelerate's RANK; 0 when not launched by them)."""
    return int(os.environ.get("RANK", "0"))


def is_local(host: str | None) -> bool:
    return (host or "") in LOCAL_HOSTS


def connect_host(host: str | None) -> str:
    """The host a client connects to for a server bound to `host`: the loopback for an any-address bind (0.0.0.0,
    "") or none given, else `host` itself."""
    return SERVER_HOST if host in ("0.0.0.0", "", None) else host


def server_url(host: str | None, port: int) -> str:
    """The base URL a client uses for a server bound to `host`:`port` (the one place it is built)."""
    return f"http://{connect_host(host)}:{port}"


def is_server_url(url: str) -> bool:
    """http(s)://HOST:PORT, the shape of a vLLM server's or the run-api's base URL."""
    try:
        parsed = urlparse(url)
        return parsed.scheme in ("http", "https") and bool(parsed.hostname) and parsed.port is not None
    except ValueError:  # a port that is not a number, or out of range
        return False


def config_value(data: Any, key: str) -> Any:
    """`data[key]` of a config section given as a dict, or its attribute once validated (None when absent)."""
    if isinstance(data, dict):
        return data.get(key)
    return getattr(data, key, None)
