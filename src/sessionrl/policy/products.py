"""Float32 models multiplied in bfloat16 on CPUs with bfloat16 matrix units (AMX, AVX512-BF16).

Within either mode, `F.linear` on a chosen float32 weight multiplies a bfloat16 copy of the weight by the
input rounded to bfloat16 and returns float32, so the matrix units run at bfloat16 speed while everything
between the products (residual stream, norms, attention, key/value cache, logits) stays float32. The output
head is never chosen: the logits keep float32's precision. Other weights, functions and modules pass through.

- `BF16Matmuls` (sampling) chooses every other linear layer and copies its weights once: a decode step
  multiplies them hundreds of times. The copies belong to one version of the weights; the engine builds a
  new one when they change.
- `FrozenBF16Matmuls` (training) chooses the weights that do not train (`requires_grad` off: a LoRA
  model's base) and rounds them at each product, so nothing can go stale. Gradients reach the input
  through the bfloat16 product and the trained weights (adapters) keep float32 products, so an optimiser
  step sees float32 gradients of float32 parameters.

`bf16_by_default` is where both are on unless asked otherwise: a float32 model on a CPU that has the units.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode


class _BF16Linear(TorchFunctionMode):
    """`F.linear` with the bfloat16 weight `bf16_weight` gives (float32 otherwise)."""

    def bf16_weight(self, weight: Tensor) -> Tensor | None:
        """The bfloat16 weight to multiply by in place of `weight`, or None to leave the product alone."""
        raise NotImplementedError

    def __torch_function__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is F.linear and len(args) >= 2:
            weight = self.bf16_weight(args[1])
            if weight is not None:
                bias = args[2] if len(args) > 2 else kwargs.get("bias")
                out = F.linear(args[0].to(torch.bfloat16), weight).float()
                return out if bias is None else out + bias
        return func(*args, **kwargs)


def _head_weight(model: Any) -> Tensor | None:
    head = model.get_output_embeddings()
    return head.weight if head is not None else None


class BF16Matmuls(_BF16Linear):
    """Every float32 linear layer of `model` but the output head multiplied in bfloat16, from copies taken
    once (build a new one when the weights change)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        head = _head_weight(model)
        self.copies: dict[int, tuple[Tensor, Tensor]] = {
            id(m.weight): (m.weight, m.weight.detach().to(torch.bfloat16))
            for m in model.modules()
            if isinstance(m, torch.nn.Linear) and m.weight.dtype == torch.float32 and m.weight is not head
        }
        """id of each float32 weight -> (the weight, its bfloat16 copy); holding the weight keeps its id."""

    def bf16_weight(self, weight: Tensor) -> Tensor | None:
        held = self.copies.get(id(weight))
        return held[1] if held is not None and held[0] is weight else None


class FrozenBF16Matmuls(_BF16Linear):
    """Every float32 weight that does not train, `model`'s output head aside, multiplied in bfloat16 and
    rounded at each product. What trains keeps float32 products and float32 gradients."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.head = _head_weight(model)

    def bf16_weight(self, weight: Tensor) -> Tensor | None:
        frozen = not weight.requires_grad and weight.dtype == torch.float32
        return weight.to(torch.bfloat16) if frozen and weight is not self.head else None


@functools.cache
def bf16_matmul_units() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (AMX or AVX512-BF16; Linux's cpuinfo)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def bf16_by_default(model: Any) -> bool:
    """Whether a model multiplies in bfloat16 unless told otherwise: a float32 model on a CPU with
    bfloat16 units."""
    weight = next(model.parameters())
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and bf16_matmul_units()


__all__ = ["BF16Matmuls", "FrozenBF16Matmuls", "bf16_by_default", "bf16_matmul_units"]
