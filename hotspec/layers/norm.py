"""RMSNorm, computed in float32 and cast back (as Hugging Face Llama does).

`add_forward(x, residual)` is the pre-norm residual step: the sum is rounded to the model dtype
(as `h = h + x` would be), returned as the new residual, and normalised. On CUDA both calls are one
fused Triton kernel (layers/fused_kernels.py) that rounds at the same places.
"""

from __future__ import annotations

import torch
from torch import nn

from hotspec.layers import fused


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused.enabled(x, self.weight):
            shape = x.shape
            return fused.rms_norm(x.reshape(-1, shape[-1]), self.weight, self.eps)[0].view(shape)
        return self._norm(x)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual) for [T, H] tensors."""
        if fused.enabled(x, self.weight) and x.dim() == 2 and x.stride(1) == 1 and residual.stride(1) == 1:
            y, s = fused.rms_norm(x, self.weight, self.eps, residual)
            assert s is not None
            return y, s
        s = x + residual
        return self._norm(s), s

    def norm_into(self, x: torch.Tensor, out: torch.Tensor) -> None:
        """out[:] = norm(x) for [T, H] x and out (e.g. one half of a wider buffer: a concatenation
        of norms without the copy)."""
        if fused.enabled(x, self.weight) and x.dim() == 2 and x.stride(1) == 1 and out.stride(1) == 1:
            fused.rms_norm(x, self.weight, self.eps, out=out)
        else:
            out.copy_(self._norm(x))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)
