"""Write draft heads in the public EAGLE / EAGLE-3 folder format (config.json + weights).

`random_draft_checkpoint` makes a valid random head for a target config, with exactly the key
names and config fields of the public checkpoints; tests and benchmarks use it where no trained
head is at hand.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from hotspec.models.config import ModelConfig
from hotspec.models.eagle3 import eagle3_capture_layers

_ARCHITECTURE = {"EAGLE": "LlamaForCausalLMEagle", "EAGLE3": "LlamaForCausalLMEagle3"}
_PREFIX = {"EAGLE": "layers.0.", "EAGLE3": "midlayer."}


def save_draft_checkpoint(state: dict[str, torch.Tensor], config: dict[str, Any],
                          out_dir: str | os.PathLike, fmt: str = "safetensors") -> Path:
    """Write `config.json` and `model.safetensors` (fmt "safetensors") or `pytorch_model.bin`
    (fmt "bin") into `out_dir`; returns the folder."""
    if fmt not in ("safetensors", "bin"):
        raise ValueError(f"fmt={fmt!r}; choose 'safetensors' or 'bin'")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    if fmt == "safetensors":
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    else:
        torch.save(tensors, out / "pytorch_model.bin")
    return out


def draft_config(target_cfg: ModelConfig, algorithm: str) -> dict[str, Any]:
    """config.json of a head for `target_cfg`, with the fields the public heads carry."""
    if algorithm not in _ARCHITECTURE:
        raise ValueError(f"algorithm={algorithm!r}; choose one of {', '.join(_ARCHITECTURE)}")
    c = target_cfg
    config: dict[str, Any] = {
        "architectures": [_ARCHITECTURE[algorithm]],
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "num_hidden_layers": 1,
        "vocab_size": c.vocab_size,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "max_position_embeddings": c.max_position_embeddings,
    }
    if c.head_dim * c.num_attention_heads != c.hidden_size:
        config["head_dim"] = c.head_dim
    if c.rope_scaling is not None:
        config["rope_scaling"] = dict(c.rope_scaling)
    return config


def random_draft_checkpoint(out_dir: str | os.PathLike, target_cfg: ModelConfig, algorithm: str,
                            seed: int = 0, draft_vocab_size: int | None = None,
                            fmt: str = "safetensors", scale: float = 0.02,
                            extra_config: dict[str, Any] | None = None,
                            embed_tokens: torch.Tensor | None = None) -> Path:
    """A random head for `target_cfg` in the public format; returns the folder.

    EAGLE-3 with `draft_vocab_size` gets its own `lm_head.weight` [draft_vocab_size, H], a `d2t`
    over a random ascending subset of target ids and the matching boolean `t2d` [V]; without it
    the head uses the target's LM head. `embed_tokens` (e.g. the target's embedding, as public
    EAGLE-1 files carry) is written as `embed_tokens.weight`. `extra_config` is merged last. When
    the default EAGLE-3 aux layers [2, L//2, L-3] collide (tiny targets) and `extra_config` sets no
    `eagle_config`, distinct ids are written to eagle_config.eagle_aux_hidden_state_layer_ids.
    """
    config = draft_config(target_cfg, algorithm)
    h, d = target_cfg.hidden_size, target_cfg.head_dim
    vocab, inter = target_cfg.vocab_size, target_cfg.intermediate_size
    q_out, kv_out = target_cfg.num_attention_heads * d, target_cfg.num_key_value_heads * d
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * scale

    def norm() -> torch.Tensor:  # RMSNorm gains sit near 1 in trained heads
        return 1.0 + rand(h)

    extra = dict(extra_config or {})
    if algorithm == "EAGLE3":
        if draft_vocab_size is not None:
            config["draft_vocab_size"] = draft_vocab_size
        if "eagle_config" not in extra:
            _ensure_distinct_aux_layers(config, target_cfg.num_hidden_layers)
    elif draft_vocab_size is not None:
        raise ValueError("EAGLE-1/2 heads use the target's LM head; draft_vocab_size applies to "
                         "EAGLE3 only (FR-Spec hot vocabularies are a runtime token map)")
    config.update(extra)

    p = _PREFIX[algorithm]
    in_attn = h if algorithm == "EAGLE" else 2 * h
    state: dict[str, torch.Tensor] = {}
    if algorithm == "EAGLE":
        state["fc.weight"] = rand(h, 2 * h)
        if config.get("bias", True):
            state["fc.bias"] = rand(h)
    else:
        n_aux = len(eagle3_capture_layers(config, target_cfg.num_hidden_layers))
        state["fc.weight"] = rand(h, n_aux * h)
    state[p + "self_attn.q_proj.weight"] = rand(q_out, in_attn)
    state[p + "self_attn.k_proj.weight"] = rand(kv_out, in_attn)
    state[p + "self_attn.v_proj.weight"] = rand(kv_out, in_attn)
    state[p + "self_attn.o_proj.weight"] = rand(h, q_out)
    state[p + "mlp.gate_proj.weight"] = rand(inter, h)
    state[p + "mlp.up_proj.weight"] = rand(inter, h)
    state[p + "mlp.down_proj.weight"] = rand(h, inter)
    state[p + "post_attention_layernorm.weight"] = norm()
    if algorithm == "EAGLE3":
        state[p + "input_layernorm.weight"] = norm()
        state[p + "hidden_norm.weight"] = norm()
        state["norm.weight"] = norm()
        if draft_vocab_size is not None:
            state.update(_draft_vocab(draft_vocab_size, vocab, h, g, scale))
    if embed_tokens is not None:
        state["embed_tokens.weight"] = embed_tokens
    return save_draft_checkpoint(state, config, out_dir, fmt)


def _ensure_distinct_aux_layers(config: dict[str, Any], num_layers: int) -> None:
    try:
        eagle3_capture_layers(config, num_layers)
    except ValueError:
        # Configured ids are layer OUTPUTS (captured at id + 1); keep them in [0, L-2].
        top = num_layers - 2
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [0, top // 2, top]}


def _draft_vocab(rows: int, vocab: int, hidden: int, g: torch.Generator,
                 scale: float) -> dict[str, torch.Tensor]:
    """lm_head.weight, d2t (offsets: target id = draft id + d2t) and t2d, as in public heads."""
    if not 1 <= rows <= vocab:
        raise ValueError(f"draft_vocab_size={rows} must be in [1, {vocab}] (the target vocabulary)")
    ids = torch.randperm(vocab, generator=g)[:rows].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    return {"lm_head.weight": torch.randn(rows, hidden, generator=g) * scale,
            "d2t": ids - torch.arange(rows), "t2d": t2d}
