"""Throughput of `hotspec train-draft`'s optimizer step, on synthetic features (no model file).

The draft-head trainer's step (hotspec/training/trainer.py: batch building, the unrolled head,
the loss, backward, AdamW) timed on random records shaped like the default model's (SmolLM2-135M:
hidden 576, vocabulary 49,152, 30 layers, EAGLE-3 aux features of 3 x 576), so the training
budget of a device call can be planned and the step made faster before a long run.

    python benchmarks/train_step_bench.py --batch-size 16 --draft-vocab 49152 --ttt 7 --steps 10
    python benchmarks/train_step_bench.py ... --kernels   # and the kernel table
    python benchmarks/train_step_bench.py --shape qwen --draft-vocab 151936 ...  # Qwen2.5-Coder

Prints ms per step, training tokens per second (response positions counted by the loss at step
0), and with --kernels the top kernels of one step (torch.profiler, CUDA only).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hotspec.benchmark.random_models import random_state  # noqa: E402
from hotspec.models.build import build_target  # noqa: E402
from hotspec.models.config import ModelConfig  # noqa: E402
from hotspec.training.config import TrainConfig  # noqa: E402
from hotspec.training.features import FeatureBlock  # noqa: E402
from hotspec.training.head_init import aux_layers, build_head, head_config  # noqa: E402
from hotspec.training.trainer import Trainer, Vocab  # noqa: E402
from hotspec.training.vocab import choose_draft_vocab  # noqa: E402

SMOLLM2 = ModelConfig(
    architecture="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
    rms_norm_eps=1e-5, rope_theta=100000.0, rope_scaling=None, max_position_embeddings=8192,
    tie_word_embeddings=True, bos_token_id=1, eos_token_ids=(2,))
QWEN = ModelConfig(  # Qwen2.5-Coder-0.5B-Instruct
    architecture="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
    num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, head_dim=64,
    rms_norm_eps=1e-6, rope_theta=1000000.0, rope_scaling=None, max_position_embeddings=32768,
    tie_word_embeddings=False, bos_token_id=151643, eos_token_ids=(151645,))
SHAPES = {"smollm2": SMOLLM2, "qwen": QWEN}


def synthetic_block(cfg: ModelConfig, n_aux: int, records: int, lengths: tuple[int, int],
                    prompt: int, dtype: torch.dtype, seed: int, n_ids: int) -> FeatureBlock:
    """Random records whose tokens are ids < n_ids (so a draft vocabulary of n_ids covers them,
    as the FR-Spec ranking of real data nearly does) and whose target argmax is the next token
    (greedy self-distillation)."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lengths[0], lengths[1] + 1, (records,), generator=g)
    offsets = torch.cat((torch.zeros(1, dtype=torch.long), lens.cumsum(0)))
    n = int(offsets[-1])
    h = cfg.hidden_size
    tokens = torch.randint(0, n_ids, (n,), generator=g)
    return FeatureBlock(
        tokens=tokens, offsets=offsets,
        n_prompt=torch.full((records,), prompt, dtype=torch.long),
        feature=torch.randn(n, n_aux * h, generator=g).to(dtype),
        final=torch.randn(n, h, generator=g).to(dtype),
        argmax=tokens.roll(-1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2",
                   help="the target's shape (qwen: Qwen2.5-Coder-0.5B, vocabulary 151,936)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--draft-vocab", type=int, default=49152)
    p.add_argument("--ttt", type=int, default=7)
    p.add_argument("--records", type=int, default=256)
    p.add_argument("--min-len", type=int, default=200)
    p.add_argument("--max-len", type=int, default=600)
    p.add_argument("--prompt-len", type=int, default=100)
    p.add_argument("--steps", type=int, default=10, help="timed steps (after 2 warm-up steps)")
    p.add_argument("--layers", type=int, default=None, help="target layers (default: 30)")
    p.add_argument("--kernels", action="store_true", help="CUDA: top kernels of one step")
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    cfg = SHAPES[args.shape]
    if args.layers is not None:
        cfg = replace(cfg, num_hidden_layers=args.layers)
    target = build_target(cfg, random_state(cfg, dev, dtype), dtype, dev)
    config = head_config(cfg, "EAGLE3", args.draft_vocab)
    aux = aux_layers(config, cfg, "EAGLE3")
    data = synthetic_block(cfg, len(aux), args.records, (args.min_len, args.max_len),
                           args.prompt_len, dtype, seed=0, n_ids=min(args.draft_vocab, cfg.vocab_size))
    counts = np.bincount(data.tokens.numpy(), minlength=cfg.vocab_size) + 1  # every id seen
    data = data.to(dev)  # as train-draft does when the features fit
    with tempfile.TemporaryDirectory() as tmp:
        vocab = choose_draft_vocab("EAGLE3", args.draft_vocab, counts, [2], Path(tmp))
        head = build_head(target, config, "EAGLE3", vocab.draft_to_target, dev, seed=0)
        rows = target.lm_head.weight[vocab.draft_to_target.to(dev)]
        tcfg = TrainConfig(out=Path(tmp), batch_size=args.batch_size, epochs=100, lr=1e-4,
                           progress=False)
        trainer = Trainer(head, data, tcfg, args.ttt, Vocab(rows, vocab.t2d.to(dev)),
                          Path(tmp) / "ckpt", {})
        sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
        times, counted = [], []
        for s in range(2 + args.steps):
            batch = trainer.batch(s)
            sync()
            t0 = time.perf_counter()
            out = trainer.train_step(batch)
            sync()
            if s >= 2:
                times.append(time.perf_counter() - t0)
                counted.append(out.counted[0])
        if args.kernels and dev.type == "cuda":
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                trainer.train_step(trainer.batch(0))
                sync()
            rows_ = sorted((e for e in prof.key_averages() if e.device_type.name == "CUDA"),
                           key=lambda e: -e.device_time_total)
            total = sum(e.device_time_total for e in rows_) / 1e3
            print(f"one step: {total:.1f} ms of kernel time")
            for e in rows_[:15]:
                print(f"  {e.device_time_total / 1e3:8.2f} ms  x{e.count:5d}  {e.key[:90]}")
    med = statistics.median(times)
    print(f"{args.shape} {dev.type} {str(dtype).removeprefix('torch.')}: batch {args.batch_size}, "
          f"draft vocab {args.draft_vocab}, TTT {args.ttt}: {med * 1e3:.1f} ms/step, "
          f"{statistics.mean(counted) / med:.0f} loss positions/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
