"""The speculative phases' inputs and outputs, with the static shapes each input declares.

B is the batch, K = topk (the draft state's: SpecShapes.state_k), N = num_draft_tokens, W =
num_steps + 1 (the accepted path's largest length: root, drafts, no bonus), H the draft head's
hidden size, F the target feature it reads (EAGLE-3: three target layers concatenated, 3 x target
hidden). Padding rows (what `example` builds) use the null block 0 and length 1, so they write
nowhere that matters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hotspec.core.spec_shape import SpecShape
from hotspec.runtime.phase_io import PhaseIO, Sampled, example_sampling
from hotspec.speculative.tree import MAX_LOGP, DraftTree


@dataclass(frozen=True)
class SpecShapes:
    """Everything the phases' static buffers are sized from, read off the modules that fill them."""

    shape: SpecShape
    max_blocks_per_seq: int
    draft_hidden: int  # H: draft_head.hidden_size
    target_feature: int  # F: draft_head.target_feature_size
    dtype: torch.dtype  # activations (hidden states, features)
    device: torch.device
    # K of the draft state a step leaves (the depth-1 candidates): the largest topk of every shape
    # the worker runs, so any of them can take the next step; 0: this shape's topk
    state_topk: int = 0

    @property
    def num_steps(self) -> int:
        return self.shape.num_steps

    @property
    def topk(self) -> int:
        return self.shape.topk

    @property
    def num_draft_tokens(self) -> int:
        return self.shape.num_draft_tokens

    @property
    def state_k(self) -> int:
        return self.state_topk or self.topk

    @property
    def width(self) -> int:
        """W: draft_extend rows per request, the accepted path's largest length."""
        return self.shape.width

    def _long(self, *shape: int, fill: int = 0) -> torch.Tensor:
        return torch.full(shape, fill, dtype=torch.long, device=self.device)

    def _tables(self, bs: int) -> torch.Tensor:
        return torch.zeros(bs, self.max_blocks_per_seq, dtype=torch.int32, device=self.device)


@dataclass(kw_only=True)
class Rows(PhaseIO):
    """What every phase of a step reads of its requests."""

    seq: torch.Tensor  # [B] long: committed tokens (the KV indices in use)
    tables: torch.Tensor  # [B, max_blocks] int32: block table (target and draft pools share it)


@dataclass(kw_only=True)
class DraftState(PhaseIO):
    """What draft_extend leaves for the next draft: the candidates after the root."""

    topk_logp: torch.Tensor  # [B, K] float32: draft log-probs of the depth-1 candidates
    topk_ids: torch.Tensor  # [B, K] long: their target ids
    feature: torch.Tensor  # [B, H]: the draft feature the depth-1 candidates are drafted with


@dataclass(kw_only=True)
class DraftIn(Rows, DraftState):
    root: torch.Tensor  # [B] long: the last committed token (the bonus of the last step)

    @classmethod
    def example(cls, s: SpecShapes, bs: int) -> DraftIn:
        return cls(seq=s._long(bs, fill=1), tables=s._tables(bs), root=s._long(bs),
                   topk_logp=torch.full((bs, s.state_k), MAX_LOGP, device=s.device),
                   topk_ids=s._long(bs, s.state_k),
                   feature=torch.zeros(bs, s.draft_hidden, device=s.device, dtype=s.dtype))


@dataclass(kw_only=True)
class VerifyIn(Rows, DraftTree, Sampled):
    @classmethod
    def example(cls, s: SpecShapes, bs: int, sampled: bool = False,
                identity: int | None = None) -> VerifyIn:
        n = s.num_draft_tokens
        eye = torch.eye(n, dtype=torch.bool, device=s.device)
        return cls(seq=s._long(bs, fill=1), tables=s._tables(bs), tokens=s._long(bs, n),
                   parents=s._long(bs, n), depth=s._long(bs, n),
                   mask=eye.expand(bs, n, n).contiguous(),
                   **(example_sampling(bs, s.device, identity) if sampled else {}))


@dataclass(kw_only=True)
class Accepted(PhaseIO):
    """`accept`'s verdict, after the accepted nodes' target KV moved to seq + 0, 1, ..."""

    acc_tokens: torch.Tensor  # [B, W] long: the accepted path, root first (rows >= accept_len: trash)
    accept_len: torch.Tensor  # [B] long: a, tokens of the path accepted (1..W, the root included)
    bonus: torch.Tensor  # [B] long: the target's token after the path (the next root)
    acc_feature: torch.Tensor  # [B, W, F]: the target features of the path
    slots: torch.Tensor | None = None  # [B, W] long: KV slots of seq + 0..W-1 (the fused step)
    # verify[logprobs]: per emitted position d < W (the path's token d + 1, the bonus at a - 1) its
    # logprob and the top alternatives at path node d (layers/logprobs.py)
    logprobs: torch.Tensor | None = None  # [B, W, 1 + MAX_LOGPROBS] float32
    top_ids: torch.Tensor | None = None  # [B, W, MAX_LOGPROBS] long

    def extend_tensors(self) -> dict[str, torch.Tensor]:
        """What draft_extend reads of the verdict."""
        return {k: v for k, v in self.tensors().items() if k not in ("logprobs", "top_ids")}


@dataclass(kw_only=True)
class ExtendIn(Rows, Accepted):
    @classmethod
    def example(cls, s: SpecShapes, bs: int) -> ExtendIn:
        w = s.width
        return cls(seq=s._long(bs, fill=1), tables=s._tables(bs), acc_tokens=s._long(bs, w),
                   accept_len=s._long(bs, fill=1), bonus=s._long(bs),
                   acc_feature=torch.zeros(bs, w, s.target_feature, device=s.device, dtype=s.dtype))


@dataclass(kw_only=True)
class MaskedExtendIn(ExtendIn):
    """draft_extend of a step with a grammar: each row's LogitsState row, whose node-0 grammar
    mask (what may follow the accepted tokens) the draft's candidates take."""

    slot: torch.Tensor  # [B] long

    @classmethod
    def example(cls, s: SpecShapes, bs: int, identity: int = 0) -> MaskedExtendIn:  # type: ignore[override]
        return cls(**ExtendIn.example(s, bs).tensors(), slot=s._long(bs, fill=identity))


@dataclass(kw_only=True)
class ExtendOut(DraftState):
    logits: torch.Tensor  # [B, draft_vocab]: the draft LM head's output (sized by the head)


@dataclass(kw_only=True)
class StepIn(DraftIn, Sampled):
    # overlap schedule: per row, its row in the last unread step's carry, or -1 (the host's values)
    src: torch.Tensor | None = None  # [B] long

    @classmethod
    def example(cls, s: SpecShapes, bs: int, sampled: bool = False,  # type: ignore[override]
                carried: bool = False, identity: int | None = None) -> StepIn:
        d = DraftIn.example(s, bs).tensors()
        return cls(**d, **(example_sampling(bs, s.device, identity) if sampled else {}),
                   src=s._long(bs, fill=-1) if carried else None)


@dataclass(kw_only=True)
class StepOut(DraftState):
    # what the host reads: per request a, the accepted path (root first), the bonus
    emitted: torch.Tensor  # [B, 2 + W] long
    logprobs: torch.Tensor | None = None  # step[logprobs]: as Accepted's
    top_ids: torch.Tensor | None = None


def emitted_rows(acc: Accepted) -> torch.Tensor:
    """What the host reads after a step, as one [B, 2 + W] tensor (one copy, one sync)."""
    return torch.cat([acc.accept_len.unsqueeze(1), acc.acc_tokens, acc.bonus.unsqueeze(1)], 1)
