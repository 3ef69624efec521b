"""Models of real shapes with random weights, made on the device (no files): the benchmarks'
`llama8b-shape` and `smollm2-shape`, and GPU tests that need a whole engine without the GGUF."""

from __future__ import annotations

import torch

from hotspec.models.config import ModelConfig
from hotspec.models.llama import LlamaForCausalLM

LLAMA_3_1_8B = ModelConfig(
    architecture="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
    rms_norm_eps=1e-5, rope_theta=500000.0,
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    max_position_embeddings=131072, tie_word_embeddings=False, bos_token_id=128000,
    eos_token_ids=(128001, 128008, 128009))
# the default model's shape (SmolLM2-135M), random weights: its kernels without carrying the GGUF
SMOLLM2_135M = ModelConfig(
    architecture="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
    rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=8192,
    tie_word_embeddings=True, bos_token_id=1, eos_token_ids=(2,))
SHAPES = {"llama8b-shape": LLAMA_3_1_8B, "smollm2-shape": SMOLLM2_135M}


def random_state(cfg: ModelConfig, device: torch.device, dtype: torch.dtype,
                 seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights of the target's shapes, made on `device` (host RAM stays free): norms are
    ones, every other tensor N(0, 0.02), generated in place one tensor at a time."""
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
