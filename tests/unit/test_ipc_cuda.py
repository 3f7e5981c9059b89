"""ipc on CUDA, what runs without a GPU: the refusals, the handle encoding and its guard, the device remapping, the
transport choice. The GPU half (export in one process, attach in another, train, bit-identical server logits) is
tests/gpu/test_cuda_ipc.py."""

from __future__ import annotations

import base64
import os
import pickle

import pytest
import torch

from grpo_plugin.ipc import cuda
from grpo_plugin.ipc.transport import CudaTransport, ShmTransport, transport_for


@pytest.mark.parametrize(("settings", "expected"), [
    (dict(quantization="fp8", tensor_parallel_size=1, sleep_mode=False), "quantized (fp8)"),
    (dict(quantization=None, tensor_parallel_size=2, sleep_mode=False), "tensor_parallel_size 2"),
    (dict(quantization=None, tensor_parallel_size=1, sleep_mode=True), "sleep mode"),
])
def test_servers_that_cannot_share_are_refused_by_name(settings, expected):
    assert expected in cuda.refusal(**settings)


def test_a_plain_one_rank_server_can_share():
    assert cuda.refusal(quantization=None, tensor_parallel_size=1, sleep_mode=False) is None


def test_a_handle_round_trips_torch_names_and_refuses_anything_else():
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    args = (torch.Tensor, torch.Size([3, 4]), (4, 1), 0, torch.UntypedStorage, torch.bfloat16, 0, b"\x01" * 64,
            24, 0, False, b"ref", 0, b"\x02" * 64, True)
    rebuild, back = cuda._decode(cuda._encode((rebuild_cuda_tensor, args)))
    assert rebuild is rebuild_cuda_tensor and back == args
    evil = base64.b64encode(pickle.dumps((os.system, ("true",)))).decode()
    with pytest.raises(cuda.CudaIpcError, match="only torch's own names"):
        cuda._decode(evil)


def test_the_storage_device_is_replaced_by_the_local_index_of_the_same_gpu():
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    names = list(__import__("inspect").signature(rebuild_cuda_tensor).parameters)
    args = tuple(range(len(names)))
    moved = cuda._on_device(rebuild_cuda_tensor, args, 7)
    i = names.index("storage_device")
    assert moved[i] == 7 and moved[:i] == args[:i] and moved[i + 1:] == args[i + 1:]
    with pytest.raises(cuda.CudaIpcError, match="no storage_device argument"):
        cuda._on_device(lambda a, b: None, (1, 2), 0)


def test_export_needs_a_model_on_one_cuda_device():
    with pytest.raises(cuda.CudaIpcError, match=r"one CUDA device; found \['cpu'\]"):
        cuda.export(torch.nn.Linear(4, 4))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a trainer without CUDA")
def test_a_trainer_without_cuda_is_told_why_it_cannot_attach():
    with pytest.raises(cuda.CudaIpcError, match="this trainer process has no CUDA"):
        CudaTransport().attach({"transport": "cuda", "device_uuid": "GPU-x", "params": {}})


def test_the_manifest_picks_the_transport():
    assert isinstance(transport_for({"transport": "cuda"}), CudaTransport)
    assert isinstance(transport_for({"transport": "shm"}), ShmTransport)
    assert isinstance(transport_for({}), ShmTransport)  # manifests written before the CUDA transport
    with pytest.raises(ValueError, match="'nccl'; this trainer knows shm, cuda"):
        transport_for({"transport": "nccl"})


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a trainer that does not see the server's GPU")
def test_a_gpu_the_trainer_does_not_see_is_named_with_the_way_out():
    with pytest.raises(cuda.CudaIpcError, match=r"GPU \(uuid GPU-1234\) is not visible to this trainer process .*"
                                                r"CUDA_VISIBLE_DEVICES"):
        cuda.local_index("GPU-1234")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a trainer without CUDA")
def test_the_ipc_sync_reports_a_cuda_server_it_cannot_attach_to_as_a_sync_error():
    from types import SimpleNamespace

    from grpo_plugin.server.client import VLLMServerClient
    from grpo_plugin.sync.base import SyncError
    from grpo_plugin.sync.ipc import IpcSync

    sync = IpcSync(VLLMServerClient("http://127.0.0.1:9"))  # nothing is sent: the attach fails before
    sync._model = SimpleNamespace()
    with pytest.raises(SyncError, match="grpo.sync=ipc: the server shares its weights through CUDA IPC, but this "
                                        "trainer process has no CUDA"):
        sync._attach({"transport": "cuda", "device_uuid": "GPU-x", "params": {}, "hf": {}}, initial=True)
    sync.close()
