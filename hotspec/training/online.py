"""`train-draft --data DIR`: training on token shards (token_shards.py) with the target's features
computed per batch, on the device, right before the head's step.

  * The records are cut to the length cap; a cut record keeps, as its `tail`, whether the token
    after the cut is one the target wrote (the target's distribution at the last kept position is
    then a label); records without any label are dropped (losses.label_mask).
  * Evaluation prompts: the prompts of `--eval-prompts-file`, or else the last `--eval-prompts`
    records are held back from training and each is evaluated on its prefix up to its first
    target-written token (the system and first user turn, the assistant's header).
  * OnlineData.batch runs the batch's records through the engine's own prefill path
    (features.target_pass, as the recorded-feature mode does), so the features are bit-for-bit
    what inference feeds the head, then builds the batch as trainer.make_batch does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hotspec.engine.engine import Engine
from hotspec.training.config import TrainConfig, TrainConfigError
from hotspec.training.features import FeatureBlock, target_pass
from hotspec.training.losses import TrainBatch
from hotspec.training.prompt_files import read_prompts
from hotspec.training.prompts import Prompt, prompts_from_texts
from hotspec.training.token_shards import TokenRecords, load_records
from hotspec.training.trainer import make_batch


@dataclass
class LabelledRecords:
    """Token records cut to the length cap, every one with a label."""

    records: TokenRecords
    tail: np.ndarray  # [R] bool: the token after the (cut) record is one the target wrote

    @property
    def num_records(self) -> int:
        return self.records.num_records

    def select(self, idx: list[int]) -> LabelledRecords:
        parts = [self.records.record(r) for r in idx]
        lens = np.array([len(t) for t, _ in parts], dtype=np.int64)
        tokens = np.concatenate([t for t, _ in parts]) if parts else self.records.tokens[:0]
        mask = np.concatenate([m for _, m in parts]) if parts else self.records.mask[:0]
        return LabelledRecords(TokenRecords(tokens, np.concatenate(([0], np.cumsum(lens))), mask),
                               self.tail[idx])


def data_counts(data: TokenRecords) -> dict[str, int]:
    """The counts of a token-shard folder, as its manifest.json states them."""
    return {"records": data.num_records, "tokens": data.num_tokens,
            "response_tokens": data.response_tokens}


def read_token_data(folder: Path) -> TokenRecords:
    """Every shard of `folder`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"--data {folder}: no such folder. Fix: pass the folder "
                                "`hotspec distill --out DIR` wrote")
    return load_records(folder)


def check_token_ids(data: TokenRecords, vocab_size: int, folder: Path) -> None:
    """Every id lies in the target's vocabulary."""
    if data.tokens.size and int(data.tokens.max()) >= vocab_size:
        raise TrainConfigError(f"--data {folder}: token id {int(data.tokens.max())} is outside the "
                               f"target's vocabulary ({vocab_size} tokens): the shards were made "
                               "for another model. Fix: pass the target that wrote them (--model)")


def answer_prefix_mask(mask: np.ndarray, max_answer: int) -> np.ndarray:
    """`mask` with each run of labels (one answer) kept to its first `max_answer` tokens."""
    m = mask.astype(np.int64)
    count = np.cumsum(m)
    before_run = np.maximum.accumulate(np.where(m == 0, count, 0))  # labels before this run
    return mask & (count - before_run <= max_answer)


def cut_records(data: TokenRecords, max_len: int, max_answer: int | None = None
                ) -> tuple[LabelledRecords, dict[str, int]]:
    """Records cut to `max_len` tokens, those without a label dropped; and the counts of both.
    With `max_answer`, only each answer's first `max_answer` tokens are labels and a record ends
    after its last one."""
    keep: list[int] = []
    lens: list[int] = []
    tails: list[bool] = []
    masks: list[np.ndarray] = []
    cut = 0
    for r in range(data.num_records):
        _, mask = data.record(r)
        if max_answer is not None:
            mask = answer_prefix_mask(mask, max_answer)
            last = int(np.flatnonzero(mask)[-1]) + 1 if mask.any() else len(mask)
            mask = mask[:last]
        n = min(len(mask), max_len)
        tail = bool(n < len(mask) and mask[n])
        cut += n < len(mask)
        # Labels are tokens 2..n (q = j + k + 1 >= 1 predicts token q + 1), the tail standing for n.
        if n >= 2 and (tail or bool(mask[2:n].any())):
            keep.append(r)
            lens.append(n)
            tails.append(tail)
            masks.append(mask[:n])
    starts = data.offsets[keep]
    idx = (np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lens)]) if keep
           else np.zeros(0, dtype=np.int64))
    out = TokenRecords(data.tokens[idx], np.concatenate(([0], np.cumsum(lens))).astype(np.int64),
                       np.concatenate(masks) if masks else data.mask[:0])
    stats = {"cut": int(cut), "dropped_without_label": data.num_records - len(keep)}
    return LabelledRecords(out, np.array(tails, dtype=bool)), stats


