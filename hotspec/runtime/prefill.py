"""Prefill as CUDA graphs: one graph per token bucket (16, 32, 64, ... up to a largest size),
each over a fixed number of request rows, so a prefill step costs its kernels and not ~300
launches from Python (about 50 us each: an eager prefill of the default model is ~16 ms of host
time for ~1 ms of kernels).

A prefill step of T tokens from b requests replays the bucket P >= T: its tokens are the
requests' chunks back to back, then P - T padding tokens, which row b owns (a padding request on
the null block, writing the trash slot); rows after it have no tokens (q_len 0).
`cu_seqlens_q`, lengths and block tables live in the graph's static buffers (filled from the
host in one copy: runtime/host_io.StagedInputs), and the attention grid covers every row at the
bucket's size, its programs past a request's tokens doing no work.
A step with more tokens or requests than the largest graph runs eagerly; the engine keeps its
steps inside the graphs (`Worker.prefill_limits`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hotspec.core.forward_batch import ForwardBatch, ForwardMode
from hotspec.core.logprobs import token_logprob_rows
from hotspec.core.request import Request
from hotspec.layers.argmax import argmax
from hotspec.layers.logprobs import token_logprobs
from hotspec.runtime.batch_builder import last_token_index, prefill_batch
from hotspec.runtime.graph_runner import BucketGraph
from hotspec.runtime.logits_state import processed
from hotspec.runtime.phase_io import PhaseIO, Sampled, sampling_fields

if TYPE_CHECKING:
    from hotspec.runtime.decode import CausalLM
    from hotspec.runtime.logits_state import LogitsState
    from hotspec.runtime.step_executor import StepExecutor
    from hotspec.runtime.worker import Worker

MIN_BUCKET = 16
PREFILL_ROWS = 32  # requests a graphed prefill step holds at most


def token_buckets(max_tokens: int) -> list[int]:
    """16, 32, 64, ... up to `max_tokens` (which is included); none for 0."""
    if max_tokens <= 0:
        return []
    sizes = []
    n = MIN_BUCKET
    while n < max_tokens:
        sizes.append(n)
        n *= 2
    return sizes + [max_tokens]


@dataclass(kw_only=True)
class PrefillIn(PhaseIO):
    """A prefill step padded to a bucket: T tokens, R request rows (the last for padding)."""

    input_ids: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long
    out_cache_loc: torch.Tensor  # [T] long: each token's KV slot (padding: the trash slot)
    q_lens: torch.Tensor  # [R] long: each request's tokens this step (unused rows: 0)
    kv_lens: torch.Tensor  # [R] long: its kv indices after the step
    cu_seqlens_q: torch.Tensor  # [R + 1] long
    block_tables: torch.Tensor  # [R, max_blocks] int32
    last: torch.Tensor  # [R] long: the index of each request's last token
    hidden_in: torch.Tensor | None = None  # [T, F]: a draft head's prefill reads the target's

    @classmethod
    def example(cls, tokens: int, rows: int, max_blocks: int, trash: int, device: torch.device,
                hidden_in: tuple[int, torch.dtype] | None = None) -> PrefillIn:
        """Static shapes: every token a padding token (rows: `rows` requests and the padding row)."""
        x = prefill_rows([], [], 1, tokens, rows, max_blocks, trash)
        return cls(**{k: v.to(device) for k, v in x.tensors().items()},
                   hidden_in=None if hidden_in is None else
                   torch.zeros(tokens, hidden_in[0], dtype=hidden_in[1], device=device))


def prefill_rows(reqs: list[Request], tokens: list[list[int]], block_size: int, size: int,
                 rows: int, max_blocks: int, trash: int, starts: list[int] | None = None
                 ) -> PrefillIn:
    """The host inputs of a prefill step of `tokens[i]` at positions starts[i], ... (default:
    after each request's `seq_len`), padded to `size` tokens and `rows` + 1 request rows. The
    padding tokens belong to the row after the requests: a request at positions 0.. of the null
    block 0 (zeros, never written), writing the trash slot, so every token belongs to a row (the
    torch reference backend needs that)."""
    n = sum(len(t) for t in tokens)
    ids = np.zeros(size, dtype=np.int64)
    pos = np.zeros(size, dtype=np.int64)
    loc = np.full(size, trash, dtype=np.int64)
    q = np.zeros(rows + 1, dtype=np.int64)
    kv = np.zeros(rows + 1, dtype=np.int64)
    cu = np.full(rows + 2, size, dtype=np.int64)
    table = np.zeros((rows + 1, max_blocks), dtype=np.int32)
    last = np.zeros(rows + 1, dtype=np.int64)
    at = 0
    for i, (r, t) in enumerate(zip(reqs, tokens)):
        k, s = len(t), r.seq_len if starts is None else starts[i]
        ids[at:at + k] = t
        p = np.arange(s, s + k)
        pos[at:at + k] = p
        blocks = r.block_array()
        loc[at:at + k] = blocks[p // block_size].astype(np.int64) * block_size + p % block_size
        q[i], kv[i], cu[i] = k, s + k, at
        table[i, :len(blocks)] = blocks
        at += k
        last[i] = at - 1
    b = len(reqs)
    if size > n:  # the padding row
        q[b] = kv[b] = size - n
        pos[n:] = np.arange(size - n)
        last[b] = size - 1
    cu[b] = n
    f = torch.from_numpy
    return PrefillIn(input_ids=f(ids), positions=f(pos), out_cache_loc=f(loc), q_lens=f(q),
                     kv_lens=f(kv), cu_seqlens_q=f(cu), block_tables=f(table), last=f(last))


@dataclass(kw_only=True)
class PrefillOut(PhaseIO):
    """The target's prefill, what the worker reads of it."""

    logits: torch.Tensor  # [R, V] float32: the LM head at each request's last token
    feature: torch.Tensor | None = None  # [T, F]: what a draft head reads, every token


class PrefillGraphs:
    """One model's prefill (`name`: "prefill" for the target, "prefill_draft" for a draft head)
    captured at the executor's token buckets over its request rows: `step` runs the model over
    the step's ForwardBatch and returns the phase's outputs."""

    def __init__(self, executor: StepExecutor, name: str,
                 step: Callable[[PrefillIn, ForwardBatch], Any], out_type: type[PhaseIO],
                 trash: int, hidden_in: tuple[int, torch.dtype] | None = None) -> None:
        ex = executor
        self.rows, self.max_blocks = ex.prefill_rows, ex.max_blocks_per_seq
        self.block_size, self.trash, self.hidden_in = ex.block_size, trash, hidden_in
        self.max_tokens = ex.prefill_sizes[-1]
        self.max_kv = self.max_blocks * self.block_size  # the static attention bound
        rows, max_blocks, dev = self.rows, self.max_blocks, ex.device

        def fn(x: PrefillIn) -> PhaseIO:
            fb = ForwardBatch(
                mode=ForwardMode.PREFILL, input_ids=x.input_ids, positions=x.positions,
                out_cache_loc=x.out_cache_loc, q_lens=x.q_lens, kv_lens=x.kv_lens,
                block_tables=x.block_tables, width=None, cu_seqlens_q=x.cu_seqlens_q,
                max_q=x.input_ids.shape[0], max_kv=self.max_kv, hidden_in=x.hidden_in)
            out: PhaseIO = step(x, fb)
            return out

        self.graph: BucketGraph[PrefillIn, PhaseIO] = ex.graphs.register_buckets(
            name, fn, lambda n: PrefillIn.example(n, rows, max_blocks, trash, dev, hidden_in),
            out_type, list(ex.prefill_sizes), device_inputs=("hidden_in",))

    def fits(self, reqs: list[Request], tokens: list[list[int]]) -> bool:
        return len(reqs) <= self.rows and sum(len(t) for t in tokens) <= self.max_tokens

    def inputs(self, reqs: list[Request], tokens: list[list[int]],
               starts: list[int] | None = None) -> PrefillIn:
        """The step's inputs (`starts`: as prefill_rows), padded to the bucket that holds it."""
        size = self.graph.bucket(sum(len(t) for t in tokens))
        assert size is not None, "check `fits` first"
        return prefill_rows(reqs, tokens, self.block_size, size, self.rows, self.max_blocks,
                            self.trash, starts)

    def run(self, x: PrefillIn) -> PhaseIO:
        """The phase's outputs: views of the graph's buffers, valid until it runs again."""
        return self.graph.run(x)


def prefill_chunks(reqs: list[Request], chunks: list[int] | None) -> tuple[list[list[int]], list[bool]]:
    """Each request's next `chunks[i]` pending tokens (prompt + tokens already generated, the
    recompute after a preemption), starting at its `seq_len`; all of them when `chunks` is None.
    Also whether that chunk is the last one: only then is a next token sampled."""
    tokens: list[list[int]] = []
    final: list[bool] = []
    for i, r in enumerate(reqs):
        seq = r.prompt_token_ids + r.output_token_ids
        end = len(seq) if chunks is None else r.seq_len + chunks[i]
        assert r.seq_len < end <= len(seq), "a prefill chunk must be non-empty and pending"
        tokens.append(seq[r.seq_len : end])
        final.append(end == len(seq))
    return tokens, final


class Prefilled:
    """A target prefill pass over pending chunks, graphed when the worker has graphs that hold
    it: the next token of each request whose chunk was its last (`next[i]`, else None), and for
    a draft head the target's feature of every token (`feature`) with the layout it came in
    (`graphed`: the padded bucket, else `batch`, the eager ragged batch, and `last`). Lengths
    are not advanced yet (the speculative worker's draft pass reads them first)."""

    def __init__(self, worker: Worker, reqs: list[Request], chunks: list[int] | None,
                 meanwhile: Callable[[], None] | None = None) -> None:
        assert not any(worker.ahead(r) for r in reqs), "collect a request's steps before prefill"
        self.reqs = reqs
        self.tokens, self.final = prefill_chunks(reqs, chunks)
        rows = [i for i, f in enumerate(self.final) if f]
        g = worker.prefill_graphs
        self.graphed: PrefillIn | None = None
        self.batch: ForwardBatch | None = None
        # prompt logprobs need every position's logits: those chunks run the eager pass
        scoring = [i for i, r in enumerate(reqs) if r.params.prompt_logprobs is not None
                   and r.seq_len < len(r.prompt_token_ids) - 1]
        if g is not None and not scoring and g.fits(reqs, self.tokens):
            self.graphed = g.inputs(reqs, self.tokens)
            out = g.run(self.graphed)
            assert isinstance(out, PrefillOut)
            self.feature = out.feature
            # (the rows of finished prompts: a prefix, usually; a slice copies no index over)
            logits = (out.logits[:len(rows)] if rows == list(range(len(rows)))
                      else out.logits[rows]) if rows else None
        else:
            ex = worker.executor
            self.batch = prefill_batch(reqs, self.tokens, ex.block_size, ex.device)
            hidden, aux = worker.target_runner.forward(self.batch)
            self.last = last_token_index(self.batch)
            self.feature = worker.feature(hidden, aux) if worker.feature is not None else None
            logits = worker.target.compute_logits(hidden[self.last[rows]]) if rows else None
            for i in scoring:
                score_prompt(worker.target, reqs[i], self.tokens[i],
                             hidden[sum(len(t) for t in self.tokens[:i]):])
        if meanwhile is not None:  # (the pass is launched; the host is free until it is read)
            meanwhile()
        self.next: list[int | None] = [None] * len(reqs)
        if logits is not None:
            sampled = sample_for([reqs[i] for i in rows], logits, worker.executor.logits_state)
            for i, t in zip(rows, sampled.tolist()):
                self.next[i] = t
            asked = [j for j, i in enumerate(rows) if reqs[i].params.logprobs is not None]
            if asked:
                lp, ids = token_logprobs(logits[asked], sampled[asked])
                for j, lp_row, id_row in zip(asked, lp.tolist(), ids.tolist()):
                    r = reqs[rows[j]]
                    r.step_logprobs = token_logprob_rows([self.next[rows[j]] or 0], [lp_row],
                                                         [id_row], r.params.logprobs or 0)

    def advance(self) -> list[list[int]]:
        """Each request's length grows by its chunk; returns the tokens the prefill emitted."""
        for r, t in zip(self.reqs, self.tokens):
            r.seq_len += len(t)
        return [[t] if t is not None else [] for t in self.next]


def score_prompt(target: CausalLM, req: Request, chunk: list[int], hidden: torch.Tensor) -> None:
    """`req.prompt_logprobs` grows by the prompt tokens this chunk's positions predict: position
    p (hidden row p - seq_len) scores prompt token p + 1. A recompute after a preemption scores
    nothing twice."""
    n = req.params.prompt_logprobs
    assert n is not None
    if req.prompt_logprobs is None:
        req.prompt_logprobs = [None]  # the first prompt token: nothing before it
    first = max(req.seq_len, len(req.prompt_logprobs) - 1)
    end = min(req.seq_len + len(chunk), len(req.prompt_token_ids) - 1)
    if first >= end:
        return
    scored = req.prompt_token_ids[first + 1 : end + 1]
    h = hidden[first - req.seq_len : end - req.seq_len]
    lp, ids = token_logprobs(target.compute_logits(h), torch.tensor(scored, device=h.device))
    req.prompt_logprobs += token_logprob_rows(scored, lp.tolist(), ids.tolist(), n)


def sample_for(reqs: list[Request], logits: torch.Tensor, state: LogitsState | None = None
               ) -> torch.Tensor:
    """Each row's next token: the argmax when every request is greedy, else drawn with its
    sampling parameters (greedy rows keep the argmax), from logits processed as the requests ask
    (`state`: runtime/logits_state.py; the drawn tokens join their counts)."""
    full = state is not None and any(r.params.processes_logits for r in reqs)
    if not full and all(r.params.temperature == 0 for r in reqs):
        return argmax(logits)
    x = Sampled(**sampling_fields(reqs, logits.device, identity=state.identity if full and state else None))
    if not full:
        return x.sampling().sample(logits)
    assert state is not None and x.offsets is not None and x.slot is not None
    state.fill_grammar(reqs)
    nxt = x.sampling().sample(processed(state, x, logits, x.offsets))
    state.count(x.slot, nxt.unsqueeze(1), torch.ones_like(nxt, dtype=torch.bool).unsqueeze(1))
    return nxt
