"""Logits processing (penalties, logit_bias, min_tokens; SamplingParams) inside the step graphs.

What a request's processing reads lives on the device in rows of static buffers, one row per
request that asks (its `Request.logits_slot`), like the KV cache: the generated tokens' counts,
which the graphs themselves bump for each emitted token (so the overlap schedule's next step,
launched before this one is read, sees them), the prompt's tokens (repetition penalty), the dense
logit_bias, the stop tokens min_tokens masks, and the grammar's token bitmask (structured output:
runtime/grammar.py), one row per tree node, which the host writes before each step. The last row
is the identity (zeros; a full bitmask): rows of requests without processing and padding rows
read it, and it is never written.

`process` applies SamplingParams' order to logits [R, V]: bias, min_tokens mask, repetition,
presence and frequency, then the grammar's mask (-inf where it rejects). Within a speculative
step a tree node's counts are its request's plus the drafted tokens on its path (`path_counts`)
and its grammar mask the one after its path, so each node is processed exactly as plain
decoding would process that position.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from hotspec.core.request import Request
from hotspec.runtime.grammar import bitmask_width
from hotspec.runtime.phase_io import Sampled


class LogitsState:
    def __init__(self, rows: int, vocab: int, device: torch.device, nodes: int = 1) -> None:
        """`nodes`: the most tree nodes a step verifies per request (1: plain decoding)."""
        self.rows, self.vocab, self.nodes = rows, vocab, nodes
        self.counts = torch.zeros(rows + 1, vocab, dtype=torch.float32, device=device)
        self.prompt = torch.zeros(rows + 1, vocab, dtype=torch.bool, device=device)
        self.bias = torch.zeros(rows + 1, vocab, dtype=torch.float32, device=device)
        self.stops = torch.zeros(rows + 1, vocab, dtype=torch.bool, device=device)
        self.grammar = torch.full((rows + 1, nodes, bitmask_width(vocab)), -1, dtype=torch.int32,
                                  device=device)
        self._shifts = torch.arange(32, dtype=torch.int32, device=device)
        self._free = list(range(rows - 1, -1, -1))

    @property
    def identity(self) -> int:
        """The row of requests without processing (and of padding rows)."""
        return self.rows

    def has_room(self) -> bool:
        return bool(self._free)

    def acquire(self, req: Request, eos_ids: Iterable[int]) -> None:
        """A row for `req`, filled from its prompt, the tokens it generated already (a
        preempted request's recompute) and its parameters."""
        if req.logits_slot >= 0:
            return
        slot = self._free.pop()
        req.logits_slot = slot
        p, dev = req.params, self.counts.device
        self.counts[slot].zero_()
        if req.output_token_ids:
            ids = torch.tensor(req.output_token_ids, device=dev)
            self.counts[slot].index_add_(0, ids, torch.ones(len(ids), device=dev))
        self.prompt[slot].zero_()
        self.prompt[slot, torch.tensor(req.prompt_token_ids, device=dev)] = True
        self.bias[slot].zero_()
        if p.logit_bias:
            self.bias[slot, torch.tensor(list(p.logit_bias), device=dev)] = torch.tensor(
                list(p.logit_bias.values()), dtype=torch.float32, device=dev)
        self.stops[slot].zero_()
        stops = set(p.stop_token_ids or ()) | (set() if p.ignore_eos else set(eos_ids))
        if p.min_tokens and stops:
            self.stops[slot, torch.tensor(sorted(stops), device=dev)] = True
        self.grammar[slot].fill_(-1)

    def release(self, req: Request) -> None:
        if req.logits_slot >= 0:
            self._free.append(req.logits_slot)
            req.logits_slot = -1

    def slot_of(self, req: Request) -> int:
        return req.logits_slot if req.logits_slot >= 0 else self.identity

    def fill_grammar(self, reqs: list[Request]) -> None:
        """Node 0's bitmask of each constrained request: what its grammar allows next (its
        matcher must have read every token it emitted: the host reads each such step)."""
        rows = [r for r in reqs if r.grammar is not None]
        if rows:
            host = self._host(len(rows))
            for i, r in enumerate(rows):
                r.grammar.fill(host, i)
            self._write(rows, host)

    def fill_grammar_after(self, reqs: list[Request], tokens: list[list[int]]) -> None:
        """Node 0's bitmask of each constrained request after its `tokens` (a step's, which the
        engine has not emitted yet): what the draft may propose next."""
        rows = [(r, t) for r, t in zip(reqs, tokens) if r.grammar is not None]
        if rows:
            host = self._host(len(rows))
            for i, (r, t) in enumerate(rows):
                r.grammar.fill_after(t, host, i)
            self._write([r for r, _ in rows], host)

    def fill_grammar_tree(self, reqs: list[Request], tokens: torch.Tensor, parents: torch.Tensor
                          ) -> None:
        """Every tree node's bitmask of each constrained request (tokens, parents: [B, N] on the
        host, node 0 the root): the mask after the node's path."""
        n = tokens.shape[1]
        rows = [(i, r) for i, r in enumerate(reqs) if r.grammar is not None]
        if rows:
            host = torch.zeros(len(rows), n, self.grammar.shape[2], dtype=torch.int32)
            for k, (i, r) in enumerate(rows):
                r.grammar.fill_tree(tokens[i], parents[i], host[k])
            self._write([r for _, r in rows], host)

    def _host(self, k: int) -> torch.Tensor:
        return torch.empty(k, self.grammar.shape[2], dtype=torch.int32)

    def _write(self, reqs: list[Request], host: torch.Tensor) -> None:
        """The host masks [k, W] (node 0) or [k, n, W] of `reqs` into their rows: one copy."""
        slots = torch.tensor([r.logits_slot for r in reqs], device=self.grammar.device)
        dev = host.to(self.grammar.device)
        if dev.dim() == 2:
            self.grammar[slots, 0] = dev
        else:
            self.grammar[slots, : dev.shape[1]] = dev

    # -- device code (graph-capturable) ---------------------------------------------------------
    def process(self, logits: torch.Tensor, slot: torch.Tensor, generated: torch.Tensor,
                min_tokens: torch.Tensor, presence: torch.Tensor, frequency: torch.Tensor,
                repetition: torch.Tensor, extra: torch.Tensor | None = None,
                node: torch.Tensor | None = None) -> torch.Tensor:
        """logits [R, V] float32 of rows reading state row `slot` [R], each `generated` [R]
        tokens into its answer; `extra` [R, V]: counts on top of the row's (a node's path);
        `node` [R]: each row's tree node, whose grammar mask it takes (None: node 0)."""
        out = self._apply(logits, self.counts[slot] + extra if extra is not None else self.counts[slot],
                          self.prompt[slot], self.bias[slot], self.stops[slot], generated,
                          min_tokens, presence, frequency, repetition)
        words = self.grammar[slot, node if node is not None else 0]  # [R, V/32]
        bits = (words.unsqueeze(-1) >> self._shifts) & 1
        # a row that allows nothing is a tree node off the grammar (RequestGrammar.fill_tree):
        # never accepted, so left unmasked rather than all -inf
        live = (words != 0).any(dim=-1, keepdim=True)
        return out.masked_fill((bits.view(words.shape[0], -1)[:, : self.vocab] == 0) & live,
                               float("-inf"))

    def process_columns(self, logits: torch.Tensor, slot: torch.Tensor, columns: torch.Tensor,
                        generated: torch.Tensor, min_tokens: torch.Tensor, presence: torch.Tensor,
                        frequency: torch.Tensor, repetition: torch.Tensor) -> torch.Tensor:
        """`process` over a draft head's vocabulary: logits [R, C] whose column j is target token
        `columns[j]` (an FR-Spec head's hot ids)."""
        at = (slot.unsqueeze(1), columns.unsqueeze(0))
        return self._apply(logits, self.counts[at], self.prompt[at], self.bias[at], self.stops[at],
                           generated, min_tokens, presence, frequency, repetition)

    def mask_columns(self, logits: torch.Tensor, slot: torch.Tensor, columns: torch.Tensor
                     ) -> torch.Tensor:
        """A draft head's logits [R, C] (column j: target token `columns[j]`) masked by node 0's
        grammar bitmask of each row's request: the draft's next-token candidates."""
        words = self.grammar[slot, 0]  # [R, V/32]
        bits = (words[:, columns // 32] >> (columns % 32).to(torch.int32)) & 1
        return logits.masked_fill(bits == 0, float("-inf"))

    @staticmethod
    def _apply(logits: torch.Tensor, counts: torch.Tensor, prompt: torch.Tensor, bias: torch.Tensor,
               stops: torch.Tensor, generated: torch.Tensor, min_tokens: torch.Tensor,
               presence: torch.Tensor, frequency: torch.Tensor, repetition: torch.Tensor) -> torch.Tensor:
        out = logits.float() + bias
        early = (generated < min_tokens).unsqueeze(1) & stops
        out = out.masked_fill(early, float("-inf"))
        seen = prompt | (counts > 0)
        r = repetition.unsqueeze(1)
        out = torch.where(seen, torch.where(out > 0, out / r, out * r), out)
        return out - presence.unsqueeze(1) * (counts > 0) - frequency.unsqueeze(1) * counts

    def count(self, slot: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor) -> None:
        """The emitted tokens [R, W] (where `valid`) join their rows' counts; the identity row
        stays zero."""
        keep = valid & (slot != self.identity).unsqueeze(1)
        index = (slot.unsqueeze(1) * self.vocab + tokens).reshape(-1)
        self.counts.view(-1).scatter_add_(0, index, keep.reshape(-1).float())


def processed(state: LogitsState, x: Sampled, logits: torch.Tensor, generated: torch.Tensor,
              extra: torch.Tensor | None = None, per_row: int = 1) -> torch.Tensor:
    """`state.process` with `x`'s processing fields, each row's repeated `per_row` times (a
    tree's nodes, row j of a request its node j)."""
    f = (x.slot, x.min_tokens, x.presence, x.frequency, x.repetition)
    if any(t is None for t in f):
        raise ValueError("no logits-processing inputs: not a [full] graph's")
    slot, min_tokens, presence, frequency, repetition = (
        t.repeat_interleave(per_row) if per_row > 1 else t for t in f if t is not None)
    node = None
    if per_row > 1:
        node = torch.arange(per_row, device=logits.device).repeat(logits.shape[0] // per_row)
    return state.process(logits, slot, generated, min_tokens, presence, frequency, repetition, extra,
                         node)


def path_counts(tokens: torch.Tensor, mask: torch.Tensor, depth: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, N, V]: per tree node, the drafted tokens on its path (itself included, the root not):
    what it has generated beyond its request's counts. mask [B, N, N]: node j's ancestors."""
    b, n = tokens.shape
    on_path = (mask & (depth > 0).unsqueeze(1)).float()  # [B, j, k]
    out = torch.zeros(b, n, vocab, dtype=torch.float32, device=tokens.device)
    return out.scatter_add_(2, tokens.unsqueeze(1).expand(b, n, n), on_path)
