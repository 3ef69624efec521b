"""Losses of the unrolled head (head_forward.unroll) against the target's own outputs.

Which (index j, step k) pairs count: the label position q = j + k + 1 must lie in the record
(q < L), and the token the target's distribution at q is over, q + 1, must be one the target
wrote: `labels[q + 1]` (`label_mask`). Column L of the labels stands for the token after the
record: set where a token shard's record is cut inside a target turn and for every prompt +
response record (FeatureBlock's n_prompt: token p is a label iff n_prompt <= p <= L, the target's
distribution after its last response token included), clear where a token shard's record ends
(after the target's end of turn comes the template's text). Step k weighs 0.8^k (EAGLE-3 paper,
SpecForge's ploss weights); each step's loss is a mean over its counted positions.

  * EAGLE-1/2 (EAGLE paper, SafeAILab/EAGLE train/main.py): SmoothL1(out, f_q) averaged over the
    hidden size + 0.1 * cross-entropy of the head's logits against the target's next-token
    distribution softmax(lm_head(f_q)) (both through the target's LM head).
  * EAGLE-3 (SpecForge OnlineEagle3Model): cross-entropy against the target's distribution at q
    restricted to the draft vocabulary and renormalised over it, softmax(logits_q[draft ids]);
    positions whose full-vocabulary target argmax is outside the draft vocabulary are ignored (the
    head could not propose that token; SpecForge's position_mask). The cross-entropy runs in row
    chunks from the LM head's inputs (chunked_ce.soft_cross_entropy), so no [positions, draft
    vocabulary] tensor is materialised: a full-vocabulary head fits in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from hotspec.models.draft_head import DraftHead
from hotspec.training.chunked_ce import soft_cross_entropy

STEP_DECAY = 0.8
EAGLE_CE_WEIGHT = 0.1


@dataclass
class TrainBatch:
    tokens: torch.Tensor  # [B, T] long, zero-padded
    feature: torch.Tensor  # [B, T, F] what the head reads at step 0
    lengths: torch.Tensor  # [B] long
    final: torch.Tensor | None = None  # [B, T, H] target's final normed hidden (EAGLE-3)
    argmax: torch.Tensor | None = None  # [B, T] target's full-vocabulary argmax (EAGLE-3)
    # Per TTT step k: flat indices b * T + j of the counted (index j, step k) pairs, planned on the
    # host (`counted_rows`) so that no loss term waits for the GPU to count its positions.
    rows: list[torch.Tensor] = field(default_factory=list)


@dataclass
class LossOut:
    loss: torch.Tensor  # weighted sum over steps, differentiable
    step_loss: torch.Tensor  # [K] detached, per step
    step_acc: torch.Tensor  # [K] head top-1 == target top-1 over counted positions
    counted: list[int]  # positions counted per step (before EAGLE-3's vocabulary filter)


def label_mask(lengths: torch.Tensor, mask: torch.Tensor, tail: torch.Tensor) -> torch.Tensor:
    """[B, T + 1] bool from the zero-padded per-token mask [B, T] (1: the target wrote the token)
    and `tail` [B] (the token after each record is a label): column p < L is mask[p], column L is
    tail, columns past L are 0."""
    b, t = mask.shape
    col = torch.arange(t + 1).view(1, -1)
    padded = torch.cat((mask.bool(), torch.zeros(b, 1, dtype=torch.bool)), dim=1)
    ends = lengths.view(-1, 1)
    return torch.where(col < ends, padded, (col == ends) & tail.view(-1, 1).bool())


def prompt_label_mask(lengths: torch.Tensor, n_prompt: torch.Tensor, t: int) -> torch.Tensor:
    """The labels of prompt + response records: token p is a label iff n_prompt <= p <= L."""
    col = torch.arange(t + 1).view(1, -1)
    return (col >= n_prompt.view(-1, 1)) & (col <= lengths.view(-1, 1))


def counted_rows(lengths: torch.Tensor, labels: torch.Tensor, t: int, steps: int) -> list[torch.Tensor]:
    """Host tensors in (`labels` [B, T + 1] from label_mask / prompt_label_mask), per step k the
    flat [B * T] indices of index j with a label (see the module docstring): q = j + k + 1 < L and
    labels[q + 1]."""
    b = lengths.shape[0]
    # labels[q + 1] for q = j + k + 1 up to T + steps: pad the columns past T with 0.
    padded = torch.zeros(b, t + steps + 2, dtype=torch.bool)
    padded[:, : labels.shape[1]] = labels.bool()
    q = torch.arange(t).view(1, -1) + 1
    return [((q + k < lengths.view(-1, 1)) & padded[:, q.view(-1) + k + 1]).view(-1).nonzero().view(-1)
            for k in range(steps)]


def eagle_loss(head: DraftHead, batch: TrainBatch,
               outs: list[tuple[torch.Tensor, torch.Tensor]]) -> LossOut:
    terms: list[torch.Tensor] = []
    losses: list[torch.Tensor] = []
    accs: list[torch.Tensor] = []
    counted: list[int] = []
    features = batch.feature.flatten(0, 1)
    for k, (hidden, _) in enumerate(outs):
        rows = batch.rows[k]
        h = hidden.flatten(0, 1)[rows]
        f_next = features[rows + k + 1]  # the target's feature at q = j + k + 1 (same record)
        with torch.no_grad():
            target_p = torch.softmax(head.compute_logits(f_next), dim=-1)
        logp = torch.log_softmax(head.compute_logits(h), dim=-1)
        vloss = F.smooth_l1_loss(h.float(), f_next.float(), reduction="none").mean(-1)
        ploss = -(target_p * logp).sum(-1)
        weight = torch.ones_like(vloss)
        hit = logp.argmax(-1) == target_p.argmax(-1)
        _collect(vloss + EAGLE_CE_WEIGHT * ploss, weight, hit, k, terms, losses, accs)
        counted.append(rows.numel())
    return LossOut(sum(terms), torch.stack(losses), torch.stack(accs), counted)  # type: ignore[arg-type]


def eagle3_loss(head: DraftHead, batch: TrainBatch, outs: list[tuple[torch.Tensor, torch.Tensor]],
                target_rows: torch.Tensor, t2d: torch.Tensor) -> LossOut:
    """`target_rows` [D, H]: the target LM head's rows of the draft vocabulary (draft order);
    `t2d` [V] bool: membership of the draft vocabulary. The head's logits are compute_logits',
    lm_head(hidden) (no bias), which soft_cross_entropy computes a chunk at a time from the
    hidden rows and lm_head.weight."""
    assert batch.final is not None and batch.argmax is not None, "EAGLE-3 batches carry final/argmax"
    finals, argmax = batch.final.flatten(0, 1), batch.argmax.flatten()
    weight = head.lm_head.weight
    terms: list[torch.Tensor] = []
    losses: list[torch.Tensor] = []
    accs: list[torch.Tensor] = []
    counted: list[int] = []
    for k, (hidden, _) in enumerate(outs):
        rows = batch.rows[k]
        nxt = rows + k + 1  # the label position q = j + k + 1 (same record)
        with torch.no_grad():
            final = finals[nxt]
            in_vocab = t2d[argmax[nxt]].float()  # 0: the head could not propose the target's token
        per_pos, hit = soft_cross_entropy(hidden.flatten(0, 1)[rows], weight, final, target_rows)
        _collect(per_pos, in_vocab, hit, k, terms, losses, accs)
        counted.append(rows.numel())
    return LossOut(sum(terms), torch.stack(losses), torch.stack(accs), counted)  # type: ignore[arg-type]


def _collect(per_pos: torch.Tensor, weight: torch.Tensor, hit: torch.Tensor, k: int,
             terms: list[torch.Tensor], losses: list[torch.Tensor], accs: list[torch.Tensor]) -> None:
    """Step k's loss: the mean of `per_pos` over the positions of weight 1, computed on the device
    (an empty step adds a zero that still depends on the graph); its accuracy: the same mean of
    `hit` (head top-1 == target top-1)."""
    n = weight.sum().clamp_min(1.0)
    loss = (per_pos * weight).sum() / n
    terms.append(STEP_DECAY ** k * loss)
    losses.append(loss.detach())
    with torch.no_grad():
        accs.append((hit.float() * weight).sum() / n)
