"""Parity with transformers on random-weight tiny configs of every supported family."""

from __future__ import annotations

import pytest
import torch
from engine_utils import hf_greedy, prefill_logits, rel_l2

from hotspec import LLM, SamplingParams

COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
              num_attention_heads=4, max_position_embeddings=512, rms_norm_eps=1e-6)


def _families():
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    return {
        "llama-gqa-untied": LlamaConfig(**COMMON, num_key_value_heads=2, tie_word_embeddings=False,
                                        rope_theta=500000.0),
        "llama3-rope-scaling-tied": LlamaConfig(
            **COMMON, num_key_value_heads=1, tie_word_embeddings=True,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
        "qwen2-bias": Qwen2Config(**COMMON, num_key_value_heads=2, tie_word_embeddings=False),
        "qwen3-qknorm-tied": Qwen3Config(**COMMON, num_key_value_heads=2, head_dim=32,
                                         tie_word_embeddings=True),
    }


@pytest.mark.parametrize("name", list(_families()))
def test_tiny_family_parity(name, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = _families()[name]
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():  # larger than default init so that greedy paths are not degenerate
        for p in hf.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.15)
    hf.save_pretrained(tmp_path)
    llm = LLM(model=str(tmp_path), dtype="float32", device="cpu", skip_tokenizer_init=True,
              num_kv_blocks=64, block_size=4)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 17, 9)]
    ours = prefill_logits(llm.engine, prompts)
    for i, p in enumerate(prompts):
        with torch.no_grad():
            ref = hf(torch.tensor([p])).logits[0, -1]
        assert rel_l2(ours[i], ref) < 1e-4
    outs = llm.generate(prompt_token_ids=prompts,
                        sampling_params=SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    for out, p in zip(outs, prompts):
        ref = hf_greedy(hf, p, 12)
        assert out.token_ids == ref
