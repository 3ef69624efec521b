"""The draft's catch-up after plain decode steps (the adaptive policy's "off"): an eager draft
pass over the tokens those steps committed, as at prefill, so the next speculative step finds
each request's draft KV and draft state current.

The row at position p reads the token after p with the target feature at p (kept by the plain
decode step, runtime/decode.py), writing the draft's KV there; each request's last row gives its
new draft state. Its host time is the policy's catch-up cost for the batch size it served.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from hotspec.core.forward_batch import ForwardBatch, ForwardMode
from hotspec.core.request import DraftRow, Request
from hotspec.runtime.batch_builder import last_token_index, prefill_batch
from hotspec.runtime.step_executor import StepExecutor
from hotspec.speculative.phases import EaglePhases

MAX_PENDING = 64  # plain decode steps after which the draft catches up even while off
WARM_LENGTHS = (1, 2, 4, 8, 16, 32, MAX_PENDING)  # pending lengths compiled at start-up

Observe = Callable[[int, float], None]  # (batch size, ms): the policy's catch-up cost


class CatchUp:
    def __init__(self, phases: EaglePhases, executor: StepExecutor, observe: Observe | None) -> None:
        self.phases, self.executor, self.observe = phases, executor, observe

    def run(self, reqs: list[Request], bs: int) -> None:
        """The draft over each request's pending plain-decode tokens; `bs`: the batch served."""
        t0 = time.perf_counter()
        p, ex = self.phases, self.executor
        items = [r.spec.pending for r in reqs]
        for it in items:
            assert [pos for pos, _, _ in it] == list(range(it[0][0], it[0][0] + len(it))), \
                "plain decode steps are caught up on in order"
        fb = prefill_batch(reqs, [[t for _, _, t in it] for it in items], ex.block_size,
                           ex.device, starts=[it[0][0] for it in items])
        fb.hidden_in = torch.cat([torch.stack([f for _, f, _ in it]) for it in items])
        h_logits, h_feat = p.draft_runner.forward(fb)
        last = last_token_index(fb)
        logp, ids, _ = p.draft_topk(h_logits[last], p.state_k)
        for i, r in enumerate(reqs):
            r.spec.draft = DraftRow(logp[i], ids[i], h_feat[last[i]])
            r.spec.pending = []
        if self.observe is not None:
            self.observe(bs, (time.perf_counter() - t0) * 1e3)

    def warm(self, lengths: tuple[int, ...] = WARM_LENGTHS) -> int:
        """The catch-up's eager draft pass once for every captured batch size and pending length
        (powers of two: the kernels' block shapes), at a short and a long context, writing only
        the trash slot: its kernels compile at start-up rather than on the first switch back from
        plain decode, mid-serving. Then a one-token pass at each batch size, timed, seeds the
        policy's catch-up cost. Returns the passes run."""
        p, ex = self.phases, self.executor
        dev = ex.device
        trash = p.draft_runner.kv.trash_slot
        blocks = p.shapes.max_blocks_per_seq
        runs = 0
        for bs in ex.graphs.batch_sizes:
            for i, n in enumerate((*lengths, 1)):  # (the last: the timed one)
                for kv in sorted({n, min(2048, blocks * ex.block_size)}):
                    timed = i == len(lengths) and kv == n
                    if dev.type == "cuda":
                        torch.cuda.synchronize(dev)
                    t0 = time.perf_counter()
                    q = torch.full((bs,), n, dtype=torch.long, device=dev)
                    fb = ForwardBatch(
                        mode=ForwardMode.PREFILL,
                        input_ids=torch.zeros(bs * n, dtype=torch.long, device=dev),
                        positions=torch.arange(kv - n, kv, device=dev).repeat(bs),
                        out_cache_loc=torch.full((bs * n,), trash, dtype=torch.long, device=dev),
                        q_lens=q, kv_lens=torch.full((bs,), kv, dtype=torch.long, device=dev),
                        block_tables=torch.zeros((bs, blocks), dtype=torch.int32, device=dev),
                        width=None, cu_seqlens_q=torch.arange(bs + 1, device=dev) * n, max_q=n,
                        max_kv=kv, hidden_in=torch.zeros(bs * n, p.draft.target_feature_size,
                                                         dtype=p.shapes.dtype, device=dev))
                    h_logits, _ = p.draft_runner.forward(fb)
                    p.draft_topk(h_logits[last_token_index(fb)], p.state_k)
                    if dev.type == "cuda":
                        torch.cuda.synchronize(dev)
                    runs += 1
                    if timed and self.observe is not None:
                        self.observe(bs, (time.perf_counter() - t0) * 1e3)
        return runs
