"""oneDNN-packed weights for the engine's large linear layers (CPU, float32).

A decode step multiplies a few dozen rows by every weight matrix. For such skinny
products on large weights, MKL's sgemm (what `F.linear` calls on CPU) stays well below
the machine's matmul rate, while oneDNN, with the weight reordered once into its
blocked layout, comes much closer (bench/engine.py's machine bound times both kernels).
So the engine swaps every large `nn.Linear` of its own
model copy for a `PackedLinear`: the very same weight Parameter (state_dict names,
`update_weights` and the trainer's view of the model are unchanged) plus the packed
copy, which `repack()` refreshes after the weights change. Small layers stay with
F.linear, which does as well there. The model's forward code is untouched.

Out of scope: GPUs (the vLLM backend), other dtypes (bf16 packing needs AVX512-BF16 or
AMX), autograd (the engine runs under inference mode), int8 (int8_linear.py: an int8
engine swaps its layers for Int8Linear instead).
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch import Tensor

MIN_PACKED_ELEMENTS = 1 << 17
"""Weights with fewer elements stay with F.linear (the built-in tiny model's all do)."""


class PackedLinear(nn.Module):
    """An nn.Linear whose product runs on a oneDNN-packed copy of its weight."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the same Parameter: updates in place reach it
        self.bias = linear.bias
        self.repack()

    @torch.no_grad()
    def repack(self) -> None:
        """Reorder the current weight into oneDNN's layout (after every weight update)."""
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def packed_linear_works() -> bool:
    """Does this torch build have oneDNN's packed linear, and does it compute x @ W.T + b?"""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        lin = nn.Linear(8, 5)
        x = torch.randn(3, 8)
        with torch.no_grad():
            return torch.allclose(PackedLinear(lin)(x), lin(x), atol=1e-5)
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


def pack_linears(model: nn.Module, min_elements: int = MIN_PACKED_ELEMENTS) -> list[PackedLinear]:
    """Swap the float32 CPU nn.Linear layers of `model` with at least `min_elements` weights
    for PackedLinear, in place; returns them (call repack() on each after a weight update).
    Does nothing where oneDNN's packed linear is missing."""
    targets = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if type(child) is nn.Linear and child.weight.numel() >= min_elements
               and child.weight.dtype == torch.float32 and child.weight.device.type == "cpu"]
    if not targets or not packed_linear_works():
        return []
    packed = []
    for parent, name, child in targets:
        setattr(parent, name, PackedLinear(child))
        packed.append(getattr(parent, name))
    return packed
