"""The draft's catch-up after plain decode steps (the adaptive policy's "off"): a draft pass over
the tokens those steps committed, as at prefill, so the next speculative step finds each
request's draft KV and draft state current.

The row at position p reads the token after p with the target feature at p (kept by the plain
decode step, runtime/decode.py), writing the draft's KV there; each request's last row gives its
new draft state. With CUDA graphs the pass replays the draft's prefill graphs (runtime/prefill.py:
token buckets, a group of requests a replay), so a catch-up costs a few replays and never
compiles a kernel mid-serving; an eager pass, whose kernels specialise on the batch's lengths,
runs only where there are no prefill graphs (or a request's pending tokens overflow the largest
bucket). Its host time is the policy's catch-up cost for the batch size it served.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from hotspec.core.forward_batch import ForwardBatch, ForwardMode
from hotspec.core.request import DraftRow, Request
from hotspec.runtime.batch_builder import last_token_index, prefill_batch
from hotspec.runtime.prefill import PrefillGraphs, PrefillIn
from hotspec.runtime.step_executor import StepExecutor
from hotspec.speculative.io import DraftState
from hotspec.speculative.phases import EaglePhases

MAX_PENDING = 64  # plain decode steps after which the draft catches up even while off
WARM_LENGTHS = (1, 2, 4, 8, 16, 32, MAX_PENDING)  # pending lengths compiled at start-up

Observe = Callable[[int, float], None]  # (batch size, ms): the policy's catch-up cost


class CatchUp:
    """`graphs`: the draft's prefill graphs (None: every catch-up runs eagerly)."""

    def __init__(self, phases: EaglePhases, executor: StepExecutor, observe: Observe | None,
                 graphs: PrefillGraphs | None = None) -> None:
        self.phases, self.executor, self.observe, self.graphs = phases, executor, observe, graphs
        self.eager_passes = 0  # catch-up passes run eagerly (no graph held them)

    def run(self, reqs: list[Request], bs: int) -> None:
        """The draft over each request's pending plain-decode tokens; `bs`: the batch served."""
        t0 = time.perf_counter()
        for r in reqs:
            it = r.spec.pending
            assert [pos for pos, _, _ in it] == list(range(it[0][0], it[0][0] + len(it))), \
                "plain decode steps are caught up on in order"
        for group, graphed in self._groups(reqs):
            (self._graphed if graphed else self._eager)(group)
            for r in group:
                r.spec.pending = []
        if self.observe is not None:
            self.observe(bs, (time.perf_counter() - t0) * 1e3)

    def _groups(self, reqs: list[Request]) -> list[tuple[list[Request], bool]]:
        """`reqs` cut into groups one prefill graph holds each (in order); without graphs, one
        eager group. A request with more pending tokens than the largest bucket goes alone,
        eagerly."""
        g = self.graphs
        if g is None:
            return [(reqs, False)]
        out: list[tuple[list[Request], bool]] = []
        group: list[Request] = []
        tokens = 0
        for r in reqs:
            n = len(r.spec.pending)
            if n > g.max_tokens:
                out.append(([r], False))
                continue
            if group and (len(group) == g.rows or tokens + n > g.max_tokens):
                out.append((group, True))
                group, tokens = [], 0
            group.append(r)
            tokens += n
        if group:
            out.append((group, True))
        return out

    def _graphed(self, reqs: list[Request]) -> None:
        g, p = self.graphs, self.phases
        assert g is not None
        items = [r.spec.pending for r in reqs]
        x = g.inputs(reqs, [[t for _, _, t in it] for it in items], [it[0][0] for it in items])
        feats = torch.stack([f for it in items for _, f, _ in it])
        hidden = torch.zeros(x.input_ids.shape[0], feats.shape[1], dtype=p.shapes.dtype,
                             device=feats.device)
        hidden[:feats.shape[0]] = feats
        x.hidden_in = hidden
        out = g.run(x)
        assert isinstance(out, DraftState)
        n = len(reqs)  # (the graph's buffers: the next replay overwrites them)
        logp, ids, feat = out.topk_logp[:n].clone(), out.topk_ids[:n].clone(), out.feature[:n].clone()
        for i, r in enumerate(reqs):
            r.spec.draft = DraftRow(logp, ids, feat, i)

    def _eager(self, reqs: list[Request]) -> None:
        p, ex = self.phases, self.executor
        self.eager_passes += 1
        items = [r.spec.pending for r in reqs]
        fb = prefill_batch(reqs, [[t for _, _, t in it] for it in items], ex.block_size,
                           ex.device, starts=[it[0][0] for it in items])
        fb.hidden_in = torch.cat([torch.stack([f for _, f, _ in it]) for it in items])
        h_logits, h_feat = p.draft_runner.forward(fb)
        last = last_token_index(fb)
        logp, ids, _ = p.draft_topk(h_logits[last], p.state_k)
        feat = h_feat[last]
        for i, r in enumerate(reqs):
            r.spec.draft = DraftRow(logp, ids, feat, i)

    def warm(self, lengths: tuple[int, ...] = WARM_LENGTHS) -> int:
        """Seeds the policy's catch-up cost at every captured batch size; returns the passes run.
        With the prefill graphs: a timed catch-up of one token a request (the replays of the
        smallest bucket that holds them, all padding: the trash slot). Without: the eager pass
        once for every pending length (powers of two: the kernels' block shapes) at a short and
        a long context, writing only the trash slot, so that its kernels compile at start-up
        rather than on the first switch back from plain decode; then a one-token pass, timed."""
        if self.graphs is not None:
            return self._seed_graphed()
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

    def _seed_graphed(self) -> int:
        g, ex = self.graphs, self.executor
        assert g is not None and g.hidden_in is not None
        runs = 0
        for bs in ex.graphs.batch_sizes:
            size = g.graph.bucket(min(bs, g.rows))
            assert size is not None
            x = PrefillIn.example(size, g.rows, g.max_blocks, g.trash, ex.device, g.hidden_in)
            g.run(x)  # (the first replay after capture: not timed)
            if ex.device.type == "cuda":
                torch.cuda.synchronize(ex.device)
            t0 = time.perf_counter()
            for _ in range(-(-bs // g.rows)):
                g.run(x)
                runs += 1
            if ex.device.type == "cuda":
                torch.cuda.synchronize(ex.device)
            if self.observe is not None:
                self.observe(bs, (time.perf_counter() - t0) * 1e3)
        return runs
