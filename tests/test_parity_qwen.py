"""Parity with transformers on a real large-vocabulary model: Qwen2.5-Coder-0.5B-Instruct (qwen2,
q/k/v biases, untied LM head, vocabulary 151,936), joined from its PyPI part packages, float32."""

from __future__ import annotations

import pytest
import torch
from engine_utils import hf_greedy, prefill_logits, rel_l2

from hotspec import LLM, SamplingParams
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


def test_last_logits_match_transformers(qwen_llm, hf_qwen):
    tok = qwen_llm.tokenizer
    ids = [tok.encode(p) for p in PROMPTS]
    ours = prefill_logits(qwen_llm.engine, ids)  # one ragged batch
    for i, p in enumerate(ids):
        with torch.no_grad():
            ref = hf_qwen(torch.tensor([p])).logits[0, -1]
        assert rel_l2(ours[i], ref) < 1e-3, PROMPTS[i]


def test_greedy_chat_matches_transformers_single_and_batch(qwen_llm, hf_qwen):
    tok = qwen_llm.tokenizer
    ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": c}], tokenize=False,
                                              add_generation_prompt=True), add_special_tokens=False)
           for c in CHAT]
    ids.append(tok.encode(PROMPTS[0]))
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    refs = [hf_greedy(hf_qwen, p, 40) for p in ids]
    single = qwen_llm.generate(prompt_token_ids=ids[:1], sampling_params=params)
    assert single[0].token_ids == refs[0]
    batch = qwen_llm.generate(prompt_token_ids=ids, sampling_params=params)
    assert [o.token_ids for o in batch] == refs
    assert "def" in tok.decode(refs[0])  # a real answer, not noise
