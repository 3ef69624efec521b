"""The step's block table: each request's KV blocks in order, zero-padded to the longest, as the
blocks grow in place, are replaced (preemption, a finished request) and grow again."""

from __future__ import annotations

import random

import torch

from hotspec.core.request import Request
from hotspec.runtime.batch_builder import block_table_tensor
from hotspec.sampling_params import SamplingParams


def _reference(reqs: list[Request]) -> torch.Tensor:
    width = max(len(r.blocks) for r in reqs)
    return torch.tensor([r.blocks + [0] * (width - len(r.blocks)) for r in reqs], dtype=torch.int32)


def test_block_table_follows_the_blocks_through_growth_and_replacement() -> None:
    rng = random.Random(0)
    reqs = [Request(i, [1, 2], SamplingParams(), 0) for i in range(5)]
    for r in reqs:
        r.blocks = [rng.randrange(1000) for _ in range(rng.randrange(1, 4))]
    for step in range(200):
        r = rng.choice(reqs)
        op = rng.random()
        if op < 0.6:
            r.blocks += [rng.randrange(1000) for _ in range(rng.randrange(1, 3))]  # grows in place
        elif op < 0.8:
            r.blocks = [rng.randrange(1000) for _ in range(rng.randrange(1, 6))]  # replaced
        else:  # preempted, then re-admitted with as many blocks as before (new ids)
            n = len(r.blocks)
            r.blocks = []
            block_table_tensor(reqs[:1], torch.device("cpu"))
            r.blocks += [rng.randrange(1000) for _ in range(n)]
        order = rng.sample(reqs, k=rng.randrange(1, len(reqs) + 1))
        got = block_table_tensor(order, torch.device("cpu"))
        assert got.dtype == torch.int32
        assert torch.equal(got, _reference(order)), step
