"""`grpo.delta_anchor_every`: on by default only where a delta saves the link (a server sent its files over the
network), refused where a delta cannot be applied (not restart, or restart_strategy: process)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from grpo_plugin.config.schema import GRPOSettings
from grpo_plugin.sync.delta_push import DEFAULT_EVERY, anchor_every


def test_the_default_follows_the_transports():
    assert anchor_every(None, ["shared", "network"]) == DEFAULT_EVERY == 10
    assert anchor_every(None, ["shared"]) == 0
    assert anchor_every(3, ["shared"]) == 3 and anchor_every(0, ["network"]) == 0


@pytest.mark.parametrize("sync", ["lora_sync", "ipc"])
def test_a_key_of_restart_alone(sync):
    with pytest.raises(ValidationError, match="grpo.delta_anchor_every only applies to `grpo.sync: restart`"):
        GRPOSettings(sync=sync, delta_anchor_every=5)


def test_refused_with_process_restarts():
    process = {"sync": "restart", "restart_strategy": "process", "managed_server": True}
    with pytest.raises(ValidationError, match="grpo.delta_anchor_every applies to restart_strategy: reload"):
        GRPOSettings(**process, delta_anchor_every=5)
    GRPOSettings(**process, delta_anchor_every=0)  # off: nothing to refuse


def test_accepted_for_restart_reload():
    assert GRPOSettings(sync="restart", delta_anchor_every=4).delta_anchor_every == 4
    assert GRPOSettings(sync="restart").delta_anchor_every is None
    with pytest.raises(ValidationError):
        GRPOSettings(sync="restart", delta_anchor_every=-1)


def test_the_setting_reaches_the_restart_sync():
    from grpo_plugin.server.client import VLLMServerClient
    from grpo_plugin.sync import build_weight_sync
    from grpo_plugin.sync.gate import PolicyGate

    client = VLLMServerClient("http://127.0.0.1:9")  # never called: building the sync asks the server nothing
    for setting in (None, 0, 7):
        sync = build_weight_sync(GRPOSettings(sync="restart", delta_anchor_every=setting), client=client,
                                 gate=PolicyGate())
        try:
            assert sync._delta[0] == setting
        finally:
            sync.close()
