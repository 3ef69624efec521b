"""The training loop: AdamW, cosine schedule with linear warm-up, gradient clipping, bf16 autocast
on CUDA, a tqdm bar, and checkpoints that `--resume` continues from exactly.

Data order is a pure function of (seed, epoch): epoch e visits the batches
`epoch_batches(data, B, seed + e)` (random order, grouped by length), so optimizer step s is
batch s % steps_per_epoch of epoch s // steps_per_epoch. The data is a FeatureBlock (features
recorded beforehand) or a BatchSource that makes each batch itself (online.OnlineData: the
target's features computed per batch).

A checkpoint (DIR/checkpoints/last.pt, written atomically every `save_every` steps, at the end
and on halting) holds the step counter, the trainable weights (float32), AdamW's moments as
bfloat16 (half the optimizer's bytes), the scheduler state, the loss history and the meta that
--resume compares. Saving rounds the live moments to bfloat16 as well, so the state a checkpoint
restores is the state the uninterrupted run continues with: resuming from a checkpoint of the
`save_every` schedule replays nothing, skips nothing and ends with the same weights.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import torch
from torch import nn
from tqdm import tqdm

from hotspec.models.draft_head import DraftHead
from hotspec.training.config import TrainConfig, TrainConfigError
from hotspec.training.features import FeatureBlock
from hotspec.training.head_forward import unroll
from hotspec.training.head_init import trainable_parameters
from hotspec.training.losses import (
    LossOut,
    TrainBatch,
    counted_rows,
    eagle3_loss,
    eagle_loss,
    label_mask,
    prompt_label_mask,
)

CHECKPOINT = "last.pt"
MOMENTS = ("exp_avg", "exp_avg_sq")  # AdamW state stored as bfloat16


class BatchSource(Protocol):
    """Training data that makes its batches itself (online.OnlineData)."""

    @property
    def num_records(self) -> int: ...

    @property
    def offsets(self) -> torch.Tensor: ...  # [R+1] long, host

    def batch(self, records: list[int], device: torch.device, steps: int) -> TrainBatch: ...


@dataclass
class Throughput:
    """What this process trained: optimizer steps, label positions (TTT step 0's counted
    positions), record tokens (unpadded) and seconds from the first step to the last."""

    steps: int = 0
    label_positions: int = 0
    record_tokens: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        s = self.seconds
        return {"steps": self.steps, "label_positions": self.label_positions,
                "record_tokens": self.record_tokens, "wall_s": round(s, 3),
                "label_positions_per_s": round(self.label_positions / s, 1) if s else None,
                "record_tokens_per_s": round(self.record_tokens / s, 1) if s else None,
                "steps_per_s": round(self.steps / s, 4) if s else None}


@dataclass
class History:
    loss: list[float] = field(default_factory=list)  # weighted total per optimizer step
    step_loss: list[list[float]] = field(default_factory=list)  # per TTT step, per optimizer step
    step_acc: list[list[float]] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"loss": self.loss, "step_loss": self.step_loss, "step_acc": self.step_acc,
                "lr": self.lr}


@dataclass
class Vocab:
    """EAGLE-3's draft vocabulary as the loss needs it (None for EAGLE-1/2)."""

    target_rows: torch.Tensor  # [D, H] target LM head rows, draft order
    t2d: torch.Tensor  # [V] bool


