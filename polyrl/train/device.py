"""Where the trainer computes: resolving `trainer.device`, autocast, and moving tensors.

`trainer.device` is `auto` (CUDA when torch sees a GPU, else CPU), `cpu` or `cuda`. On
CUDA the forward passes run under bf16 autocast (matmuls and attention in bfloat16,
parameters, optimizer state and the loss in the parameters' dtype, float32 unless the
run file loads the model in bf16); on CPU autocast is a no-op, so CPU numerics are
exactly those of the plain float32 model.

The update keeps its TrainBatch on the host: packing (train/packing.py) plans pieces
with Python-level indexing, which on a GPU would be one device sync per row. Each
piece's tensors go to the policy's device as it runs (update.py), and what comes back
to the loop is Python floats. `to_device` moves a whole batch for callers that want it
there at once.

Weights for the engine: `engine.update_weights` copies a state dict into the engine's
model in place (engine/base.py `copy_weights_`, vLLM: `.cpu()` first), so a CUDA
policy's `state_dict()` already works with an in-process engine. An engine in another
process (worker processes, Ray, a server) must receive host tensors, which
`host_state_dict` makes: one CPU copy per tensor, tied weights kept tied.

Untested here (no GPU on the development machine): everything under `cuda`; on CPU the
code paths are the same calls with a CPU device.
"""

from __future__ import annotations

import contextlib
from dataclasses import fields, replace

import torch

from polyrl.train.batch import TrainBatch

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> torch.device:
    """`trainer.device` -> a torch device: auto = cuda when available, else cpu."""
    if name not in DEVICES:
        raise ValueError(f"trainer.device: got {name!r}; must be one of {', '.join(DEVICES)}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a CPU-only build")
        raise RuntimeError(f"trainer.device: cuda was requested but torch sees no CUDA device ({build}); "
                           f"install a CUDA build of torch on a machine with a GPU, or set trainer.device: cpu "
                           f"(or auto)")
    return torch.device(name)


def autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA; a no-op elsewhere (CPU runs in the parameters' dtype)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def module_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's parameters (the local shard's, under FSDP)."""
    return next(model.parameters()).device


def to_device(batch: TrainBatch, device: torch.device) -> TrainBatch:
    """The batch with every tensor on device (domains, a list, unchanged); the same object
    when it is already there."""
    moved = {f.name: getattr(batch, f.name).to(device, non_blocking=True) for f in fields(batch)
             if isinstance(getattr(batch, f.name), torch.Tensor) and getattr(batch, f.name).device != device}
    return replace(batch, **moved) if moved else batch


def host_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict with every tensor on the CPU, for an engine in another process.

    A CPU model's own tensors come back as they are (no copy: the engine copies them into
    its model in place). Otherwise one host copy per distinct tensor, so tied weights
    (lm_head.weight = model.embed_tokens.weight) stay one tensor under two names.
    Not for FSDP-sharded models: use distributed.full_state_dict (a collective)."""
    state = model.state_dict()
    copies: dict[tuple[int, torch.device], torch.Tensor] = {}
    out = {}
    for name, t in state.items():
        if t.device.type == "cpu":
            out[name] = t.detach()
            continue
        key = (t.data_ptr(), t.device)
        if key not in copies:
            copies[key] = t.detach().to("cpu")  # blocking: the engine may read it at once
        out[name] = copies[key]
    return out
