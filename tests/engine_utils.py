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
