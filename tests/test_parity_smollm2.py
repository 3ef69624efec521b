"""Parity with Hugging Face transformers on real weights (SmolLM2-135M-Instruct GGUF, float32)."""

from __future__ import annotations

import torch
from engine_utils import hf_greedy, prefill_logits, rel_l2

from hotspec import SamplingParams

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea, there lived",
    "Q: What is 17 times 23?\nA:",
    "Speculative decoding speeds up inference because",
    "Hi",
]


def test_last_logits_match_transformers(smol_llm, hf_smol):
    tok = smol_llm.tokenizer
    ids = [tok.encode(p) for p in PROMPTS]
    ours = prefill_logits(smol_llm.engine, ids)  # one ragged batch, prompts of different lengths
    for i, p in enumerate(ids):
        with torch.no_grad():
            ref = hf_smol(torch.tensor([p])).logits[0, -1]
        assert rel_l2(ours[i], ref) < 1e-3, PROMPTS[i]


def test_greedy_64_tokens_match_transformers_single_and_batch(smol_llm, hf_smol):
    tok = smol_llm.tokenizer
    ids = [tok.encode(p) for p in PROMPTS[:4]]
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    refs = [hf_greedy(hf_smol, p, 64) for p in ids]
    single = smol_llm.generate(prompt_token_ids=ids[:1], sampling_params=params)
    assert single[0].token_ids == refs[0]
    batch = smol_llm.generate(prompt_token_ids=ids, sampling_params=params)
    for out, ref in zip(batch, refs):
        assert out.token_ids == ref
    assert smol_llm.engine.allocator.num_free == smol_llm.engine.allocator.num_blocks
