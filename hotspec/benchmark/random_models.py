"""Models of real shapes with random weights, made on the device (no files): the benchmarks'
`llama8b-shape`, `smollm2-shape` and `qwen0.5b-shape`, and GPU tests that need a whole engine
without the GGUF."""

from __future__ import annotations

import torch

from hotspec.models.config import ModelConfig
from hotspec.models.dummy import dummy_state

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
# Qwen2.5-Coder-0.5B-Instruct's shape: a 151,936-token vocabulary on a 0.5B model (FR-Spec's case)
QWEN25_05B = ModelConfig(
    architecture="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
    num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, head_dim=64,
    rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=32768,
    tie_word_embeddings=False, attention_bias=True, bos_token_id=151643, eos_token_ids=(151645,))
SHAPES = {"llama8b-shape": LLAMA_3_1_8B, "smollm2-shape": SMOLLM2_135M, "qwen0.5b-shape": QWEN25_05B}


def random_state(cfg: ModelConfig, device: torch.device, dtype: torch.dtype,
                 seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights of the target's shapes, made on `device` (models/dummy.py)."""
    return dummy_state(cfg, device, dtype, seed)
