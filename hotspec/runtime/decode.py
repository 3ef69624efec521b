"""Plain decoding as a step program: one target pass over each request's root token, the next
token by argmax or by its sampling parameters. Vanilla decoding runs it alone; the speculative
engine runs it as the adaptive policy's "off" and keeps the target's feature at the root, which
its draft reads when it catches up on these tokens. Its graphs are `decode`, `decode[sample]` and
`decode[full]` (sampled, with logits processing and the next token's logprobs: only steps where a
request asks for either run it, so the others pay nothing for the features).

A plain step advances a request by exactly one position; with the overlap schedule it still
takes length, root and RNG offset from the carry (runtime/carry.py) like every program, so that
it can follow a speculative step whose advance the host has not read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from hotspec.core.forward_batch import ForwardBatch, ForwardMode
from hotspec.layers.argmax import argmax
from hotspec.layers.logprobs import token_logprobs
from hotspec.runtime.carry import from_carry, to_carry
from hotspec.runtime.decode_inputs import decode_inputs
from hotspec.runtime.graph_runner import GraphRunner, PhaseGraph
from hotspec.runtime.logits_state import LogitsState, processed
from hotspec.runtime.model_runner import ModelRunner
from hotspec.runtime.phase_io import PhaseIO, Sampled, Tensors, example_sampling
from hotspec.runtime.step_executor import StepRows

Feature = Callable[[torch.Tensor, Any], torch.Tensor]  # (hidden, aux) -> what the draft reads


class CausalLM(Protocol):
    """What a decode step needs of the target beyond its runner: the LM head."""

    def compute_logits(self, hidden: torch.Tensor, float32: bool = True) -> torch.Tensor: ...


@dataclass(kw_only=True)
class DecodeIn(Sampled):
    seq: torch.Tensor  # [B] long: each request's position (the tokens in the KV cache)
    tables: torch.Tensor  # [B, max_blocks] int32
    root: torch.Tensor  # [B] long: its last token (0 where `src` names a carry row)
    src: torch.Tensor | None = None  # [B] long, overlap schedule: the carry row, or -1

    @classmethod
    def example(cls, bs: int, max_blocks: int, device: torch.device, sampled: bool,
                carried: bool, identity: int | None = None) -> DecodeIn:
        """Static shapes; padding rows read token 0 at position 1 of the null block 0 (and, with
        `identity`, the logits state's identity row)."""
        def long(fill: int) -> torch.Tensor:
            return torch.full((bs,), fill, dtype=torch.long, device=device)

        return cls(seq=long(1), tables=torch.zeros(bs, max_blocks, dtype=torch.int32, device=device),
                   root=long(0), src=long(-1) if carried else None,
                   **(example_sampling(bs, device, identity) if sampled else {}))


@dataclass(kw_only=True)
class DecodeOut(PhaseIO):
    emitted: torch.Tensor  # [B, 3] long: the executor's row layout with W = 1: 1, root, next token
    feature: torch.Tensor | None = None  # [B, F]: the target feature at the root (speculative)
    # decode[sample]: the next token's logprob and the top alternatives (layers/logprobs.py)
    logprobs: torch.Tensor | None = None  # [B, 1, 1 + MAX_LOGPROBS] float32
    top_ids: torch.Tensor | None = None  # [B, 1, MAX_LOGPROBS] long


class PlainDecode:
    """The plain decode program over `runner`'s model. `feature`: also return what the draft
    head reads of the target (the speculative engine's catch-up), else nothing beside the
    tokens. `carry`: the overlap schedule's row buffers (runtime/step_executor.CARRY), or None."""

    def __init__(self, graphs: GraphRunner, runner: ModelRunner, target: CausalLM,
                 max_blocks_per_seq: int, carry: Tensors | None,
                 feature: Feature | None = None, logits_state: LogitsState | None = None) -> None:
        self.runner, self.target, self.carry, self.feature = runner, target, carry, feature
        self.block_size = runner.kv.block_size
        self.max_kv = max_blocks_per_seq * self.block_size

        state = self.logits_state = logits_state
        identity = state.identity if state is not None else 0

        def example(sampled: bool, full: bool = False) -> Callable[[int], DecodeIn]:
            return lambda bs: DecodeIn.example(bs, max_blocks_per_seq, graphs.device, sampled,
                                               carry is not None, identity if full else None)

        self.graphs = (graphs.register("decode", self.decode, example(False), DecodeOut,
                                       publish=("emitted",)),
                       graphs.register("decode[sample]", self.decode, example(True), DecodeOut,
                                       publish=("emitted",)),
                       graphs.register("decode[full]", lambda x: self.decode(x, full=True),
                                       example(True, full=True), DecodeOut, publish=("emitted",)))

    def graph(self, greedy: bool, full: bool = False) -> PhaseGraph[DecodeIn, DecodeOut]:
        return self.graphs[2 if full else 0 if greedy else 1]

    def inputs(self, rows: StepRows) -> DecodeIn:
        return DecodeIn(**rows.fields())

    def decode(self, x: DecodeIn, full: bool = False) -> DecodeOut:
        """`decode` (greedy: the argmax of the LM head's own output, no float32 copy: the same
        index) and `decode[sample]` (one draw per row with its sampling parameters); `full`
        (`decode[full]`) draws from the processed logits and adds the token's logprobs."""
        if self.carry is not None:
            x = DecodeIn.of(from_carry(x.tensors(), self.carry))
        ids, loc, q_lens, kv_lens = decode_inputs(x.root, x.seq, x.tables, self.block_size)
        fb = ForwardBatch(
            mode=ForwardMode.DECODE, input_ids=ids, positions=x.seq, out_cache_loc=loc,
            q_lens=q_lens, kv_lens=kv_lens, block_tables=x.tables, width=1, max_q=1,
            max_kv=self.max_kv)
        hidden, aux = self.runner.forward(fb)
        carry = self.carry
        lp = top = None
        if x.temperature is None:
            # with the overlap schedule the argmax kernel writes the next root into the carry
            nxt = argmax(self.target.compute_logits(hidden, False),
                         also=carry["root"] if carry is not None else None)
        else:
            logits = self.target.compute_logits(hidden)
            if full:
                state = self.logits_state
                assert state is not None and x.slot is not None and x.offsets is not None
                nxt = x.sampling().sample(processed(state, x, logits, x.offsets))
                state.count(x.slot, nxt.unsqueeze(1), torch.ones_like(nxt, dtype=torch.bool).unsqueeze(1))
                lp, top = token_logprobs(logits, nxt)
            else:
                nxt = x.sampling().sample(logits)
        one = torch.ones_like(nxt)
        if carry is not None:  # seq + 1, the next root (sampled), offset + 1
            values = {"seq": x.seq} | ({"root": nxt} if x.temperature is not None else {})
            plus = {"seq": one}
            if x.offsets is not None:
                values["offsets"], plus["offsets"] = x.offsets, one
            to_carry(carry, values, plus=plus)
        return DecodeOut(emitted=torch.stack([one, x.root, nxt], 1),
                         feature=self.feature(hidden, aux) if self.feature is not None else None,
                         logprobs=lp.unsqueeze(1) if lp is not None else None,
                         top_ids=top.unsqueeze(1) if top is not None else None)
