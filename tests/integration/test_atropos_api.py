"""Our run-api client, fetcher and validation against a real Atropos `run-api` process (atroposlib 0.4.0)."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from grpo_plugin.atropos.api import AtroposAPI, AtroposError, NotRegisteredError
from grpo_plugin.atropos.fetcher import BatchFetcher
from grpo_plugin.atropos.group_tensors import tensorize
from grpo_plugin.atropos.spool import Spool
from grpo_plugin.server.process import stop_tree
from tests.conftest import free_port

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def run_api(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("run-api") / "run_api.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(BIN / "run-api"), "--host", "127.0.0.1", "--port", str(port)], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not AtroposAPI(url).reachable():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"run-api did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        stop_tree(proc, timeout=10)


@pytest.fixture
def api(run_api):
    a = AtroposAPI(run_api, timeout=10)
    a.reset()
    a.register(batch_size=4, max_token_len=64, starting_step=0, num_steps=10, checkpoint_dir="",
               save_checkpoint_interval=0)
    return a


def group(tag: int, n: int = 2, score=None) -> dict:
    return {"tokens": [[tag, tag + 1, tag + 2]] * n, "masks": [[-100, tag + 1, tag + 2]] * n,
            "inference_logprobs": [[1.0, -0.5, -0.25]] * n,
            "scores": [float(i) if score is None else score for i in range(n)]}


def post(url: str, g: dict) -> None:
    resp = requests.post(f"{url}/scored_data", json=g, timeout=10)
    assert resp.status_code == 200, resp.text


def start_env(url: str, group_size: int = 2) -> int:
    api = AtroposAPI(url)
    assert api.batch() is None  # the first /batch marks the trainer as started: envs may register now
    body = requests.post(f"{url}/register-env", json={
        "max_token_length": 64, "desired_name": "test", "weight": 1.0, "group_size": group_size}, timeout=10).json()
    assert body["status"] == "success", body
    return body["env_id"]


def test_batch_is_none_until_whole_groups_fill_it_then_comes_whole(api, run_api):
    env = start_env(run_api)
    post(run_api, {**group(10), "env_id": env})
    assert api.batch() is None
    post(run_api, {**group(20), "env_id": env})
    reply = api.batch()
    groups = reply.groups
    assert len(groups) == 2 and b'"batch"' in reply.raw
    assert sorted(g["tokens"][0][0] for g in groups) == [10, 20]
    assert api.batch() is None  # handed out once: the run-api keeps no copy


def test_diagnosis_endpoints(api, run_api):
    assert api.env_registered(0) is False
    start_env(run_api)
    assert api.env_registered(0) is True
    post(run_api, group(30))
    assert api.status()["queue_size"] == 1
    assert api.latest_example()["tokens"][0][0] == 30
    assert api.info()["batch_size"] == 4


def test_reset_forgets_queue_and_registration(api, run_api):
    start_env(run_api)
    post(run_api, group(40))
    api.reset()
    with pytest.raises(NotRegisteredError, match="reset"):
        api.batch()
    # a fresh registration makes it usable again (what the fetcher does on NotRegisteredError)
    api.register(batch_size=4, max_token_len=64, starting_step=0, num_steps=10, checkpoint_dir="",
                 save_checkpoint_interval=0)
    assert api.batch() is None


def test_malformed_group_from_the_run_api_is_rejected_and_the_good_one_kept(api, run_api, tmp_path):
    start_env(run_api)
    bad = group(50)
    bad["masks"] = [[-100, 51], [-100, 51, 52]]  # ragged: passes the run-api's schema, not ours
    post(run_api, bad)
    post(run_api, group(60))
    fetched = []
    f = BatchFetcher(api, Spool(tmp_path), lambda seq, meta, r: fetched.append(r) or r, capacity=1, batch_size=4,
                     poll_interval=0.05)
    f.start([])
    try:
        reply = f.get(10)
    finally:
        f.stop()
    out = tensorize(reply.groups, pad_token_id=0, vocab_size=1000, max_len=64)
    assert out.num_groups == 1 and out.num_sequences == 2
    assert len(out.rejections) == 1 and "masks[0] has 2 entries but tokens[0] has 3" in out.rejections[0].reason
    assert out.completion_ids[0].tolist() == [61, 62]


def test_nan_score_makes_the_run_api_fail_the_batch_and_we_say_why(api, run_api):
    """The run-api accepts a NaN score but cannot JSON-encode the batch holding it (HTTP 500): the batch is lost at
    the API. Our error says so, instead of a bare 500."""
    start_env(run_api)
    resp = requests.post(f"{run_api}/scored_data", data='{"tokens": [[1, 2], [1, 3]], "masks": [[-100, 2], '
                         '[-100, 3]], "scores": [NaN, 1.0]}',
                         headers={"content-type": "application/json"}, timeout=10)
    if resp.status_code != 200:
        pytest.skip(f"this run-api refuses NaN scores itself ({resp.status_code}): nothing reaches the trainer")
    post(run_api, group(70))
    with pytest.raises(AtroposError, match="NaN or infinite score"):
        api.batch()


def test_unreachable_run_api_is_a_clear_error():
    api = AtroposAPI(f"http://127.0.0.1:{free_port()}", timeout=2)
    assert not api.reachable()
    with pytest.raises(AtroposError, match="GET /batch to the Atropos run-api .* failed"):
        api.batch()
    assert math.isfinite(api.timeout)
