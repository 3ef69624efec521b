"""Runs one ForwardBatch through a model: plan attention once, then the layers."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hotspec.core.forward_batch import ForwardBatch
from hotspec.core.kv_pool import KVPool
from hotspec.layers.attention.base import AttentionBackend


class ModelRunner:
    def __init__(self, model: nn.Module, kv: KVPool, backend: AttentionBackend) -> None:
        self.model = model
        self.kv = kv
        self.backend = backend

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch) -> tuple[torch.Tensor, Any]:
        """(hidden, aux): a target model's aux is its captured layer states (list[Tensor]), a draft
        head's its feature for the next draft step (Tensor)."""
        self.backend.plan(fb)
        return self.model(fb, self.kv, self.backend)
