"""Plain autoregressive decoding: prefill, then one token per request per step (`decode`).

A decode step is launched (`launch`: inputs built and the graph enqueued, no host sync) and later
collected (`collect`: the one `tolist()` of the step). `step` does both at once. With the overlap
schedule the engine launches step N+1 before it collects step N (engine/launches.py): step N+1
reads a request's input token from the `carry` row where every decode graph leaves its tokens,
when the host has not read it yet. A vanilla step advances a request by exactly one position, so
positions, KV slots and sampling offsets are known ahead of the tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hotspec.engine.launches import HostCopy, Launches, to_carry
from hotspec.engine.request import Request, Status
from hotspec.layers.argmax import argmax
from hotspec.models.llama import LlamaForCausalLM
from hotspec.runtime.batch_builder import block_table_tensor, last_token_index, prefill_batch
from hotspec.runtime.decode_inputs import decode_inputs
from hotspec.runtime.forward_batch import ForwardBatch, ForwardMode
from hotspec.runtime.graph_runner import GraphRunner
from hotspec.runtime.model_runner import ModelRunner
from hotspec.runtime.phase_io import PhaseIO, Sampled, Tensors, example_sampling, sampling_fields

_CPU = torch.device("cpu")  # the graph runner moves host inputs to the device itself


@dataclass(kw_only=True)
class DecodeIn(Sampled):
    ids: torch.Tensor  # [B] long: each request's last token (0 where `src` names a carry row)
    seq: torch.Tensor  # [B] long: its position (the tokens in the KV cache)
    tables: torch.Tensor  # [B, max_blocks] int32
    src: torch.Tensor | None = None  # [B] long, overlap schedule: the carry row, or -1 (the host's)

    @classmethod
    def example(cls, bs: int, max_blocks: int, device: torch.device, sampled: bool,
                carried: bool) -> DecodeIn:
        """Static shapes; padding rows read the host's (zero) token at position 0 of block 0."""
        return cls(ids=torch.zeros(bs, dtype=torch.long, device=device),
                   seq=torch.zeros(bs, dtype=torch.long, device=device),
                   tables=torch.zeros(bs, max_blocks, dtype=torch.int32, device=device),
                   src=torch.full((bs,), -1, dtype=torch.long, device=device) if carried else None,
                   **(example_sampling(bs, device) if sampled else {}))


@dataclass(kw_only=True)
class DecodeOut(PhaseIO):
    next: torch.Tensor  # [B] long: the next token of each request


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


def sample_for(reqs: list[Request], logits: torch.Tensor) -> torch.Tensor:
    if all(r.params.temperature == 0 for r in reqs):
        return argmax(logits)
    return Sampled(**sampling_fields(reqs, logits.device)).sampling().sample(logits)


