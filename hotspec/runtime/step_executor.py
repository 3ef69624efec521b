"""One step executor for every decode program: it builds a step's host inputs once, runs the
program's registered graph (or its eager fallback), queues the step's output on its way to the
host, and later collects it.

A *program* is one kind of step over the running requests: vanilla decoding, an EAGLE step of
one shape, or plain decoding inside the speculative engine. Every program's graph reads the same
host rows (`StepRows`: committed lengths, block tables, the root token, the overlap schedule's
`src`, sampling parameters) and emits the same row layout, `[B, 2 + W]` = (accepted count a,
the accepted path root first, the bonus token), so launching, collecting and advancing a
request's length are written once, here. With the overlap schedule (core/launches.py) step N+1
is launched before step N is read: it takes each request's length, root and RNG offset from the
`carry` row that step N left (runtime/carry.py), where `src` >= 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from hotspec.core.launches import HostCopy, Launches
from hotspec.core.logprobs import token_logprob_rows
from hotspec.core.request import Request, Status
from hotspec.runtime.batch_builder import block_table_tensor
from hotspec.runtime.graph_runner import GraphRunner, PhaseGraph
from hotspec.runtime.logits_state import LogitsState
from hotspec.runtime.phase_io import PhaseIO, Tensors, sampling_fields

_CPU = torch.device("cpu")  # the graph runner moves host inputs to the device itself
CARRY = ("seq", "root", "offsets")  # what a step leaves per row for the next (runtime/carry.py)


@dataclass
class StepRows:
    """A step's host inputs, one row per request, whichever program runs."""

    seq: torch.Tensor  # [B] long: committed tokens (the host's view; `src` rows take the carry's)
    tables: torch.Tensor  # [B, max_blocks] int32
    root: torch.Tensor  # [B] long: the last token, not yet in the KV cache (0 for `src` rows)
    src: torch.Tensor | None  # [B] long, overlap schedule: the row in the unread launch, or -1
    sampling: dict[str, torch.Tensor] = field(default_factory=dict)  # Sampled's fields; {}: greedy

    @property
    def greedy(self) -> bool:
        return not self.sampling

    @property
    def full(self) -> bool:
        """The [full] graphs' step: logprobs or logits processing (Sampled's `slot` field)."""
        return "slot" in self.sampling

    def fields(self) -> dict[str, Any]:
        """The keyword arguments of a program input that reads every row field."""
        return {"seq": self.seq, "tables": self.tables, "root": self.root, "src": self.src,
                **self.sampling}


class Bounded(Protocol):
    max_kv: int  # the attention bound a program's passes use (tightened per step when eager)


class StepProgram(Bounded, Protocol):
    """One kind of step: its graphs (greedy and sampled), and its typed input from the rows."""

    def graph(self, greedy: bool, full: bool = False) -> PhaseGraph[Any, Any]: ...

    def inputs(self, rows: StepRows) -> PhaseIO: ...


@dataclass
class Collected:
    """A step read back: its requests, each one's new tokens and accepted count, and what the
    program attached at launch (`tag`)."""

    reqs: list[Request]
    tokens: list[list[int]]
    accepted: list[int]  # a per row: tokens the step committed (1 for plain decoding)
    tag: Any


