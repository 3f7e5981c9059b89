"""runtime.py: the facts several layers read, each defined once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from grpo_plugin.config.runtime import config_value, is_local, is_server_url, world_size


@pytest.mark.parametrize("url, ok", [("http://127.0.0.1:8000", True), ("https://gpu-box:443/", True),
                                     ("http://[::1]:8001", True), ("http://127.0.0.1", False),
                                     ("127.0.0.1:8000", False), ("ftp://h:21", False), ("http://:8000", False),
                                     ("http://h:port", False), ("http://h:99999", False), ("", False)])
def test_a_server_url_is_http_host_and_port(url, ok):
    assert is_server_url(url) is ok


@pytest.mark.parametrize("host, local", [("127.0.0.1", True), ("localhost", True), ("0.0.0.0", True), ("::1", True),
                                         ("", True), (None, True), ("10.0.0.2", False), ("gpu-box", False)])
def test_local_hosts(host, local):
    assert is_local(host) is local


def test_world_size_reads_the_launchers_variable(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert world_size() == 1
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert world_size() == 4


def test_a_config_value_from_a_dict_or_a_validated_object():
    assert config_value({"port": 8001}, "port") == 8001
    assert config_value(SimpleNamespace(port=8002), "port") == 8002
    assert config_value({}, "port") is None and config_value(SimpleNamespace(), "port") is None


def test_one_url_builder_for_a_server_bound_anywhere():
    """A server bound to every address (0.0.0.0, "", none given) is reached on the loopback; any other host as it is.
    Every client URL of a server the plugin starts or is told of is built here (grep finds no other conversion)."""
    from grpo_plugin.config import runtime

    for bind in ("0.0.0.0", "", None):
        assert runtime.connect_host(bind) == "127.0.0.1"
        assert runtime.server_url(bind, 8000) == "http://127.0.0.1:8000"
    assert runtime.server_url("10.1.2.3", 9001) == "http://10.1.2.3:9001"
    assert runtime.server_url("localhost", 1) == "http://localhost:1"
    assert runtime.is_server_url(runtime.server_url("0.0.0.0", 8000))
