"""Parity with Hugging Face transformers on real weights (SmolLM2-135M-Instruct GGUF, float32)."""

from __future__ import annotations

from engine_utils import assert_hf_parity

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea, there lived",
    "Q: What is 17 times 23?\nA:",
    "Speculative decoding speeds up inference because",
    "Hi",
]


def test_logits_and_greedy_64_tokens_match_transformers_single_and_batch(smol_llm, hf_smol):
    tok = smol_llm.tokenizer
    ids = [tok.encode(p) for p in PROMPTS]  # last logits: prompts of different lengths, one batch
    assert_hf_parity(smol_llm, hf_smol, ids, ids[:4], 64)
