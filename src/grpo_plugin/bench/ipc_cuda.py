"""ipc on CUDA with the project's own export/attach code and a torch-only server process (vLLM cannot be installed on
the GPU machines this project is lent), in ONE run (prints figures; never a test):

    python -m grpo_plugin.bench ipc --cuda [--shape 1.5b|7b] [--steps 3] [--json]

The server process (spawned) builds a Qwen2-shaped model on the GPU in bf16 (random, seeded; the 1.5b shape is
Qwen2.5-1.5B's: 3.09 GB, tied embeddings; the 7b shape Qwen2.5-7B's: 15.2 GB, untied) and exports it with
ipc/cuda.py `export` — what the vLLM plugin does after vLLM loads a model. The trainer process attaches with
ipc/cuda.py `attach` + ipc/layout.py (its model's parameters become views of the server's memory; its own copy is
never put on the GPU), then per step: fused AdamW on a random batch, an interprocess CUDA event recorded after the
step (the fence), and the server's logits for a fixed prompt, computed after waiting on that event, compared bit
for bit with the trainer's.

Keys: `attach_ms` (rebuild every handle + views + attach), `added_gpu_bytes` (device free memory before minus
after attaching, the server idle), `own_copy_bytes` (what the trainer would hold with its own copy),
`fence_ms_median` (record the event, the server opens and waits on it, acknowledges), `d2d_copy_ms` (copying all
weights device-to-device: the cheapest alternative to sharing), `bit_identical_steps`.
"""

from __future__ import annotations

import gc
import statistics
import time

SHAPES = {
    "tiny": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_key_value_heads": 2, "vocab_size": 259},
    "1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
             "num_key_value_heads": 2, "vocab_size": 151936},
    # Qwen2.5-7B's: 15.2 GB, lm_head apart from the embedding. With the trainer's grads, its AdamW state (bf16, like
    # the weights) and the timed device-to-device copy, about 76 GB are on the GPU: an H200 (141 GB) holds it, an
    # 80 GB H100 barely.
    "7b": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
           "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False},
}


def _config(shape: str):
    from transformers import Qwen2Config  # heavy: loaded only when this benchmark runs

    if shape not in SHAPES:
        raise SystemExit(f"unknown shape {shape!r}: one of {', '.join(SHAPES)}")
    return Qwen2Config(**{"tie_word_embeddings": True, **SHAPES[shape]}, max_position_embeddings=2048,
                       dtype="bfloat16")


def _wait(event_handle) -> None:
    import torch  # heavy: loaded only when this benchmark runs

    event = torch.cuda.Event.from_ipc_handle(torch.cuda.current_device(), event_handle)
    torch.cuda.current_stream().wait_event(event)


def server(shape: str, seed: int, conn) -> None:
    """The torch-only server (a spawned process): export, then answer ("logits", ids, event) / ("fence", event)
    until ("stop",). Keeps the model alive: its memory is what the trainer trains."""
    # heavy (torch, transformers): loaded only when this benchmark runs
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_plugin.ipc.cuda import export

    torch.manual_seed(seed)
    config = _config(shape)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.eval()
    torch.cuda.synchronize()
    conn.send(export(model, model_name=f"{shape}-shape", hf_config=config))
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            break
        if msg[0] == "fence":
            _wait(msg[1])
            torch.cuda.current_stream().synchronize()
            conn.send("ok")
        elif msg[0] == "logits":
            _, ids, event_handle = msg
            if event_handle is not None:
                _wait(event_handle)
            with torch.no_grad():
                out = model(input_ids=ids.cuda()).logits
            conn.send(out.cpu())
    conn.send("stopped")


def _fence(conn) -> float:
    import torch  # heavy: loaded only when this benchmark runs

    t0 = time.perf_counter()
    event = torch.cuda.Event(interprocess=True)
    event.record()
    conn.send(("fence", event.ipc_handle()))
    assert conn.recv() == "ok"
    return (time.perf_counter() - t0) * 1e3


