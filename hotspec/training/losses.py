"""Losses of the unrolled head (head_forward.unroll) against the target's own outputs.

Which (index j, step k) pairs count: the label position q = j + k + 1 must lie in the record
(q < L) and predict a response token (q >= n_prompt - 1: the target's distribution at q is over
token q + 1). Step k weighs 0.8^k (EAGLE-3 paper, SpecForge's ploss weights); each step's loss is
a mean over its counted positions.

  * EAGLE-1/2 (EAGLE paper, SafeAILab/EAGLE train/main.py): SmoothL1(out, f_q) averaged over the
    hidden size + 0.1 * cross-entropy of the head's logits against the target's next-token
    distribution softmax(lm_head(f_q)) (both through the target's LM head).
  * EAGLE-3 (SpecForge OnlineEagle3Model): cross-entropy against the target's distribution at q
    restricted to the draft vocabulary and renormalised over it, softmax(logits_q[draft ids]);
    positions whose full-vocabulary target argmax is outside the draft vocabulary are ignored (the
    head could not propose that token; SpecForge's position_mask).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hotspec.models.draft_head import DraftHead
from hotspec.training.head_forward import shift_left

STEP_DECAY = 0.8
EAGLE_CE_WEIGHT = 0.1


@dataclass
class TrainBatch:
    tokens: torch.Tensor  # [B, T] long, zero-padded
    feature: torch.Tensor  # [B, T, F] what the head reads at step 0
    lengths: torch.Tensor  # [B] long
    n_prompt: torch.Tensor  # [B] long
    final: torch.Tensor | None = None  # [B, T, H] target's final normed hidden (EAGLE-3)
    argmax: torch.Tensor | None = None  # [B, T] target's full-vocabulary argmax (EAGLE-3)


@dataclass
class LossOut:
    loss: torch.Tensor  # weighted sum over steps, differentiable
    step_loss: list[float]
    step_acc: list[float]  # head top-1 == target top-1 over counted positions
    counted: list[int]  # positions counted per step


def counted_positions(batch: TrainBatch, k: int) -> torch.Tensor:
    """[B, T] bool: index j of step k has a label (see the module docstring)."""
    q = torch.arange(batch.tokens.shape[1], device=batch.tokens.device).view(1, -1) + k + 1
    return (q < batch.lengths.view(-1, 1)) & (q >= batch.n_prompt.view(-1, 1) - 1)


def eagle_loss(head: DraftHead, batch: TrainBatch,
               outs: list[tuple[torch.Tensor, torch.Tensor]]) -> LossOut:
    terms, step_loss, step_acc, counted = [], [], [], []
    for k, (hidden, _) in enumerate(outs):
        mask = counted_positions(batch, k)
        h = hidden[mask]
        f_next = shift_left(batch.feature, k + 1)[mask]  # the target's feature at q = j + k + 1
        with torch.no_grad():
            target_p = torch.softmax(head.compute_logits(f_next), dim=-1)
        logp = torch.log_softmax(head.compute_logits(h), dim=-1)
        vloss = F.smooth_l1_loss(h.float(), f_next.float(), reduction="none").mean(-1)
        ploss = -(target_p * logp).sum(-1)
        _collect(vloss + EAGLE_CE_WEIGHT * ploss, logp, target_p, k, terms, step_loss, step_acc,
                 counted)
    return LossOut(sum(terms), step_loss, step_acc, counted)  # type: ignore[arg-type]


def eagle3_loss(head: DraftHead, batch: TrainBatch, outs: list[tuple[torch.Tensor, torch.Tensor]],
                target_rows: torch.Tensor, t2d: torch.Tensor) -> LossOut:
    """`target_rows` [D, H]: the target LM head's rows of the draft vocabulary (draft order);
    `t2d` [V] bool: membership of the draft vocabulary."""
    assert batch.final is not None and batch.argmax is not None, "EAGLE-3 batches carry final/argmax"
    in_vocab = t2d[batch.argmax]
    terms, step_loss, step_acc, counted = [], [], [], []
    for k, (hidden, _) in enumerate(outs):
        mask = counted_positions(batch, k) & shift_left(in_vocab, k + 1)
        with torch.no_grad():
            final = shift_left(batch.final, k + 1)[mask]
            target_p = torch.softmax(F.linear(final, target_rows.to(final.dtype)).float(), dim=-1)
        logp = torch.log_softmax(head.compute_logits(hidden[mask]), dim=-1)
        _collect(-(target_p * logp).sum(-1), logp, target_p, k, terms, step_loss, step_acc, counted)
    return LossOut(sum(terms), step_loss, step_acc, counted)  # type: ignore[arg-type]


def _collect(per_pos: torch.Tensor, logp: torch.Tensor, target_p: torch.Tensor, k: int,
             terms: list[torch.Tensor], step_loss: list[float], step_acc: list[float],
             counted: list[int]) -> None:
    n = per_pos.shape[0]
    # An empty step (short records) adds a zero that still depends on the graph.
    loss = per_pos.mean() if n else per_pos.sum()
    terms.append(STEP_DECAY ** k * loss)
    step_loss.append(float(loss.detach()))
    acc = (logp.argmax(-1) == target_p.argmax(-1)).float().mean() if n else torch.zeros(())
    step_acc.append(float(acc))
    counted.append(n)
