"""transformers' own LlamaForCausalLM on the engine's weights, timed through `generate` with a
static cache (greedy): the reference hotspec's tokens/s are compared against.

The weights are shared with the engine's target (no copy). Every timed call is preceded by a
warm-up with identical shapes, so that transformers' own compilation of the static-cache decode
step (its default on CUDA for cache_implementation="static") is never timed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from hotspec.benchmark.device import sync
from hotspec.models.config import ModelConfig

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM as HFLlama

    from hotspec.engine.engine import Engine


def hf_unsupported_reason(mc: ModelConfig) -> str | None:
    """Why transformers' LlamaForCausalLM cannot hold this target, or None when it can."""
    if mc.attention_bias:
        return f"{mc.architecture} has q/k/v biases (LlamaConfig's bias also covers o_proj)"
    if mc.qk_norm:
        return f"{mc.architecture} normalises q and k per head (not in LlamaForCausalLM)"
    return None


def hf_llama(engine: Engine) -> HFLlama:
    """transformers' LlamaForCausalLM sharing the engine target's weights, in eval mode."""
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM as HFLlama

    mc = engine.model_config
    reason = hf_unsupported_reason(mc)
    if reason is not None:
        raise ValueError(f"no transformers Llama baseline for this target: {reason}")
    eos = sorted(engine.eos_token_ids)
    hf_cfg = LlamaConfig(
        vocab_size=mc.vocab_size, hidden_size=mc.hidden_size, intermediate_size=mc.intermediate_size,
        num_hidden_layers=mc.num_hidden_layers, num_attention_heads=mc.num_attention_heads,
        num_key_value_heads=mc.num_key_value_heads, head_dim=mc.head_dim, rms_norm_eps=mc.rms_norm_eps,
        rope_theta=mc.rope_theta, rope_scaling=mc.rope_scaling,  # type: ignore[call-arg]  # taken as **kwargs
        max_position_embeddings=mc.max_position_embeddings, tie_word_embeddings=mc.tie_word_embeddings,
        bos_token_id=mc.bos_token_id, eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0)
    with torch.device("meta"):
        hf = HFLlama(hf_cfg)
    hf.load_state_dict(engine.target.hf_state_dict(), strict=True, assign=True)
    hf.tie_weights()
    with torch.device(engine.device):
        hf.model.rotary_emb = type(hf.model.rotary_emb)(hf_cfg)
    return hf.eval()


def _timed(device: torch.device, fn: Callable[[], object]) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def hf_generate_tokens_per_s(engine: Engine, batch: int, context: int, tokens: int, seed: int) -> float:
    """Decode rate of `generate` on random prompts of `context` tokens, `tokens` forced new tokens:
    batch * (tokens - 1) / (time(generate tokens) - time(one prefill forward))."""
    hf = hf_llama(engine)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, engine.model_config.vocab_size, (batch, context), generator=gen).to(engine.device)

    def generate() -> None:
        hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                    min_new_tokens=tokens, do_sample=False, cache_implementation="static", pad_token_id=0)

    def prefill() -> None:
        with torch.no_grad():
            hf(ids)

    generate()  # warm-up with identical shapes
    prefill()
    t_gen, t_prefill = _timed(engine.device, generate), _timed(engine.device, prefill)
    return batch * (tokens - 1) / (t_gen - t_prefill)


@dataclass
class HFRun:
    outputs: list[list[int]]  # generated ids per prompt
    seconds: list[float]  # wall time of each prompt's generate call (prefill included)


def hf_generate_prompts(engine: Engine, prompts: list[list[int]], max_new_tokens: list[int],
                        ignore_eos: bool = False) -> HFRun:
    """Greedy `generate` at batch 1 for each prompt, up to `max_new_tokens[i]` new tokens, stopping
    at the engine's EOS ids unless `ignore_eos` (then EOS is an ordinary token, as in the engine).
    One static cache length serves every call, so the decode step's shapes never change; the
    first prompt is generated once untimed as the warm-up."""
    hf = hf_llama(engine)
    if ignore_eos:
        hf.generation_config.eos_token_id = None
    dev = engine.device
    cache_len = max(len(p) + n for p, n in zip(prompts, max_new_tokens))
    outputs: list[list[int]] = []
    seconds: list[float] = []

    def generate(ids: torch.Tensor, n: int) -> torch.Tensor:
        return hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                           do_sample=False, cache_implementation="static", max_cache_len=cache_len)

    for i, (p, n) in enumerate(zip(prompts, max_new_tokens)):
        ids = torch.tensor([p], dtype=torch.long, device=dev)
        if i == 0:
            generate(ids, n)
        sync(dev)
        t0 = time.perf_counter()
        out = generate(ids, n)
        sync(dev)
        seconds.append(time.perf_counter() - t0)
        outputs.append(out[0, len(p):].tolist())
    return HFRun(outputs, seconds)