class Trainer:
    def __init__(self, head: DraftHead, data: FeatureBlock | BatchSource, cfg: TrainConfig, ttt_steps: int,
                 vocab: Vocab | None, ckpt_dir: Path, meta: dict[str, Any]) -> None:
        self.head, self.data, self.cfg = head, data, cfg
        self.ttt_steps, self.vocab = ttt_steps, vocab
        self.device = cast(nn.Linear, head.fc).weight.device  # EAGLE and EAGLE-3 heads have an fc
        self.ckpt = ckpt_dir / CHECKPOINT
        self.meta = dict(meta, ttt_steps=ttt_steps, batch_size=cfg.batch_size, epochs=cfg.epochs,
                         records=data.num_records)
        self.params = trainable_parameters(head)
        self.steps_per_epoch = math.ceil(data.num_records / cfg.batch_size)
        self.total_steps = cfg.epochs * self.steps_per_epoch
        self.opt = torch.optim.AdamW(self.params.values(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                                     fused=self.device.type == "cuda")
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, cosine_with_warmup(self.total_steps, cfg.warmup_ratio))
        self.step = 0
        self.history = History()
        self.throughput = Throughput()
        self._batch_tokens = 0  # record tokens of the batch being trained
        self._epoch: tuple[int, list[list[int]]] | None = None  # (epoch, its batches)

    # -- checkpoints -----------------------------------------------------------------------
    def save(self) -> None:
        """Write the checkpoint atomically, the moments rounded to bfloat16 (in memory too)."""
        self.ckpt.parent.mkdir(parents=True, exist_ok=True)
        opt = self.opt.state_dict()
        with torch.no_grad():
            for st in self.opt.state.values():
                for k in MOMENTS:
                    if k in st:
                        st[k].copy_(st[k].to(torch.bfloat16))
        opt["state"] = {i: {k: v.to(torch.bfloat16).cpu() if k in MOMENTS else v.cpu()
                            for k, v in st.items()} for i, st in opt["state"].items()}
        state = {"step": self.step, "meta": self.meta,
                 "trainable": {n: p.detach().float().cpu() for n, p in self.params.items()},
                 "optimizer": opt, "scheduler": self.sched.state_dict(),
                 "history": self.history.as_dict()}
        tmp = self.ckpt.with_name(self.ckpt.name + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.ckpt)

    def load(self) -> bool:
        """Restore the last checkpoint if there is one; False if there is none."""
        if not self.ckpt.is_file():
            return False
        state = torch.load(self.ckpt, map_location="cpu", weights_only=True)
        self._check_meta(state["meta"])
        with torch.no_grad():
            for n, p in self.params.items():
                p.copy_(state["trainable"][n])
        opt = state["optimizer"]
        opt["state"] = {i: {k: v.float() if k in MOMENTS else v for k, v in st.items()}
                        for i, st in opt["state"].items()}
        self.opt.load_state_dict(opt)
        self.sched.load_state_dict(state["scheduler"])
        self.step = int(state["step"])
        self.history = History(**state["history"])
        return True

    def _check_meta(self, saved: dict[str, Any]) -> None:
        if saved == self.meta:
            return
        if saved.get("data") != self.meta.get("data"):
            raise TrainConfigError(
                f"--resume: the checkpoint {self.ckpt} was trained on other data ({saved.get('data')} "
                f"there, {self.meta.get('data')} now). Fix: resume with the same --data folder and "
                "--max-seq-len, or train into a new --out.")
        changed = sorted(k for k in set(saved) | set(self.meta) if saved.get(k) != self.meta.get(k))
        raise TrainConfigError(
            f"--resume: the checkpoint {self.ckpt} was made with other settings ({', '.join(changed)}: "
            f"{[saved.get(k) for k in changed]} there, {[self.meta.get(k) for k in changed]} "
            "now). Fix: resume with the original settings, or train into a new --out.")

    # -- the loop --------------------------------------------------------------------------
    def run(self) -> History:
        """Train until the last step (or `halt_after` steps, or `time_limit` seconds), saving
        checkpoints on the way and at a halt."""
        cfg = self.cfg
        bar = tqdm(total=self.total_steps, initial=self.step, desc="train", unit="step",
                   disable=not cfg.progress)
        t0 = time.perf_counter()
        while self.step < self.total_steps:
            lr = cast(float, self.sched.get_last_lr()[0])  # the rate this step uses
            batch = self.batch(self.step)
            out = self.train_step(batch)
            self.step += 1
            k = out.step_loss.numel()
            stats = torch.cat((out.loss.detach().view(1), out.step_loss, out.step_acc)).tolist()  # the sync
            tp = self.throughput
            tp.steps += 1
            tp.label_positions += out.counted[0]
            tp.record_tokens += self._batch_tokens
            tp.seconds = time.perf_counter() - t0
            self.history.loss.append(stats[0])
            self.history.step_loss.append(stats[1:1 + k])
            self.history.step_acc.append(stats[1 + k:])
            self.history.lr.append(lr)
            bar.update(1)
            bar.set_postfix(loss=f"{stats[0]:.4f}", acc0=f"{stats[1 + k]:.3f}")
            halting = ((cfg.halt_after is not None and self.step >= cfg.halt_after)
                       or (cfg.time_limit is not None and tp.seconds >= cfg.time_limit))
            if self.step % cfg.save_every == 0 or self.step == self.total_steps or halting:
                self.save()
            if halting:
                break
        bar.close()
        return self.history

    @property
    def finished(self) -> bool:
        return self.step >= self.total_steps

    def train_step(self, batch: TrainBatch) -> LossOut:
        self.head.train()
        # bf16 autocast on CUDA; on the CPU only when the frozen target weights are not float32
        # (the trainable weights are float32 master weights either way).
        frozen = self.head.embed_tokens.weight.dtype
        amp = self.device.type == "cuda" or frozen != torch.float32
        with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=amp):
            out = self.compute_loss(batch)
        self.opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params.values(), self.cfg.grad_clip)
        self.opt.step()
        self.sched.step()
        return out

    def compute_loss(self, batch: TrainBatch) -> LossOut:
        outs = unroll(self.head, batch.tokens, batch.feature, self.ttt_steps)
        if self.vocab is None:
            return eagle_loss(self.head, batch, outs)
        return eagle3_loss(self.head, batch, outs, self.vocab.target_rows, self.vocab.t2d)

    def batch(self, step: int) -> TrainBatch:
        epoch, i = divmod(step, self.steps_per_epoch)
        if self._epoch is None or self._epoch[0] != epoch:  # planned once per epoch
            self._epoch = (epoch, epoch_batches(self.data, self.cfg.batch_size, self.cfg.seed + epoch))
        records = self._epoch[1][i]
        offsets = self.data.offsets
        self._batch_tokens = sum(int(offsets[r + 1] - offsets[r]) for r in records)
        if isinstance(self.data, FeatureBlock):
            return make_batch(self.data, records, self.device, self.ttt_steps)
        return self.data.batch(records, self.device, self.ttt_steps)


