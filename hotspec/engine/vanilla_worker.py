"""Plain autoregressive decoding: prefill, then one token per request per step (`decode`)."""

from __future__ import annotations

import torch

from hotspec.engine.request import Request
from hotspec.layers.sampler import SamplingTensors, sample
from hotspec.models.llama import LlamaForCausalLM
from hotspec.runtime.batch_builder import block_table_tensor, last_token_index, prefill_batch, slots_at
from hotspec.runtime.forward_batch import ForwardBatch, ForwardMode
from hotspec.runtime.graph_runner import GraphRunner, Tensors
from hotspec.runtime.model_runner import ModelRunner


def sampling_inputs(reqs: list[Request], device: torch.device) -> Tensors:
    """Per-row sampling tensors; the RNG offset is the request's generated-token count."""
    st = SamplingTensors.from_params([r.params for r in reqs], [r.seed for r in reqs],
                                     [len(r.output_token_ids) for r in reqs], device)
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
                 block_size: int, device: torch.device, max_blocks_per_seq: int) -> None:
        self.target, self.runner, self.graphs = target, runner, graphs
        self.block_size, self.device = block_size, device
        self.max_blocks_per_seq = max_blocks_per_seq
        self.max_kv = max_blocks_per_seq * block_size
        graphs.register("decode", self.decode_phase, self._example)
        graphs.register("decode[sample]", self.decode_sample_phase,
                        lambda bs: dict(self._example(bs), **example_sampling(bs, device)))

    def prefill(self, reqs: list[Request], chunks: list[int] | None = None) -> list[list[int]]:
        """KV for the pending tokens (prompt + tokens already generated: recompute after
        preemption), appended after seq_len, `chunks[i]` of them (all when None). A request whose
        chunk was its last gets one new token; the others (chunked prefill) get none yet."""
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
        if self.graphs.mode == "eager":
            self.max_kv = max(r.seq_len for r in reqs) + 1
        host = torch.device("cpu")  # the graph runner copies host inputs into its buffers
        x: Tensors = {"ids": torch.tensor([r.last_token for r in reqs], dtype=torch.long),
                      "seq": torch.tensor([r.seq_len for r in reqs], dtype=torch.long),
                      "tables": block_table_tensor(reqs, host)}
        if all(r.params.temperature == 0 for r in reqs):
            out = self.graphs.run("decode", x)
        else:
            out = self.graphs.run("decode[sample]", dict(x, **sampling_inputs(reqs, host)))
        nxt = out["next"].tolist()  # the one host sync of the step
        for r in reqs:
            r.seq_len += 1
        return [[t] for t in nxt]

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

    def decode_phase(self, x: Tensors) -> Tensors:
        return {"next": self._logits(x).argmax(-1)}

    def decode_sample_phase(self, x: Tensors) -> Tensors:
        return {"next": sample(self._logits(x), x["temperature"], x["top_p"], x["top_k"], x["min_p"],
                               x["seeds"], x["offsets"])}

    def _example(self, bs: int) -> Tensors:
        dev = self.device
        return {"ids": torch.zeros(bs, dtype=torch.long, device=dev),
                "seq": torch.zeros(bs, dtype=torch.long, device=dev),
                "tables": torch.zeros(bs, self.max_blocks_per_seq, dtype=torch.int32, device=dev)}