class StepExecutor:
    """Launches and collects the steps of every program over one graph runner. `reserve`: KV
    slots a step may write beyond a request's length; `max_advance`: positions a step may
    advance it by (both over every program the worker runs; they bound eager attention and the
    engine's block reservations)."""

    def __init__(self, graphs: GraphRunner, block_size: int, max_blocks_per_seq: int,
                 overlap: bool, max_rows: int, prefill_sizes: tuple[int, ...] = (),
                 prefill_rows: int = 0, logits_state: LogitsState | None = None) -> None:
        """`prefill_sizes`: the token buckets prefill is captured at (runtime/prefill.py), over
        `prefill_rows` requests at most; none: prefill runs eagerly. `logits_state`: the rows
        of logits processing (runtime/logits_state.py) the [full] graphs read."""
        self.logits_state = logits_state
        self.graphs, self.block_size = graphs, block_size
        self.prefill_sizes = prefill_sizes if graphs.mode != "eager" else ()
        self.prefill_rows = prefill_rows
        self.max_blocks_per_seq = max_blocks_per_seq
        self.overlap = overlap
        self.device = graphs.device
        self.launches = Launches()
        self.reserve, self.max_advance = 1, 1
        # overlap: what the next launch reads of this one's rows, sized for the largest batch
        # a step runs (padded graph or eager)
        rows = max(max_rows, graphs.max_bs)
        self.carry: Tensors | None = {k: torch.zeros(rows, dtype=torch.long, device=self.device)
                                      for k in CARRY} if overlap else None

    def rows(self, reqs: list[Request], sampled: bool, full: bool | None = None) -> StepRows:
        """The host inputs of a step of `reqs` (a request with unread steps takes its length,
        root and RNG offset from the carry: it must be in the newest launch); `full`:
        needs_full_graph(reqs) where the caller has it."""
        ahead = [self.launches.ahead(r) for r in reqs]
        if any(ahead) and not self.overlap:
            raise RuntimeError("a step was launched before the last one was read; that needs the "
                               "overlap schedule")
        return StepRows(
            seq=torch.tensor([r.seq_len for r in reqs], dtype=torch.long),
            tables=block_table_tensor(reqs, _CPU),
            root=torch.tensor([0 if a else r.last_token for r, a in zip(reqs, ahead)],
                              dtype=torch.long),
            src=torch.tensor(self.launches.src_rows(reqs, ahead), dtype=torch.long)
            if self.overlap else None,
            sampling=sampling_fields(reqs, _CPU, ahead, self.logits_state.identity
                                     if self.logits_state is not None and
                                     (needs_full_graph(reqs) if full is None else full)
                                     else None) if sampled else {})

    def bound(self, program: Bounded, reqs: list[Request]) -> None:
        """Eager passes attend over the longest request's kv indices, not the whole table."""
        if self.graphs.mode == "eager":
            program.max_kv = max(r.seq_len + self.launches.ahead(r) * self.max_advance
                                 for r in reqs) + self.reserve

    def launch(self, program: StepProgram, reqs: list[Request], tag: Any = None,
               rows: StepRows | None = None) -> PhaseIO:
        """Enqueue `program`'s step for `reqs` (no host sync) and return its outputs, which stay
        on the device; `tag` comes back with the step's tokens (`collect`)."""
        full = needs_full_graph(reqs)
        if rows is None:
            rows = self.rows(reqs, needs_sampled_graph(reqs, full), full)
        if full and not rows.full:
            raise RuntimeError("logprobs and logits processing need the executor's logits_state")
        self.bound(program, reqs)
        if rows.full and self.logits_state is not None:
            self.logits_state.fill_grammar(reqs)  # (structured output: the next token's mask)
        graph = program.graph(rows.greedy, rows.full)
        # (borrowed from the graph: published to a pinned slot, or copied out by HostCopy before
        # the next launch)
        out = graph.run(program.inputs(rows), borrow=("emitted",))
        self.push(reqs, graph.read_back("emitted") or HostCopy(out.emitted), tag,
                  getattr(out, "logprobs", None), getattr(out, "top_ids", None))
        return out

    def push(self, reqs: list[Request], emitted: Any, tag: Any,
             logprobs: torch.Tensor | None = None, top_ids: torch.Tensor | None = None) -> None:
        """Queue a launched step's emitted rows (and the [full] graphs' logprobs, when a request
        asks) for `collect`."""
        asked = logprobs is not None and top_ids is not None and any(
            r.params.logprobs is not None for r in reqs)
        lp = (HostCopy(logprobs), HostCopy(top_ids)) if asked else None  # type: ignore[arg-type]
        self.launches.push(reqs, (emitted, tag, lp))

    def collect(self) -> Collected:
        """The oldest launched step: the one host sync of a step. Each request that is still
        running advances by its accepted count; requests that finished since (a stop in the step
        before, an abort) keep their length and their tokens are dropped by the engine."""
        reqs, (emitted, tag, logprobs) = self.launches.pop()
        rows = emitted.tolist()
        for r, row in zip(reqs, rows):
            if r.status is not Status.FINISHED:
                r.seq_len += row[0]
        tokens = [emitted_tokens(row) for row in rows]
        if logprobs is not None:
            attach_logprobs(reqs, tokens, logprobs[0].tolist(), logprobs[1].tolist())
        return Collected(reqs, tokens, [row[0] for row in rows], tag)


def needs_full_graph(reqs: list[Request]) -> bool:
    """Whether a step of `reqs` runs a program's [full] graph: a request asks for logprobs or
    logits processing (penalties, logit_bias, min_tokens, a grammar)."""
    return any(r.params.logprobs is not None or r.params.processes_logits for r in reqs)


def constrained(reqs: list[Request]) -> bool:
    """Whether a request of `reqs` follows a grammar: its steps are read before the next launch
    (its matcher reads every token before the next mask) and a speculative step masks its tree
    on the host between draft and verify."""
    return any(r.grammar is not None for r in reqs)


def needs_sampled_graph(reqs: list[Request], full: bool | None = None) -> bool:
    """Whether a step of `reqs` runs a program's sampled graph: a request samples, or needs the
    [full] graph (which samples too; greedy rows there keep the argmax); `full`:
    needs_full_graph(reqs) where the caller has it."""
    return (needs_full_graph(reqs) if full is None else full) or \
        any(r.params.temperature > 0 for r in reqs)


def attach_logprobs(reqs: list[Request], tokens: list[list[int]], logprobs: list[Any],
                    top_ids: list[Any]) -> None:
    """Each request that asks gets its new tokens' logprobs (`Request.step_logprobs`) from a
    step's read-back rows [B, W, 1 + K] and [B, W, K]."""
    for r, toks, lp, ids in zip(reqs, tokens, logprobs, top_ids):
        if r.params.logprobs is not None:
            r.step_logprobs = token_logprob_rows(toks, lp, ids, r.params.logprobs)


def emitted_tokens(row: list[int]) -> list[int]:
    """A request's new tokens in an emitted row (a, path root first, bonus): the accepted drafts
    after the root, then the bonus."""
    a = row[0]
    return row[2 : 1 + a] + [row[-1]]
