"""tests/conftest.py's scheduling for two pytest-xdist workers: which tests must share a worker (the users of one
server), read from the test modules themselves."""

from __future__ import annotations

from tests.conftest import server_scope


def test_an_integration_module_stays_together_with_its_module_servers():
    a = server_scope("tests/integration/test_model_families.py::test_lora_sync[qwen3]")
    b = server_scope("tests/integration/test_model_families.py::test_ipc[llama]")
    assert a == b == "tests/integration/test_model_families.py"


def test_users_of_a_session_server_share_its_scope_whole_modules_and_single_e2e_runs():
    # a test taking the server, and a module whose fixture takes it (test_generate_route's base_policy)
    assert server_scope("tests/integration/test_lora_sync.py::test_broken_sync_is_caught_by_verification") \
        == "vllm_server"
    assert server_scope("tests/integration/test_generate_route.py::test_bad_policy_announcements_are_refused") \
        == "vllm_server"
    assert server_scope("tests/e2e/test_code_train.py::test_code_rewards_train_through_axolotl") == "vllm_server"
    # one test of test_ipc_sync takes the full-weight server: the whole module (its own ipc server too) follows
    assert server_scope("tests/integration/test_ipc_sync.py::test_every_parameter_is_a_view_of_the_servers_file") \
        == "full_weight_server"
    assert server_scope("tests/e2e/test_gsm8k_train.py::test_gsm8k_transform_and_rewards_train_through_axolotl") \
        == "full_weight_server"


def test_every_other_test_is_scheduled_alone():
    nodeid = "tests/e2e/test_async_prefetch.py::test_async_prefetch_on_a_managed_server[ipc]"
    assert server_scope(nodeid) == nodeid
    nodeid = "tests/unit/test_policy_gate.py::test_writer_waits_for_leases"
    assert server_scope(nodeid) == nodeid
