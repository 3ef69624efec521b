"""Random weights of a model's shapes (--load-format dummy, and the benchmarks' random models): a
whole engine without its weight files, for benchmarking and profiling. Kernels, launches and
memory traffic are those of the real weights; the tokens are not."""

from __future__ import annotations

import torch

from hotspec.models.config import ModelConfig
from hotspec.models.llama import LlamaForCausalLM


def dummy_state(cfg: ModelConfig, device: torch.device | str, dtype: torch.dtype,
                seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights of the target's shapes, made on `device` (host RAM stays free): norms are
    ones, every other tensor N(0, 0.02), generated in place one tensor at a time."""
    device = torch.device(device)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in LlamaForCausalLM(cfg).state_dict().items()}
    if cfg.tie_word_embeddings:
        shapes.pop("lm_head.weight")
    gen = torch.Generator(device=device).manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        t = torch.empty(shape, device=device, dtype=dtype)
        if name.endswith("norm.weight"):
            t.fill_(1.0)
        else:
            t.normal_(0.0, 0.02, generator=gen)
        state[name] = t
    return state
