"""One target pass over finished records, through the engine's own prefill path, recording what a
draft head reads (so training features are bit-for-bit what inference feeds the head).

Per token p of a record t_0..t_{L-1}:
  * EAGLE-1/2: `feature[p]` = the target's final normed hidden state f_p [H]. The loss targets are
    recomputed from it during training (next feature f_{p+1}; next-token distribution
    softmax(lm_head(f_{p+1}))), so nothing else is stored.
  * EAGLE-3: `feature[p]` = the concatenated hidden states ENTERING the target layers
    `aux_layer_ids` [n*H]; `final[p]` = f_p [H], from which training recomputes the target's
    logits over the draft vocabulary; `argmax[p]` = the target's full-vocabulary argmax at p
    (the position mask for targets outside the draft vocabulary).

Which tokens are loss labels: every token past each record's prompt (`n_prompt`), or, with
`mask`, the tokens the target wrote (several spans in a multi-turn conversation) and, with
`tail`, whether the token after each record is one (losses.label_mask).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hotspec.core.request import Request
from hotspec.engine.engine import Engine
from hotspec.runtime.batch_builder import prefill_batch
from hotspec.sampling_params import SamplingParams


@dataclass
class FeatureBlock:
    """Records stored flat: record r is rows offsets[r]:offsets[r+1] of every per-token tensor."""

    tokens: torch.Tensor  # [N] long
    offsets: torch.Tensor  # [R+1] long
    n_prompt: torch.Tensor  # [R] long, prompt tokens at the start of each record
    feature: torch.Tensor  # [N, F]
    final: torch.Tensor | None = None  # [N, H] (EAGLE-3 only)
    argmax: torch.Tensor | None = None  # [N] long (EAGLE-3 only)
    mask: torch.Tensor | None = None  # [N] bool, host: the target wrote the token (a label)
    tail: torch.Tensor | None = None  # [R] bool, host: the token after the record is a label

    @property
    def num_records(self) -> int:
        return self.offsets.shape[0] - 1

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.to_dict().values())

    def to(self, device: torch.device) -> FeatureBlock:
        """The per-token tensors on `device`; `offsets` and `n_prompt` stay on the host, where the
        trainer plans its batches without waiting for the device."""
        host = ("offsets", "n_prompt", "mask", "tail")
        return FeatureBlock.from_dict({k: v if k in host else v.to(device)
                                       for k, v in self.to_dict().items()})

    def to_dict(self) -> dict[str, torch.Tensor]:
        d = {"tokens": self.tokens, "offsets": self.offsets, "n_prompt": self.n_prompt,
             "feature": self.feature}
        if self.final is not None and self.argmax is not None:
            d.update(final=self.final, argmax=self.argmax)
        if self.mask is not None and self.tail is not None:
            d.update(mask=self.mask, tail=self.tail)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, torch.Tensor]) -> FeatureBlock:
        return cls(d["tokens"], d["offsets"], d["n_prompt"], d["feature"], d.get("final"),
                   d.get("argmax"), d.get("mask"), d.get("tail"))

    @classmethod
    def concat(cls, blocks: list[FeatureBlock]) -> FeatureBlock:
        if not blocks:
            raise ValueError("no feature blocks to concatenate")
        lens = [torch.diff(b.offsets) for b in blocks]
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.cat(lens).cumsum(0)])
        eagle3 = blocks[0].final is not None

        def cat(name: str) -> torch.Tensor:
            return torch.cat([getattr(b, name) for b in blocks])

        masked = blocks[0].mask is not None
        return cls(cat("tokens"), offsets, cat("n_prompt"), cat("feature"),
                   cat("final") if eagle3 else None, cat("argmax") if eagle3 else None,
                   cat("mask") if masked else None, cat("tail") if masked else None)


@torch.inference_mode()
def extract_features(engine: Engine, records: list[list[int]], n_prompt: list[int],
                     aux_layer_ids: tuple[int, ...], token_budget: int) -> FeatureBlock:
    """Prefill every record (in batches of at most `token_budget` tokens and free KV blocks)
    through the engine's target runner; returns the features on the CPU in the engine's dtype."""
    feature, final, argmax = target_pass(engine, records, aux_layer_ids, token_budget,
                                         torch.device("cpu"))
    lens = torch.tensor([len(r) for r in records], dtype=torch.long)
    return FeatureBlock(
        tokens=torch.tensor([t for r in records for t in r], dtype=torch.long),
        offsets=torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]),
        n_prompt=torch.tensor(n_prompt, dtype=torch.long),
        feature=feature, final=final, argmax=argmax)


@torch.inference_mode()
def target_pass(engine: Engine, records: list[list[int]], aux_layer_ids: tuple[int, ...],
                token_budget: int, to: torch.device) -> tuple[torch.Tensor, torch.Tensor | None,
                                                                torch.Tensor | None]:
    """(feature [N, F], final [N, H] | None, argmax [N] | None) of the records back to back, on
    `to`, in the engine's dtype: the target runner's prefill of each batch of records (at most
    `token_budget` tokens and the free KV blocks); final and argmax for EAGLE-3 (aux layers)."""
    runner = engine.worker.target_runner
    target = engine.target
    eagle3 = bool(aux_layer_ids)
    feats: list[torch.Tensor] = []
    finals: list[torch.Tensor] = []
    argmaxes: list[torch.Tensor] = []
    saved = target.capture_layers
    target.capture_layers = tuple(aux_layer_ids)
    try:
        for batch in _batches(engine, records, token_budget):
            reqs = [Request(-1 - i, records[i], SamplingParams(), 0) for i in batch]
            try:
                for r in reqs:
                    r.blocks = engine.allocator.allocate(_blocks(engine, len(r.prompt_token_ids)))
                fb = prefill_batch(reqs, [r.prompt_token_ids for r in reqs], engine.block_size,
                                   engine.device)
                hidden, aux = runner.forward(fb)
            finally:
                for r in reqs:
                    engine.allocator.free(r.blocks)
            if eagle3:
                feats.append(torch.cat(aux, dim=-1).to(to))
                finals.append(hidden.to(to, copy=True))  # not a view of a runner buffer
                # In pieces: full-vocabulary logits of a whole batch would be [tokens, V] float32.
                argmaxes += [target.compute_logits(h).argmax(-1).to(to) for h in hidden.split(4096)]
            else:
                feats.append(hidden.to(to, copy=True))
    finally:
        target.capture_layers = saved
    return (torch.cat(feats), torch.cat(finals) if eagle3 else None,
            torch.cat(argmaxes) if eagle3 else None)


def _blocks(engine: Engine, n_tokens: int) -> int:
    return -(-n_tokens // engine.block_size)


def _batches(engine: Engine, records: list[list[int]], token_budget: int) -> list[list[int]]:
    """Consecutive record indices, each batch within the token budget and the free KV blocks
    (a record alone may exceed the budget; it must fit the KV cache, which max_seq_len ensures)."""
    free = engine.allocator.num_free
    batches: list[list[int]] = []
    cur: list[int] = []
    tokens = blocks = 0
    for i, r in enumerate(records):
        b = _blocks(engine, len(r))
        if b > free:
            raise ValueError(f"a record of {len(r)} tokens does not fit the KV cache ({free} free "
                             f"blocks of {engine.block_size}); lower max_seq_len or give the KV "
                             "cache more memory")
        if cur and (tokens + len(r) > token_budget or blocks + b > free):
            batches.append(cur)
            cur, tokens, blocks = [], 0, 0
        cur.append(i)
        tokens += len(r)
        blocks += b
    if cur:
        batches.append(cur)
    return batches
