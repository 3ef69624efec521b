"""Plain autoregressive decoding: prefill, then one token per request per step."""

from __future__ import annotations

import torch

from hotspec.engine.request import Request
from hotspec.layers.sampler import SamplingTensors, sample
from hotspec.models.llama import LlamaForCausalLM
from hotspec.runtime.batch_builder import decode_batch, last_token_index, prefill_batch
from hotspec.runtime.model_runner import ModelRunner


def sample_for(reqs: list[Request], logits: torch.Tensor) -> torch.Tensor:
    """Sample one token per row; the RNG offset is the request's generated-token count."""
    if all(r.params.temperature == 0 for r in reqs):
        return logits.argmax(-1)
    st = SamplingTensors.from_params([r.params for r in reqs], [r.seed for r in reqs],
                                     [len(r.output_token_ids) for r in reqs], logits.device)
    return sample(logits, st.temperature, st.top_p, st.top_k, st.min_p, st.seeds, st.offsets)


class VanillaWorker:
    reserve = 1  # KV slots a step writes beyond seq_len

    def __init__(self, target: LlamaForCausalLM, runner: ModelRunner, block_size: int,
                 device: torch.device) -> None:
        self.target = target
        self.runner = runner
        self.block_size = block_size
        self.device = device

    def prefill(self, reqs: list[Request]) -> list[list[int]]:
        """KV for prompt + tokens already generated (recompute after preemption); one new token."""
        tokens = [r.prompt_token_ids + r.output_token_ids for r in reqs]
        fb = prefill_batch(reqs, tokens, self.block_size, self.device)
        hidden, _ = self.runner.forward(fb)
        nxt = sample_for(reqs, self.target.compute_logits(hidden[last_token_index(fb)]))
        for r, t in zip(reqs, tokens):
            r.seq_len += len(t)
        return [[t] for t in nxt.tolist()]

    def step(self, reqs: list[Request]) -> list[list[int]]:
        fb = decode_batch(reqs, self.block_size, self.device)
        hidden, _ = self.runner.forward(fb)
        nxt = sample_for(reqs, self.target.compute_logits(hidden))
        for r in reqs:
            r.seq_len += 1
        return [[t] for t in nxt.tolist()]
