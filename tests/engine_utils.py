"""Test helpers: last-position logits through the engine's own prefill path."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hotspec.core.request import Request
from hotspec.engine.engine import Engine
from hotspec.runtime.batch_builder import last_token_index, prefill_batch
from hotspec.sampling_params import SamplingParams

if TYPE_CHECKING:
    from hotspec.models.config import ModelConfig


def prefill_logits(engine: Engine, prompts: list[list[int]]) -> torch.Tensor:
    """[len(prompts), V] logits after each prompt, computed in one ragged prefill batch."""
    reqs = [Request(-1 - i, p, SamplingParams(), 0) for i, p in enumerate(prompts)]
    for r in reqs:
        r.blocks = engine.allocator.allocate(-(-len(r.prompt_token_ids) // engine.block_size))
    try:
        fb = prefill_batch(reqs, [r.prompt_token_ids for r in reqs], engine.block_size, engine.device)
        worker = engine.worker
        runner = worker.target_runner
        hidden, _ = runner.forward(fb)
        return engine.target.compute_logits(hidden[last_token_index(fb)])
    finally:
        for r in reqs:
            engine.allocator.free(r.blocks)


def greedy_tokens(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    """Each prompt's generated tokens, the requests stepped together to the end."""
    reqs = [engine.add_request(p, params) for p in prompts]
    toks: dict[int, list[int]] = {id(r): [] for r in reqs}
    while engine.has_unfinished():
        for o in engine.step():
            toks[id(o.request)] += o.new_token_ids
    return [toks[id(r)] for r in reqs]


def random_engine(tmp_path=None, *, layers: int = 6, dtype: torch.dtype = torch.bfloat16,
                  seed: int = 5, algo: str | None = None, head_seed: int = 1,
                  attn_scale: float = 5.0, shape: ModelConfig | None = None,
                  graphed: bool = True, **engine_kw) -> Engine:
    """A CUDA-graphed engine around SmolLM2's shape with random weights (no model file): decode
    at batch 1, 2 and 4; with `algo` ("EAGLE" / "EAGLE3") a random head in tmp_path (3 steps,
    top-4, 8 draft tokens). The attention weights are scaled by `attn_scale`: at the plain
    N(0, 0.02) init the token's own embedding dominates and greedy decoding repeats one token
    (on the CPU, 4 layers: 1-3 distinct tokens in 24), which would hide a wrong KV read; at 5x
    every one of 24 tokens differs, so they depend on the cache. `shape`: another model shape
    than SmolLM2's (its layer count replaced by `layers`). graphed=False: --disable-cuda-graph
    (eager phases, host inputs copied as tensors: the reference for the graph runner).
    `engine_kw`: EngineConfig fields over these (the speculative shape's too)."""
    from dataclasses import replace

    from hotspec.benchmark.random_models import SMOLLM2_135M, random_state
    from hotspec.config import EngineConfig
    from hotspec.models.build import build_target
    from hotspec.models.draft_checkpoint import random_draft_checkpoint

    mc = replace(shape or SMOLLM2_135M, num_hidden_layers=layers)
    dev = torch.device("cuda")
    state = random_state(mc, dev, dtype, seed=seed)
    for name, t in state.items():
        if ".self_attn." in name:
            t.mul_(attn_scale)
    target = build_target(mc, state, dtype, dev)
    spec = {}
    if algo:
        head = random_draft_checkpoint(tmp_path / "head", mc, algo, seed=head_seed)
        spec = dict(speculative_algorithm=algo, speculative_draft_model_path=str(head),
                    speculative_num_steps=3, speculative_eagle_topk=4, speculative_num_draft_tokens=8)
    kw = dict(dtype="auto", device="auto", block_size=16, num_kv_blocks=256, max_num_seqs=4,
              skip_tokenizer_init=True, attention_backend="auto", disable_cuda_graph=not graphed,
              cuda_graph_max_bs=4, **spec)
    cfg = EngineConfig(**{**kw, **engine_kw})
    return Engine.from_model(cfg, mc, target)


