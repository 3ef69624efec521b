"""Plain autoregressive decoding: prefill, then one token per request per step (`decode`).

A decode step is launched (`launch`: inputs built and the graph enqueued, no host sync) and later
collected (`collect`: the one `tolist()` of the step). `step` does both at once. With the overlap
schedule the engine launches step N+1 before it collects step N, so the host's work between steps
runs while the device computes. Step N+1 then needs step N's tokens before the host has seen them:
each decode graph leaves its tokens in `last_next` (one device buffer shared by every batch size)
and reads a request's input token from there (`src`: its row in the previous launch) or from the
host (`src` -1: a token the host already knows). A vanilla step always advances a request by
exactly one position, so positions, KV slots and sampling offsets are known ahead of the tokens.
"""

from __future__ import annotations

from collections import deque

import torch

from hotspec.engine.request import Request
from hotspec.layers.sampler import SamplingTensors, sample
from hotspec.models.llama import LlamaForCausalLM
from hotspec.runtime.batch_builder import block_table_tensor, last_token_index, prefill_batch, slots_at
from hotspec.runtime.forward_batch import ForwardBatch, ForwardMode
from hotspec.runtime.graph_runner import GraphRunner, Tensors
from hotspec.runtime.model_runner import ModelRunner


def sampling_inputs(reqs: list[Request], device: torch.device,
                    ahead: list[int] | None = None) -> Tensors:
    """Per-row sampling tensors; the RNG offset is the request's generated-token count (plus
    `ahead[i]` tokens of launched steps the host has not read yet)."""
    counts = [len(r.output_token_ids) + (ahead[i] if ahead else 0) for i, r in enumerate(reqs)]
    st = SamplingTensors.from_params([r.params for r in reqs], [r.seed for r in reqs], counts, device)
    return {"temperature": st.temperature, "top_p": st.top_p, "top_k": st.top_k,
            "min_p": st.min_p, "seeds": st.seeds, "offsets": st.offsets}


def example_sampling(bs: int, device: torch.device) -> Tensors:
    """Static-buffer shapes (and padding rows: greedy) of `sampling_inputs`."""
    f = {"dtype": torch.float32, "device": device}
    i = {"dtype": torch.long, "device": device}
    return {"temperature": torch.zeros(bs, **f), "top_p": torch.ones(bs, **f),
            "top_k": torch.full((bs,), -1, **i), "min_p": torch.zeros(bs, **f),
            "seeds": torch.zeros(bs, **i), "offsets": torch.zeros(bs, **i)}


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
        return logits.argmax(-1)
    x = sampling_inputs(reqs, logits.device)
    return sample(logits, x["temperature"], x["top_p"], x["top_k"], x["min_p"], x["seeds"], x["offsets"])