class VanillaWorker:
    reserve = 1  # KV slots a step writes beyond seq_len
    max_advance = 1  # positions a step advances a request by, at most

    def __init__(self, target: LlamaForCausalLM, runner: ModelRunner, graphs: GraphRunner,
                 block_size: int, device: torch.device, max_blocks_per_seq: int,
                 overlap: bool = False, max_rows: int = 1) -> None:
        self.target, self.runner, self.graphs = target, runner, graphs
        self.block_size, self.device = block_size, device
        self.max_blocks_per_seq = max_blocks_per_seq
        self.max_kv = max_blocks_per_seq * block_size
        self.overlap = overlap
        self.launches = Launches()
        # overlap: the tokens the next launch reads, sized for the largest batch a decode pass
        # runs (padded graph or eager)
        self.carry: Tensors = {"ids": torch.zeros(max(max_rows, graphs.max_bs), dtype=torch.long,
                                                  device=device)} if overlap else {}

        def example(sampled: bool) -> Callable[[int], DecodeIn]:
            return lambda bs: DecodeIn.example(bs, max_blocks_per_seq, device, sampled, overlap)

        self.decode_graph = graphs.register("decode", self.decode, example(False), DecodeOut,
                                            publish=("next",))
        self.decode_sample_graph = graphs.register("decode[sample]", self.decode_sample,
                                                   example(True), DecodeOut, publish=("next",))

    @property
    def overlapping(self) -> bool:
        """Whether the engine may launch a step before collecting the last one."""
        return self.overlap

    def prefill(self, reqs: list[Request], chunks: list[int] | None = None) -> list[list[int]]:
        """KV for the pending tokens (prompt + tokens already generated: recompute after
        preemption), appended after seq_len, `chunks[i]` of them (all when None). A request whose
        chunk was its last gets one new token; the others (chunked prefill) get none yet."""
        assert not any(self.launches.ahead(r) for r in reqs), "collect a request's steps before prefill"
        tokens, final = prefill_chunks(reqs, chunks)
        fb = prefill_batch(reqs, tokens, self.block_size, self.device)
        hidden, _ = self.runner.forward(fb)
        rows = [i for i, f in enumerate(final) if f]
        out: list[list[int]] = [[] for _ in reqs]
        if rows:
            last = last_token_index(fb)[rows]
            nxt = sample_for([reqs[i] for i in rows], self.target.compute_logits(hidden[last]))
            for i, t in zip(rows, nxt.tolist()):
                out[i] = [t]
        for r, t in zip(reqs, tokens):
            r.seq_len += len(t)
        return out

    @torch.inference_mode()
    def step(self, reqs: list[Request]) -> list[list[int]]:
        """One decode step, launched and collected."""
        self.launch(reqs)
        return self.collect()[1]

    @torch.inference_mode()
    def launch(self, reqs: list[Request]) -> None:
        """Enqueue one decode step for `reqs`; no host sync (see the module docstring)."""
        ahead = [self.launches.ahead(r) for r in reqs]
        if any(ahead) and not self.overlap:
            raise RuntimeError("a decode step was launched before the last one was collected; "
                               "that needs overlap=True")
        seq = [r.seq_len + a for r, a in zip(reqs, ahead)]
        if self.graphs.mode == "eager":
            self.max_kv = max(seq) + 1
        greedy = all(r.params.temperature == 0 for r in reqs)
        x = DecodeIn(ids=torch.tensor([0 if a else r.last_token for r, a in zip(reqs, ahead)],
                                      dtype=torch.long),
                     seq=torch.tensor(seq, dtype=torch.long), tables=block_table_tensor(reqs, _CPU),
                     src=torch.tensor(self.launches.src_rows(reqs), dtype=torch.long) if self.overlap
                     else None, **({} if greedy else sampling_fields(reqs, _CPU, ahead)))
        graph = self.decode_graph if greedy else self.decode_sample_graph
        # (borrowed from the graph: the graph publishes it to the host, or HostCopy copies it out
        # before the next launch)
        out = graph.run(x, borrow=("next",))
        self.launches.push(reqs, graph.read_back("next") or HostCopy(out.next))

    def collect(self) -> tuple[list[Request], list[list[int]]]:
        """The oldest launched step's requests and their tokens: the one host sync of a step.
        Requests that finished since (a stop token in the step before, an abort) keep theirs out."""
        reqs, nxt = self.launches.pop()
        tokens = nxt.tolist()
        for r in reqs:
            if r.status is not Status.FINISHED:
                r.seq_len += 1
        return reqs, [[t] for t in tokens]

    def _logits(self, x: DecodeIn, float32: bool = True) -> torch.Tensor:
        """The LM head's output for the step's rows. Overlap: a row's token comes from the last
        step's carry (`src`), or the host's (`src` -1); runtime/decode_inputs does that and
        the slots and lengths in one kernel."""
        seq, tables = x.seq, x.tables
        carried = (x.src, self.carry["ids"]) if x.src is not None else ()
        ids, loc, q_lens, kv_lens = decode_inputs(x.ids, seq, tables, self.block_size, *carried)
        fb = ForwardBatch(
            mode=ForwardMode.DECODE, input_ids=ids, positions=seq, out_cache_loc=loc,
            q_lens=q_lens, kv_lens=kv_lens, block_tables=tables, width=1, max_q=1,
            max_kv=self.max_kv)
        hidden, _ = self.runner.forward(fb)
        return self.target.compute_logits(hidden, float32)

    def decode(self, x: DecodeIn) -> DecodeOut:
        """`decode`, greedy: the argmax of the LM head's own output, no float32 copy (the same
        index); with the overlap schedule the argmax kernel also writes the carry (no copy kernel
        after it)."""
        carry = self.carry["ids"] if self.overlap else None
        return DecodeOut(next=argmax(self._logits(x, float32=False), also=carry))

    def decode_sample(self, x: DecodeIn) -> DecodeOut:
        """`decode[sample]`: one token drawn per row with its sampling parameters."""
        nxt = x.sampling().sample(self._logits(x))
        if self.overlap:  # what the next launch reads for rows it has not collected yet
            to_carry(self.carry, {"ids": nxt})
        return DecodeOut(next=nxt)
