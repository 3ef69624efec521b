"""Graphed prefill (runtime/prefill.py) against eager prefill on the GPU, random weights of real
shapes (no files): greedy tokens equal in float32 (vanilla and with a random EAGLE-3 head), and
the wall time of a prefill step (engine.step() that prefills, device synced) side by side, with
the 8B shape's prefill plus first token against its bound (weights read at 4.37 TB/s, or the
matmuls at 790 TFLOP/s, whichever is larger).

    python3 lab/prefill_check.py
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from hotspec.benchmark.random_models import SHAPES, random_state
from hotspec.config import EngineConfig
from hotspec.engine.engine import Engine
from hotspec.models.build import build_target
from hotspec.models.draft_checkpoint import random_draft_checkpoint
from hotspec.sampling_params import SamplingParams

DEV = torch.device("cuda")


def engine(shape: str, dtype: torch.dtype, graphed: bool, head: Path | None, **kw: object) -> Engine:
    cfg_m = SHAPES[shape]
    target = build_target(cfg_m, random_state(cfg_m, DEV, dtype), dtype, DEV)
    cfg = EngineConfig(skip_tokenizer_init=True, kv_cache_memory_gb=4, max_num_seqs=8,
                       cuda_graph_max_bs=8, cuda_graph_prefill_tokens=2048 if graphed else 0, **kw)  # type: ignore[arg-type]
    if head is not None:
        cfg = replace(cfg, speculative_algorithm="EAGLE3", speculative_draft_model_path=str(head),
                      speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    return Engine.from_model(cfg, cfg_m, target)


def prompts(n: int, lengths: list[int], vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (lengths[i % len(lengths)],), generator=g).tolist() for i in range(n)]


def greedy(e: Engine, ps: list[list[int]], tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    reqs = [e.add_request(p, params) for p in ps]
    while e.has_unfinished():
        e.step()
    return [r.output_token_ids for r in reqs]


def prefill_ms(e: Engine, ps: list[list[int]]) -> float:
    """One engine step that prefills `ps` together (and samples their first token)."""
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    for p in ps:
        e.add_request(p, params)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    e.step()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    while e.has_unfinished():
        e.step()
    return ms


def timed(e: Engine, batch: int, length: int, reps: int = 9) -> float:
    vocab = e.model_config.vocab_size
    for i in range(2):
        prefill_ms(e, prompts(batch, [length], vocab, 100 + i))
    return statistics.median(prefill_ms(e, prompts(batch, [length], vocab, 200 + i)) for i in range(reps))


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    cfg_s = SHAPES["smollm2-shape"]
    head = random_draft_checkpoint(tmp / "head", cfg_s, "EAGLE3", seed=0, draft_vocab_size=8192)
    ps = prompts(8, [5, 40, 130, 300, 17, 700, 64, 9], cfg_s.vocab_size, 1)
    for name, h in (("vanilla", None), ("eagle3", head)):
        outs = [greedy(engine("smollm2-shape", torch.float32, g, h), ps, 24) for g in (False, True)]
        same = sum(a == b for a, b in zip(*outs))
        print(f"float32 smollm2-shape {name}: graphed prefill == eager for {same}/{len(ps)} prompts",
              flush=True)
    print("\nprefill step wall ms (median of 9), bf16: eager -> graphed", flush=True)
    for name, h in (("vanilla", None), ("eagle3", head)):
        es = {g: engine("smollm2-shape", torch.bfloat16, g, h) for g in (False, True)}
        for batch, length in ((1, 32), (8, 64), (8, 300), (1, 512), (1, 1000)):
            a, b = timed(es[False], batch, length), timed(es[True], batch, length)
            print(f"smollm2-shape {name:<7} {batch} x {length:>4} tokens: {a:7.2f} -> {b:6.2f}", flush=True)
        del es
        torch.cuda.empty_cache()
    cfg_8b = SHAPES["llama8b-shape"]
    weights = 15.01e9
    es = {g: engine("llama8b-shape", torch.bfloat16, g, None) for g in (False, True)}
    for length in (32, 128, 512, 2048):
        flops = 2 * 7.5e9 * length  # ~7.5 B matmul parameters a token (8B less the embedding)
        bound = max(weights / 4.37e12, flops / 790e12) * 1e3
        a, b = timed(es[False], 1, length, 5), timed(es[True], 1, length, 5)
        print(f"llama8b-shape 1 x {length:>4}: {a:6.2f} -> {b:6.2f} ms (bound {bound:.2f}, "
              f"{b / bound:.2f}x)", flush=True)
    del cfg_8b


if __name__ == "__main__":
    main()
