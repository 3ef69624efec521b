"""Test helpers: last-position logits through the engine's own prefill path."""

from __future__ import annotations

import torch

from hotspec.engine.engine import Engine
from hotspec.engine.request import Request
from hotspec.runtime.batch_builder import last_token_index, prefill_batch
from hotspec.sampling_params import SamplingParams


def prefill_logits(engine: Engine, prompts: list[list[int]]) -> torch.Tensor:
    """[len(prompts), V] logits after each prompt, computed in one ragged prefill batch."""
    reqs = [Request(-1 - i, p, SamplingParams(), 0) for i, p in enumerate(prompts)]
    for r in reqs:
        r.blocks = engine.allocator.allocate(-(-len(r.prompt_token_ids) // engine.block_size))
    try:
        fb = prefill_batch(reqs, [r.prompt_token_ids for r in reqs], engine.block_size, engine.device)
        runner = engine.worker.runner if hasattr(engine.worker, "runner") else engine.worker.target_runner
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
    fused kernels), once per value of the zero-argument switch `hotspec.layers.fused.<switch>`;
    per run: (tokens of two prompts, the row count of every call to `fused.<entry>`)."""
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
    for value in values:
        monkeypatch.setattr(fused, switch, lambda v=value: v)
        rows.clear()
        llm = LLM(str(path), device="cpu", dtype="bfloat16", skip_tokenizer_init=True, max_num_seqs=1,
                  **llm_kw)
        tokens = [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)]
        runs.append((tokens, list(rows)))
    return runs
