"""Greedy EAGLE speculative decoding is lossless: token for token the target's own greedy output.

Random-weight heads (EAGLE-1/2 and EAGLE-3, public formats) on the real SmolLM2 target exercise
rejection everywhere; an oracle draft that proposes the target's own continuation exercises
acceptance: every step must then accept num_steps + 1 tokens and the output must not change.
"""

from __future__ import annotations

import pytest
import torch

from hotspec import LLM, SamplingParams
from hotspec.core.kv_pool import KVPool
from hotspec.engine.builder import EngineBuilder
from hotspec.models.default_model import default_model_path
from hotspec.models.draft_checkpoint import random_draft_checkpoint
from hotspec.models.loader import load_checkpoint

PROMPTS = [
    "The capital of France is",
    "def quicksort(arr):",
    "List three colours:",
    "Hi",
    "Write a haiku about the sea.",
    "In 1969, the first humans landed on",
    "Translate to French: I like apples.",
    "The quick brown fox jumps over the lazy dog. Then the dog",
]
SHAPES = [(3, 1, 4), (5, 4, 8), (6, 8, 16)]
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def vanilla_outputs(smol_llm):
    p = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    return {pr: o.token_ids for pr, o in zip(PROMPTS, smol_llm.generate(PROMPTS, p))}


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    cfg, _ = load_checkpoint(default_model_path(), torch.float32)
    root = tmp_path_factory.mktemp("heads")
    return {a: random_draft_checkpoint(root / a, cfg, a, seed=1) for a in ("EAGLE", "EAGLE3")}


def _spec_llm(algo: str, path, shape) -> LLM:
    steps, topk, ntok = shape
    return LLM(dtype="float32", device="cpu", kv_cache_memory_gb=0.05, speculative_algorithm=algo,
               speculative_draft_model_path=str(path), speculative_num_steps=steps,
               speculative_eagle_topk=topk, speculative_num_draft_tokens=ntok)


@pytest.mark.parametrize("algo", ["EAGLE", "EAGLE3"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"steps{s[0]}-topk{s[1]}-tok{s[2]}")
def test_greedy_lossless_random_head(algo, shape, heads, vanilla_outputs, smol_llm):
    llm = _spec_llm(algo, heads[algo], shape)
    p = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    for bs in (1, 3, 8):
        prompts = PROMPTS[:bs]
        outs = llm.generate(prompts, p)
        for pr, o in zip(prompts, outs):
            assert o.token_ids == vanilla_outputs[pr], (bs, pr)
            assert o.stats.spec_steps > 0
    # stop strings inside a run: nothing after the stop is emitted, same as vanilla
    ps = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop=[" the", "\n"])
    ref = smol_llm.generate(PROMPTS, ps)
    outs = llm.generate(PROMPTS, ps)
    assert [o.text for o in outs] == [r.text for r in ref]
    assert [o.token_ids for o in outs] == [r.token_ids for r in ref]
    assert [o.finish_reason for o in outs] == [r.finish_reason for r in ref]
    assert llm.engine.allocator.num_free == llm.engine.allocator.num_blocks


class OracleDraft(torch.nn.Module):
    """Test stand-in for a draft head that knows the target's greedy continuations. It rebuilds each
    query's token history from the slots it can see (the attention plan of the reference backend)
    and proposes the next token of the matching known sequence, so it is right whenever the
    context is on the target's greedy path."""

    aux_layer_ids: tuple[int, ...] = ()

    def __init__(self, sequences: list[list[int]], vocab: int, like) -> None:
        super().__init__()
        self.sequences, self.vocab, self.config = sequences, vocab, like
        self.draft_vocab_size = vocab
        self.hidden_size = self.target_feature_size = 1
        self.slot_token: dict[int, int] = {}

    def make_kv_pool(self, num_blocks, block_size, dtype, device) -> KVPool:
        return KVPool(1, num_blocks, block_size, 1, 8, dtype, device)

    def to_target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return ids

    def compute_logits(self, h: torch.Tensor) -> torch.Tensor:
        logits = torch.full((h.shape[0], self.vocab), -10.0)
        logits.scatter_(1, h.long(), 10.0)
        return logits

    draft_logits = compute_logits

    def _predict(self, history: list[int]) -> int:
        n = len(history)
        for s in self.sequences:  # the draft reads token p+1 at kv index p: compare with s[1:]
            if len(s) > n + 1 and s[1 : n + 1] == history:
                return s[n + 1]
        return 0

    def forward(self, fb, kv, backend):
        for slot, tok in zip(fb.out_cache_loc.tolist(), fb.input_ids.tolist()):
            self.slot_token[slot] = tok
        plan = fb.attn_meta
        width = plan.q_width
        mask = plan.mask[:, 0]
        preds = []
        for t in range(fb.num_tokens):
            if plan.q_index is None:
                b, qi = divmod(t, width)
            else:
                flat = int(plan.q_index[t])
                b, qi = divmod(flat, width)
            vis = mask[b, qi].nonzero().squeeze(1).tolist()
            hist = [self.slot_token.get(int(plan.kv_slots[b, j]), -1) for j in vis]
            preds.append(self._predict(hist))
        h = torch.tensor(preds, dtype=torch.float32).unsqueeze(1)
        return h, torch.zeros_like(h)  # [T, 1]: the stand-in's "feature" is one number


@pytest.mark.parametrize("shape", [(3, 1, 4), (4, 2, 6)], ids=["chain", "tree"])
def test_oracle_draft_accepts_every_token(shape, smol_llm, monkeypatch):
    steps, topk, ntok = shape
    n = 20
    tok = smol_llm.tokenizer
    prompts = PROMPTS[:3]
    long = smol_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=n + 8, ignore_eos=True))
    seqs = [tok.encode(p) + o.token_ids for p, o in zip(prompts, long)]
    oracle = OracleDraft(seqs, smol_llm.engine.model_config.vocab_size, like=None)
    monkeypatch.setattr(EngineBuilder, "_load_draft", lambda self: oracle)
    oracle.config = type("C", (), {"num_key_value_heads": 1, "head_dim": 8})()
    llm = LLM(dtype="float32", device="cpu", kv_cache_memory_gb=0.05, speculative_algorithm="EAGLE",
              speculative_draft_model_path="oracle", speculative_num_steps=steps,
              speculative_eagle_topk=topk, speculative_num_draft_tokens=ntok)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    for o, ref in zip(outs, long):
        assert o.token_ids == ref.token_ids[:n]
    hist = llm.engine.worker.stats.accept_hist
    assert set(hist) == {steps + 1}, hist
    assert all(o.stats.spec_steps == -(-(n - 1) // (steps + 1)) for o in outs)