def eval_prefix(tokens: np.ndarray, mask: np.ndarray) -> list[int]:
    """A record's ids up to its first target-written token (empty when it starts with one)."""
    first = int(np.argmax(mask)) if mask.any() else len(mask)
    return [int(t) for t in tokens[:first]]


@dataclass
class OnlineSplit:
    train: LabelledRecords
    eval: list[Prompt]
    eval_from: str  # "eval-prompts-file" or "held-back records"
    stats: dict[str, Any]  # for the report and the checkpoint's meta


def split_data(cfg: TrainConfig, data: TokenRecords, max_len: int, tokenizer: Any) -> OnlineSplit:
    """Cut the records, then take the evaluation prompts (see the module docstring)."""
    records, stats = cut_records(data, max_len, cfg.max_answer_tokens)
    if records.num_records == 0:
        raise TrainConfigError(f"--data {cfg.data}: no record has a token the target wrote within "
                               f"the first {max_len} tokens; nothing to train on")
    if cfg.eval_prompts_file is not None:
        if tokenizer is None:
            raise TrainConfigError("--eval-prompts-file needs the target's tokenizer; this target "
                                   "has none")
        texts = read_prompts([cfg.eval_prompts_file], cfg.eval_prompts)
        prompts = [p for p in prompts_from_texts(tokenizer, texts) if 0 < len(p.ids) < max_len]
        train, eval_from = records, "eval-prompts-file"
    else:
        n_eval = min(cfg.eval_prompts, records.num_records // 2)
        cut_at = records.num_records - n_eval
        held = [records.records.record(r) for r in range(cut_at, records.num_records)]
        prompts = [Prompt(None, ids) for ids in (eval_prefix(t, m) for t, m in held)
                   if 0 < len(ids) < max_len]
        train, eval_from = records.select(list(range(cut_at))), "held-back records"
    stats = {**stats, "train_records": train.num_records, "train_tokens": train.records.num_tokens,
             "train_labels": train.records.response_tokens, "eval_prompts": len(prompts)}
    return OnlineSplit(train, prompts, eval_from, stats)


class OnlineData:
    """trainer.BatchSource over token records: each batch's features from the target, on the
    engine's device, when the trainer asks for the batch."""

    def __init__(self, engine: Engine, data: LabelledRecords, aux_layer_ids: tuple[int, ...],
                 token_budget: int) -> None:
        self.engine, self.aux, self.budget = engine, tuple(aux_layer_ids), token_budget
        self.tokens = torch.from_numpy(data.records.tokens.astype(np.int64))
        self.mask = torch.from_numpy(data.records.mask)
        self.tail = torch.from_numpy(data.tail)
        self._offsets = torch.from_numpy(data.records.offsets.astype(np.int64))

    @property
    def num_records(self) -> int:
        return self._offsets.shape[0] - 1

    @property
    def offsets(self) -> torch.Tensor:
        return self._offsets

    def block(self, records: list[int]) -> FeatureBlock:
        """The records' FeatureBlock: tokens and features on the engine's device, in its dtype
        (float32 on the CPU, where training runs without autocast), labels on the host."""
        spans = [(int(self._offsets[r]), int(self._offsets[r + 1])) for r in records]
        ids = [self.tokens[a:b] for a, b in spans]
        feature, final, argmax = target_pass(self.engine, [t.tolist() for t in ids], self.aux,
                                             self.budget, self.engine.device)
        if self.engine.device.type == "cpu":
            feature = feature.float()
            final = None if final is None else final.float()
        lens = torch.tensor([b - a for a, b in spans], dtype=torch.long)
        return FeatureBlock(
            tokens=torch.cat(ids).to(self.engine.device),
            offsets=torch.cat((torch.zeros(1, dtype=torch.long), lens.cumsum(0))),
            n_prompt=torch.zeros(len(records), dtype=torch.long),  # unused: the mask says
            feature=feature, final=final, argmax=argmax,
            mask=torch.cat([self.mask[a:b] for a, b in spans]), tail=self.tail[records])

    def batch(self, records: list[int], device: torch.device, steps: int) -> TrainBatch:
        return make_batch(self.block(records), list(range(len(records))), device, steps)