GROUP_BATCHES = 32  # length grouping: batches are cut from runs of this many batches' records


def epoch_batches(data: FeatureBlock | BatchSource, batch_size: int, seed: int) -> list[list[int]]:
    """The batches of one epoch, a pure function of `seed`: records in random order, each run of
    GROUP_BATCHES * batch_size of them sorted by length and cut into batches, the batches shuffled.
    A batch is padded to its longest record and attention costs T^2, so grouping similar lengths
    saves most of the padding (as transformers' group_by_length); all but the last batch hold
    `batch_size` records."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(data.num_records, generator=g)
    lengths = torch.diff(data.offsets.cpu())
    run = GROUP_BATCHES * batch_size
    batches: list[list[int]] = []
    for start in range(0, len(order), run):
        chunk = order[start:start + run]
        ids = chunk[torch.argsort(lengths[chunk], descending=True, stable=True)].tolist()
        batches += [ids[j:j + batch_size] for j in range(0, len(ids), batch_size)]
    # The last (possibly short) batch stays last, so every other step sees `batch_size` records.
    full = batches[:-1] if len(batches[-1]) < batch_size else batches
    perm = torch.randperm(len(full), generator=g).tolist()
    return [full[j] for j in perm] + batches[len(full):]


def make_batch(data: FeatureBlock, records: list[int], device: torch.device, steps: int) -> TrainBatch:
    """Zero-padded [B, T] batch of the given records with the counted rows of `steps` TTT steps
    (labels from the block's mask and tail, or else from its n_prompt).
    Planned from the host's offsets, gathered where the per-token data lives (the GPU when the
    trainer put it there) and moved to `device`; nothing here waits for the GPU."""
    offsets = data.offsets.cpu()
    rec = torch.tensor(records, dtype=torch.long)
    starts = offsets[rec]
    lengths = offsets[rec + 1] - starts
    t = int(lengths.max())
    col = torch.arange(t)
    valid = col.view(1, -1) < lengths.view(-1, 1)  # [B, T]
    idx = torch.where(valid, starts.view(-1, 1) + col.view(1, -1), 0)
    where = data.tokens.device
    idx_d, valid_d = _h2d(idx, where), _h2d(valid, where)

    def rows(x: torch.Tensor | None) -> torch.Tensor | None:
        if x is None:
            return None
        m = valid_d.view(*valid.shape, *([1] * (x.dim() - 1)))  # [B, T] or [B, T, 1]
        return torch.where(m, x[idx_d], 0).to(device, non_blocking=True)

    final, argmax = (rows(data.final), rows(data.argmax)) if data.final is not None else (None, None)
    if data.mask is None or data.tail is None:
        labels = prompt_label_mask(lengths, data.n_prompt.cpu()[rec], t)
    else:
        mask = torch.where(valid, data.mask.cpu()[idx], False)
        labels = label_mask(lengths, mask, data.tail.cpu()[rec])
    counted = [_h2d(r, device) for r in counted_rows(lengths, labels, t, steps)]
    return TrainBatch(rows(data.tokens), rows(data.feature), _h2d(lengths, device),  # type: ignore[arg-type]
                      final, argmax, counted)


def _h2d(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`; to a GPU through pinned memory, so the copy is queued and the
    host runs on."""
    if device.type != "cuda" or x.is_cuda:
        return x.to(device)
    return x.pin_memory().to(device, non_blocking=True)


def cosine_with_warmup(total: int, warmup_ratio: float) -> Callable[[int], float]:
    """lr factor at step s: linear warm-up over round(ratio * total) steps, then cosine to 0."""
    warmup = round(warmup_ratio * total)

    def factor(s: int) -> float:
        if s < warmup:
            return (s + 1) / warmup
        progress = (s - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor
