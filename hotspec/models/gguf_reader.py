"""Read a llama.cpp GGUF file into a Hugging Face style config dict and HF-named torch tensors.

Invariants of the output, whatever the file's quantization:
  * tensor names and shapes are exactly those of the HF checkpoint the GGUF was converted from
    (`model.layers.{i}.self_attn.q_proj.weight`, ...); `lm_head.weight` is absent when tied;
  * llama `q_proj`/`k_proj` rows are back in HF's rotate-half order (llama.cpp interleaves them
    for its RoPE kernel); qwen2/qwen3 are stored un-permuted by llama.cpp and are left alone;
  * the config dict is what `ModelConfig.from_hf_dict` reads, so both checkpoint kinds share it.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

import numpy as np
import torch
from gguf import GGUFValueType
from gguf.quants import dequantize

from hotspec.errors import ModelLoadError
from hotspec.models.gguf_file import GGUFFile, GGUFFormatError, GGUFTensor, read_gguf_file

SUPPORTED_GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3")

# llama.cpp names the same tensors for all three architectures.
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# Llama-3 style RoPE is stored as per-frequency divisors instead of rope_scaling metadata.
_ROPE_FREQS = "rope_freqs.weight"


def read_gguf(
    path: str | os.PathLike, dtype: torch.dtype
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Return (HF-style config dict, HF-named tensors dequantized to `dtype`)."""
    reader = _open(path)
    config = _config_dict(reader)
    tensors = {}
    for t in reader.tensors:
        if t.name == _ROPE_FREQS:
            continue  # folded into config["rope_scaling"]
        tensors[_hf_name(t.name, path)] = _to_torch(t, config, dtype)
    return config, tensors


def read_gguf_config(path: str | os.PathLike) -> dict[str, Any]:
    """The config dict alone, without dequantizing any weight."""
    return _config_dict(_open(path))


def _open(path: str | os.PathLike) -> GGUFFile:
    try:
        reader = read_gguf_file(path)
    except GGUFFormatError as e:
        raise ModelLoadError(
            f"{path} is not a readable GGUF file ({e}). Fix: re-download it or re-convert it with "
            "llama.cpp's convert_hf_to_gguf.py."
        ) from e
    splits = _get(reader, "split.count", 1)
    if splits > 1:
        raise ModelLoadError(
            f"{path} is one of {splits} split GGUF parts. Fix: merge them into one file with "
            "`llama-gguf-split --merge FIRST_PART.gguf merged.gguf` and load merged.gguf."
        )
    return reader


def _get(reader: GGUFFile, key: str, default: Any = None) -> Any:
    value = reader.fields.get(key)
    if value is None:
        return default
    if reader.types[key] == GGUFValueType.FLOAT32:
        # GGUF stores float32: 1e-5 arrives as 9.999999747e-06. The shortest float32 repr is the
        # number the converter wrote, so an HF folder and its GGUF produce equal configs.
        value = float(str(np.float32(value)))
    return value


def _require(reader: GGUFFile, key: str) -> Any:
    value = _get(reader, key)
    if value is None:
        raise ModelLoadError(
            f"GGUF metadata key {key!r} is missing. Fix: re-convert the model with a current "
            "llama.cpp convert_hf_to_gguf.py, or load the original Hugging Face folder instead."
        )
    return value


def _torch_shape(t: GGUFTensor) -> tuple[int, ...]:
    return tuple(int(n) for n in reversed(t.shape))  # GGUF lists dims innermost-first


def _config_dict(reader: GGUFFile) -> dict[str, Any]:
    arch = _require(reader, "general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ModelLoadError(
            f"GGUF architecture {arch!r} is not supported; hotspec reads "
            f"{', '.join(SUPPORTED_GGUF_ARCHITECTURES)} GGUF files (SmolLM2 and Mistral GGUFs are "
            "'llama'). Fix: use a model of one of those architectures."
        )
    by_name = {t.name: t for t in reader.tensors}
    heads = _require(reader, f"{arch}.attention.head_count")
    if not isinstance(heads, int):
        raise ModelLoadError(
            f"GGUF {arch} has per-layer head counts {heads}, which hotspec does not support. "
            "Fix: use a model with the same number of heads in every layer."
        )
    q_rows = _torch_shape(by_name["blk.0.attn_q.weight"])[0] if "blk.0.attn_q.weight" in by_name else 0
    # key_length is only written when the HF config has head_dim (qwen3 does, SmolLM2 does not).
    head_dim = _get(reader, f"{arch}.attention.key_length") or q_rows // heads or None
    theta = float(_get(reader, f"{arch}.rope.freq_base", 10000.0))
    config: dict[str, Any] = {
        "model_type": arch,
        "vocab_size": _torch_shape(by_name["token_embd.weight"])[0]
        if "token_embd.weight" in by_name
        else _require(reader, f"{arch}.vocab_size"),
        "hidden_size": _require(reader, f"{arch}.embedding_length"),
        "intermediate_size": _require(reader, f"{arch}.feed_forward_length"),
        "num_hidden_layers": _require(reader, f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": _get(reader, f"{arch}.attention.head_count_kv", heads),
        "rms_norm_eps": _get(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": theta,
        "rope_scaling": _rope_scaling(reader, arch, by_name.get(_ROPE_FREQS), head_dim, theta),
        "max_position_embeddings": _get(reader, f"{arch}.context_length", 4096),
        "tie_word_embeddings": "output.weight" not in by_name,
        "attention_bias": "blk.0.attn_q.bias" in by_name,
        "bos_token_id": _get(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _eos_ids(reader),
    }
    if head_dim:
        config["head_dim"] = head_dim
    return config


def _eos_ids(reader: GGUFFile) -> int | list[int] | None:
    """eos plus llama.cpp's other end-of-generation ids (end-of-turn, end-of-message)."""
    ids: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        value = _get(reader, f"tokenizer.ggml.{key}")
        if value is not None and value not in ids:
            ids.append(value)
    if not ids:
        return None
    return ids[0] if len(ids) == 1 else ids


def _rope_scaling(
    reader: GGUFFile, arch: str, rope_freqs: GGUFTensor | None, head_dim: int | None, theta: float
) -> dict[str, Any] | None:
    if rope_freqs is not None:
        if head_dim is None:
            raise ModelLoadError(
                "GGUF has rope_freqs but no attention tensors to size heads from. "
                "Fix: use a complete GGUF file."
            )
        factors = dequantize(rope_freqs.data, rope_freqs.tensor_type)
        return llama3_scaling_from_freq_factors(factors, head_dim, theta)
    kind = _get(reader, f"{arch}.rope.scaling.type")
    linear = _get(reader, f"{arch}.rope.scale_linear")  # pre-2024 converters
    if kind is None and linear is not None and linear != 1.0:
        return {"rope_type": "linear", "factor": linear}
    if kind is None or kind == "none":
        return None
    scaling: dict[str, Any] = {"rope_type": kind, "factor": _require(reader, f"{arch}.rope.scaling.factor")}
    original = _get(reader, f"{arch}.rope.scaling.original_context_length")
    if original is not None:
        scaling["original_max_position_embeddings"] = original
    attn_factor = _get(reader, f"{arch}.rope.scaling.attn_factor")
    if attn_factor is not None:
        scaling["attention_factor"] = attn_factor
    return scaling


def llama3_freq_factors(scaling: dict[str, Any], head_dim: int, theta: float) -> np.ndarray:
    """The per-frequency divisors llama.cpp's converter writes as `rope_freqs` for llama3 RoPE."""
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_ctx = scaling["original_max_position_embeddings"]
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / freqs
    smooth = (old_ctx / wavelen - low) / (high - low)
    mid = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < old_ctx / high, 1.0, np.where(wavelen > old_ctx / low, factor, mid))


def llama3_scaling_from_freq_factors(factors: np.ndarray, head_dim: int, theta: float) -> dict[str, Any]:
    """Recover HF `rope_scaling` from `rope_freqs`, which is all a Llama-3.x GGUF keeps of it.

    Only `factor` is readable off the tensor (its largest entry); the rest is the Llama-3.x
    constants the converter defaults to, and the result is checked by rebuilding the tensor.
    """
    scaling: dict[str, Any] = {
        "rope_type": "llama3",
        "factor": float(str(np.float32(factors.max()))),
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    expected = llama3_freq_factors(scaling, head_dim, theta)
    if factors.shape != expected.shape or not np.allclose(factors, expected, rtol=1e-4):
        raise ModelLoadError(
            "GGUF rope_freqs tensor does not match Llama-3 RoPE scaling with low_freq_factor=1, "
            "high_freq_factor=4, original context 8192, so hotspec cannot rebuild its RoPE. "
            "Fix: load the original Hugging Face folder (its config.json has rope_scaling)."
        )
    return scaling


def _hf_name(name: str, path: str | os.PathLike) -> str:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _BLOCK_RE.fullmatch(name)
    if m is None or m.group(2) not in _BLOCK_NAMES:
        raise ModelLoadError(
            f"{path} holds tensor {name!r}, which has no Llama/Qwen counterpart. Fix: use a plain "
            "llama/qwen2/qwen3 GGUF from convert_hf_to_gguf.py, or the original Hugging Face folder."
        )
    layer, part, kind = m.groups()
    return f"model.layers.{layer}.{_BLOCK_NAMES[part]}.{kind}"


def _to_torch(t: GGUFTensor, config: dict[str, Any], dtype: torch.dtype) -> torch.Tensor:
    w = dequantize(t.data, t.tensor_type).reshape(_torch_shape(t))
    if config["model_type"] == "llama":
        part = t.name.split(".")[2] if t.name.startswith("blk.") else ""
        if part == "attn_q":
            w = _unpermute(w, config["num_attention_heads"])
        elif part == "attn_k":
            w = _unpermute(w, config["num_key_value_heads"])
    if not w.flags.writeable:  # F32 tensors are views of the read-only memory map
        w = w.copy()
    return torch.from_numpy(w).to(dtype)


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute`: per head, interleaved (x0, y0, x1, y1, ...) rows go
    back to HF's halves (x0, x1, ..., y0, y1, ...)."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
