"""Build a target model on the meta device and materialise it from a checkpoint state dict."""

from __future__ import annotations

import torch

from hotspec.errors import ModelLoadError
from hotspec.layers.rotary import RotaryEmbedding
from hotspec.models.config import ModelConfig
from hotspec.models.llama import LlamaForCausalLM


def check_state_dict(expected: dict[str, torch.Size], got: dict[str, torch.Tensor], what: str) -> None:
    """Refuse a checkpoint whose keys or shapes differ from the module's, naming each offender."""
    missing = sorted(set(expected) - set(got))
    unexpected = sorted(set(got) - set(expected))
    wrong = [f"{k}: checkpoint {tuple(got[k].shape)} vs expected {tuple(expected[k])}"
             for k in sorted(set(expected) & set(got)) if tuple(got[k].shape) != tuple(expected[k])]
    problems = []
    if missing:
        problems.append(f"missing keys: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
    if unexpected:
        problems.append(f"unexpected keys: {', '.join(unexpected[:8])}"
                        f"{' ...' if len(unexpected) > 8 else ''}")
    if wrong:
        problems.append("wrong shapes: " + "; ".join(wrong[:8]))
    if problems:
        raise ModelLoadError(f"{what} does not match its architecture: " + " | ".join(problems)
                             + ". Check that the checkpoint and its config.json belong together.")


def build_target(cfg: ModelConfig, state: dict[str, torch.Tensor], dtype: torch.dtype,
                 device: torch.device | str) -> LlamaForCausalLM:
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        expected.pop("lm_head.weight")
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    check_state_dict(expected, state, "target checkpoint")
    model.load_state_dict({k: v.to(device=device, dtype=dtype) for k, v in state.items()},
                          strict=False, assign=True)
    model.tie_weights()
    model.fuse_projections()
    model.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta,
                                   cfg.rope_scaling).to(device)
    return model.eval().requires_grad_(False)
