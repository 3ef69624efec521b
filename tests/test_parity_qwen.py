"""Parity with transformers on a real large-vocabulary model: Qwen2.5-Coder-0.5B-Instruct (qwen2,
q/k/v biases, untied LM head, vocabulary 151,936), joined from its PyPI part packages, float32."""

from __future__ import annotations

import pytest
import torch
from engine_utils import assert_hf_parity

from hotspec import LLM
from hotspec.models.packaged import PACKAGED_MODELS, assemble

NAME = "qwen2.5-coder-0.5b-instruct"
PROMPTS = [
    "def is_prime(n: int) -> bool:\n    ",
    "The capital of France is",
    "# Sort a list of dictionaries by the value of the key 'age'\n",
    "Explain what a hash map is in one sentence:",
]
CHAT = ["Write a Python function that returns the n-th Fibonacci number.",
        "Translate to German: The weather is nice today."]


@pytest.fixture(scope="module")
def qwen_gguf(tmp_path_factory):
    return assemble(PACKAGED_MODELS[NAME], tmp_path_factory.mktemp("qwen") / f"{NAME}.gguf")


@pytest.fixture(scope="module")
def qwen_llm(qwen_gguf):
    return LLM(str(qwen_gguf), dtype="float32", device="cpu", max_num_seqs=4)


@pytest.fixture(scope="module")
def hf_qwen(qwen_gguf):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(qwen_gguf.parent), gguf_file=qwen_gguf.name,
                                             dtype=torch.float32)
    return m.eval()


def test_the_model_is_what_the_issue_describes(qwen_llm):
    cfg = qwen_llm.engine.model_config
    assert (cfg.architecture, cfg.vocab_size, cfg.num_hidden_layers, cfg.hidden_size) == (
        "qwen2", 151936, 24, 896)
    assert cfg.attention_bias and not cfg.tie_word_embeddings
    assert cfg.eos_token_ids == (qwen_llm.tokenizer.convert_tokens_to_ids("<|im_end|>"),)


def test_logits_and_greedy_chat_match_transformers_single_and_batch(qwen_llm, hf_qwen):
    tok = qwen_llm.tokenizer
    chat = [tok.encode(tok.apply_chat_template([{"role": "user", "content": c}], tokenize=False,
                                               add_generation_prompt=True), add_special_tokens=False)
            for c in CHAT]
    plain = [tok.encode(p) for p in PROMPTS]
    refs = assert_hf_parity(qwen_llm, hf_qwen, plain, chat + plain[:1], 40)
    assert "def" in tok.decode(refs[0])  # a real answer, not noise