def assert_hf_parity(llm, hf, last_logit_prompts: list[list[int]], greedy_prompts: list[list[int]],
                     n: int) -> list[list[int]]:
    """Parity with transformers on real weights: the last logits of every prompt of
    `last_logit_prompts` (one ragged prefill batch) within 1e-3 relative L2, and `n` greedy tokens
    of `greedy_prompts` identical alone (the first) and batched; returns transformers' tokens."""
    ours = prefill_logits(llm.engine, last_logit_prompts)
    for i, p in enumerate(last_logit_prompts):
        with torch.no_grad():
            ref = hf(torch.tensor([p])).logits[0, -1]
        assert rel_l2(ours[i], ref) < 1e-3, f"prompt {i}"
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    refs = [hf_greedy(hf, p, n) for p in greedy_prompts]
    single = llm.generate(prompt_token_ids=greedy_prompts[:1], sampling_params=params)
    assert single[0].token_ids == refs[0]
    batch = llm.generate(prompt_token_ids=greedy_prompts, sampling_params=params)
    assert [o.token_ids for o in batch] == refs
    assert llm.engine.allocator.num_free == llm.engine.allocator.num_blocks
    return refs


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@torch.no_grad()
def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    """transformers' greedy continuation of exactly n tokens (EOS is not special here: it is not
    suppressed, as `min_new_tokens` would do, and does not stop the loop)."""
    out = hf(torch.tensor([ids]), use_cache=True)
    toks: list[int] = []
    for _ in range(n):
        nxt = int(out.logits[0, -1].argmax())
        toks.append(nxt)
        out = hf(torch.tensor([[nxt]]), past_key_values=out.past_key_values, use_cache=True)
    return toks


def save_tiny_llama(path, *, vocab: int, hidden: int, layers: int, std: float, **extra):
    """A random-weight Llama HF folder (seed 0, weights N(0, std): larger than the default init so
    that greedy outputs are not degenerate). Loads in well under a second."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, **extra)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, std)
    model.save_pretrained(path)
    return path


def tiny_target_and_head(root, layers: int):
    """A tiny llama target (vocab 96, hidden 64) under root/target and a random EAGLE-3 head for it
    under root/head: (target folder, head folder)."""
    from hotspec.models.draft_checkpoint import random_draft_checkpoint
    from hotspec.models.loader import load_checkpoint

    save_tiny_llama(root / "target", vocab=96, hidden=64, layers=layers, std=0.2)
    mcfg = load_checkpoint(root / "target", torch.float32)[0]
    return root / "target", random_draft_checkpoint(root / "head", mcfg, "EAGLE3", seed=0, scale=0.3)


def write_gemma_gguf(path):
    """A minimal GGUF of an architecture hotspec does not run (gemma3)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def interpreter_ab(monkeypatch, path, entry: str, switch: str, values, **llm_kw):
    """Greedy bf16 tokens of the model at `path` through Triton's interpreter (CPU tensors take the
    fused kernels), once per value of `hotspec.layers.fused.<switch>` (a function in its place,
    or None: the real one); per run: (tokens of two prompts, the row count of every call to
    `fused.<entry>`)."""
    from hotspec.entrypoints.llm import LLM
    from hotspec.layers import fused
    from hotspec.sampling_params import SamplingParams

    prompts = [[1, 5, 9, 33, 2], list(range(10, 40))]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    monkeypatch.setattr(fused, "_on_device", lambda x: True)
    real = getattr(fused, entry)
    rows: list[int] = []
    monkeypatch.setattr(fused, entry, lambda x, *a: rows.append(x.shape[0]) or real(x, *a))
    runs = []
    original = getattr(fused, switch)
    for value in values:
        monkeypatch.setattr(fused, switch, original if value is None else value)
        rows.clear()
        llm = LLM(str(path), device="cpu", dtype="bfloat16", skip_tokenizer_init=True, max_num_seqs=1,
                  **llm_kw)
        tokens = [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)]
        runs.append((tokens, list(rows)))
    return runs


def save_tiny_chat_llama(path):
    """A 2-layer random Llama with the default model's tokenizer and chat template (what the
    server tests serve): the folder."""
    from hotspec.models.loader import load_tokenizer, resolve_model_path

    tok = load_tokenizer(resolve_model_path(None))
    save_tiny_llama(path, vocab=49152, hidden=64, layers=2, std=0.3,
                    eos_token_id=tok.eos_token_id, tie_word_embeddings=True)
    tok.save_pretrained(path)
    return path