def run(shape: str = "1.5b", steps: int = 3, seed: int = 0) -> dict:
    # heavy (torch, transformers): loaded only when this benchmark runs
    import torch
    import torch.multiprocessing as mp
    from transformers import AutoModelForCausalLM

    from grpo_plugin.ipc.cuda import attach as attach_handles
    from grpo_plugin.ipc.layout import attach, views_from_layout

    if not torch.cuda.is_available():
        raise SystemExit("bench ipc --cuda needs a CUDA GPU (this machine has none)")
    config = _config(shape)
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=server, args=(shape, seed, child), daemon=True)
    proc.start()
    child.close()  # the server holds its end: if it dies, recv() raises EOFError instead of waiting forever
    try:
        manifest = parent.recv()
        if "hf_error" in manifest:
            raise RuntimeError(manifest["hf_error"])
        torch.zeros(1, device="cuda")  # this process's CUDA context exists before memory is read
        torch.cuda.synchronize()
        with torch.device("meta"):  # the trainer's model without weights of its own: never a GPU copy
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        own = sum(p.numel() * p.element_size() for p in model.parameters())  # unique parameters (tied once)
        free0 = torch.cuda.mem_get_info()[0]
        t0 = time.perf_counter()
        views = views_from_layout(manifest["hf"], attach_handles(manifest))
        attach(model, views)
        torch.cuda.synchronize()
        attach_ms = (time.perf_counter() - t0) * 1e3
        added = free0 - torch.cuda.mem_get_info()[0]
        with torch.device("cuda"):  # the rotary buffers, computed as the server computed its own
            model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
        leftover = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type != "cuda"]
        if leftover:
            raise RuntimeError(f"not on the GPU after attaching: {leftover}")
        shared = all(p.data_ptr() == views[n].data_ptr() for n, p in model.named_parameters())
        g = torch.Generator().manual_seed(seed)
        probe = torch.randint(0, config.vocab_size, (1, 32), generator=g)
        batch = torch.randint(0, config.vocab_size, (2, 64), generator=g).cuda()
        fences = [_fence(parent) for _ in range(3)]  # the first pays cuBLAS / event start-up
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        identical, changed, before = 0, 0, None
        for _ in range(steps):
            model.train()
            model(input_ids=batch, labels=batch).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            event = torch.cuda.Event(interprocess=True)
            event.record()
            parent.send(("logits", probe, event.ipc_handle()))
            model.eval()
            with torch.no_grad():
                ours = model(input_ids=probe.cuda()).logits.cpu()
            theirs = parent.recv()
            identical += int(torch.equal(ours, theirs))
            changed += int(before is not None and not torch.equal(before, theirs))
            before = theirs
            fences.append(_fence(parent))
        params = list({p.data_ptr(): p for p in model.parameters()}.values())
        copies = []
        for _ in range(3):
            torch.cuda.synchronize()
            t = time.perf_counter()
            clones = [p.detach().clone() for p in params]
            torch.cuda.synchronize()
            copies.append((time.perf_counter() - t) * 1e3)
            del clones
        # Let go of the server's memory before it exits: the exporting process must outlive every use of its
        # tensors (torch warns "Producer process has been terminated before all shared CUDA tensors released").
        del opt, model, views, params
        gc.collect()
        torch.cuda.synchronize()
        parent.send(("stop",))
        parent.recv()
    finally:
        parent.close()  # on an error the server's recv() ends (EOFError) instead of waiting to be killed
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
    return {"shape": shape, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "steps": steps,
            "attach_ms": attach_ms, "added_gpu_bytes": added, "own_copy_bytes": own,
            "all_parameters_shared": shared, "fence_ms_median": statistics.median(fences[1:]),
            "fence_ms_first": fences[0], "d2d_copy_ms": min(copies), "bit_identical_steps": identical,
            "server_changed_steps": changed}


def report(out: dict) -> None:
    print(f"ipc on CUDA, {out['shape']} shape — {out['gpu']}, torch {out['torch']} (torch-only server process)")
    print(f"  attach (rebuild handles + views): {out['attach_ms']:.1f} ms; GPU memory added by attaching: "
          f"{out['added_gpu_bytes'] / 2**20:.0f} MiB; a copy of its own would be "
          f"{out['own_copy_bytes'] / 2**30:.2f} GiB")
    print(f"  fence (interprocess event, server waits, acknowledges): median {out['fence_ms_median']:.2f} ms "
          f"(first {out['fence_ms_first']:.1f} ms); copying all weights device-to-device: "
          f"{out['d2d_copy_ms']:.2f} ms")
    print(f"  server logits bit-identical to the trainer's after {out['bit_identical_steps']}/{out['steps']} steps "
          f"(changed by the step: {out['server_changed_steps']}/{out['steps'] - 1})")