class VanillaWorker:
    reserve = 1  # KV slots a step writes beyond seq_len

    def __init__(self, target: LlamaForCausalLM, runner: ModelRunner, graphs: GraphRunner,
                 block_size: int, device: torch.device, max_blocks_per_seq: int,
                 overlap: bool = False, max_rows: int = 1) -> None:
        self.target, self.runner, self.graphs = target, runner, graphs
        self.block_size, self.device = block_size, device
        self.max_blocks_per_seq = max_blocks_per_seq
        self.max_kv = max_blocks_per_seq * block_size
        self.overlap = overlap
        # Launched, not yet collected: (requests, their next tokens on the device), oldest first.
        self._launches: deque[tuple[list[Request], torch.Tensor]] = deque()
        self._ahead: dict[Request, int] = {}  # per request: its rows in those launches
        self._rows: dict[Request, int] = {}  # row of each request in the newest launch
        if overlap:  # sized for the largest batch a decode pass runs: padded graph or eager
            rows = max(max_rows, graphs.max_bs)
            self.last_next = torch.zeros(rows, dtype=torch.long, device=device)
        graphs.register("decode", self.decode_phase, self._example)
        graphs.register("decode[sample]", self.decode_sample_phase,
                        lambda bs: dict(self._example(bs), **example_sampling(bs, device)))

    def prefill(self, reqs: list[Request], chunks: list[int] | None = None) -> list[list[int]]:
        """KV for the pending tokens (prompt + tokens already generated: recompute after
        preemption), appended after seq_len, `chunks[i]` of them (all when None). A request whose
        chunk was its last gets one new token; the others (chunked prefill) get none yet."""
        assert not any(r in self._ahead for r in reqs), "collect a request's launches before prefill"
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
        """Enqueue one decode step for `reqs` (no host sync); each request's seq_len advances now."""
        if self.graphs.mode == "eager":
            self.max_kv = max(r.seq_len for r in reqs) + 1
        host = torch.device("cpu")  # the graph runner copies host inputs into its buffers
        ahead = [self._ahead.get(r, 0) for r in reqs]
        if not self.overlap and any(ahead):
            raise RuntimeError("a decode step was launched before the last one was collected; "
                               "that needs overlap=True")
        x: Tensors = {"ids": torch.tensor([0 if a else r.last_token for r, a in zip(reqs, ahead)],
                                          dtype=torch.long),
                      "seq": torch.tensor([r.seq_len for r in reqs], dtype=torch.long),
                      "tables": block_table_tensor(reqs, host)}
        if self.overlap:
            x["src"] = torch.tensor([self._rows[r] if a else -1 for r, a in zip(reqs, ahead)],
                                    dtype=torch.long)
        if all(r.params.temperature == 0 for r in reqs):
            out = self.graphs.run("decode", x)
        else:
            out = self.graphs.run("decode[sample]", dict(x, **sampling_inputs(reqs, host, ahead)))
        self._launches.append((reqs, out["next"]))
        self._rows = {r: i for i, r in enumerate(reqs)}
        for r in reqs:
            r.seq_len += 1
            self._ahead[r] = self._ahead.get(r, 0) + 1

    def collect(self) -> tuple[list[Request], list[list[int]]]:
        """The oldest launched step's requests and their tokens: the one host sync of a step."""
        reqs, nxt = self._launches.popleft()
        tokens = nxt.tolist()
        for r in reqs:
            self._ahead[r] -= 1
            if not self._ahead[r]:
                del self._ahead[r]
        return reqs, [[t] for t in tokens]

    @property
    def launched(self) -> int:
        """Launched steps not yet collected."""
        return len(self._launches)

    def ahead(self, req: Request) -> int:
        """Steps launched for `req` whose tokens the host has not read (its seq_len counts them)."""
        return self._ahead.get(req, 0)

    def discard_launches(self) -> None:
        """Forget uncollected steps (after a failed step: their requests are failed)."""
        self._launches.clear()
        self._ahead.clear()
        self._rows = {}

    def _logits(self, x: Tensors) -> torch.Tensor:
        seq, tables = x["seq"], x["tables"]
        b = seq.shape[0]
        fb = ForwardBatch(
            mode=ForwardMode.DECODE, input_ids=x["ids"], positions=seq,
            out_cache_loc=slots_at(tables, seq.unsqueeze(1), self.block_size).view(-1),
            q_lens=torch.ones(b, dtype=torch.long, device=seq.device), kv_lens=seq + 1,
            block_tables=tables, width=1, max_q=1, max_kv=self.max_kv)
        hidden, _ = self.runner.forward(fb)
        return self.target.compute_logits(hidden)

    def _input_ids(self, x: Tensors) -> Tensors:
        """Overlap: each row's token from the previous launch's `last_next` row `src`, or from
        the host (`src` -1)."""
        if not self.overlap:
            return x
        src = x["src"]
        return dict(x, ids=torch.where(src >= 0, self.last_next[src.clamp(min=0)], x["ids"]))

    def _next(self, nxt: torch.Tensor) -> Tensors:
        if self.overlap:  # what the next launch reads for rows it has not collected yet
            self.last_next[: nxt.shape[0]].copy_(nxt)
        return {"next": nxt}

    def decode_phase(self, x: Tensors) -> Tensors:
        return self._next(self._logits(self._input_ids(x)).argmax(-1))

    def decode_sample_phase(self, x: Tensors) -> Tensors:
        x = self._input_ids(x)
        return self._next(sample(self._logits(x), x["temperature"], x["top_p"], x["top_k"],
                                 x["min_p"], x["seeds"], x["offsets"]))

    def _example(self, bs: int) -> Tensors:
        dev = self.device
        x = {"ids": torch.zeros(bs, dtype=torch.long, device=dev),
             "seq": torch.zeros(bs, dtype=torch.long, device=dev),
             "tables": torch.zeros(bs, self.max_blocks_per_seq, dtype=torch.int32, device=dev)}
        if self.overlap:  # padding rows read the host's (zero) token
            x["src"] = torch.full((bs,), -1, dtype=torch.long, device=dev)
        return x
