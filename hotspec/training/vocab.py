"""Draft vocabularies from the training data's token frequencies (FR-Spec ranking).

Counted tokens are the responses' (what the head learns to propose): the tokens past each
record's prompt, or those of the per-token mask (token shards: every token the target wrote). The ranking is
token_map_builder's: most frequent first, ties to the lower id, EOS / end-of-turn tokens forced in.
  * EAGLE-3: the head's own LM head has one row per kept id; `d2t[d] = id_d - d` (offsets, the
    public format: target id = draft id + d2t[draft id]) with ids ascending, as SpecForge writes
    them; `t2d` is the boolean membership mask over the target vocabulary.
  * EAGLE-1/2: the kept ids are written as an FR-Spec token map (most frequent first) for
    `--speculative-token-map`; the head itself keeps the target's full LM head.
  * `--token-maps N ...` (either arch): more FR-Spec maps, DIR/freq_<N>.pt, ranked the same way
    over the whole target vocabulary (the engine intersects an EAGLE-3 head's vocabulary with them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hotspec.speculative.token_map_builder import rank_ids
from hotspec.training.features import FeatureBlock
from hotspec.training.token_shards import TokenRecords


def response_token_counts(data: FeatureBlock | TokenRecords, vocab_size: int) -> np.ndarray:
    """Occurrences of each token id in the responses: the tokens of mask 1 (TokenRecords, or a
    FeatureBlock with a mask), else the positions past each record's prompt."""
    if isinstance(data, TokenRecords):
        return np.bincount(data.tokens[data.mask].astype(np.int64), minlength=vocab_size)[:vocab_size]
    if data.mask is not None:
        counts = torch.bincount(data.tokens[data.mask.to(data.tokens.device)], minlength=vocab_size)
        return counts[:vocab_size].cpu().numpy().astype(np.int64)
    pos = torch.arange(data.tokens.shape[0])
    rec = torch.bucketize(pos, data.offsets[1:], right=True)  # record of each position
    in_response = pos >= data.offsets[:-1][rec] + data.n_prompt[rec]
    counts = torch.bincount(data.tokens[in_response], minlength=vocab_size)[:vocab_size]
    return counts.numpy().astype(np.int64)


def ranked_ids(counts: np.ndarray, size: int, forced: list[int]) -> list[int]:
    """The `size` most frequent ids, most frequent first, `forced` ids always included."""
    if size < len(set(forced)):
        raise ValueError(f"a draft vocabulary of {size} cannot hold the {len(set(forced))} "
                         f"end-of-turn / EOS token(s) {sorted(set(forced))}")
    return rank_ids(counts, min(size, counts.shape[0]), list(dict.fromkeys(forced)))


def eagle3_vocab(ids: list[int], vocab_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(draft_to_target [D] ascending target ids, d2t offsets [D], t2d mask [V]) for kept `ids`."""
    draft_to_target = torch.tensor(sorted(ids), dtype=torch.long)
    d2t = draft_to_target - torch.arange(draft_to_target.shape[0])
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[draft_to_target] = True
    return draft_to_target, d2t, t2d


@dataclass
class DraftVocab:
    info: dict[str, Any]  # for the report
    draft_to_target: torch.Tensor | None = None  # EAGLE-3: [D] ascending target ids
    d2t: torch.Tensor | None = None  # EAGLE-3: [D] offsets
    t2d: torch.Tensor | None = None  # EAGLE-3: [V] bool
    token_map: Path | None = None  # EAGLE-1/2: the written FR-Spec map
    kept: list[int] = field(default_factory=list)


def choose_draft_vocab(algorithm: str, size: int | None, counts: np.ndarray, forced: list[int],
                       out_dir: Path) -> DraftVocab:
    """EAGLE-3: the head's vocabulary of `size` ids. EAGLE-1/2: with a size, write
    out_dir/freq_<size>.pt (FR-Spec map, torch.save of a list of int); without, nothing."""
    vocab_size = counts.shape[0]
    if size is None:
        return DraftVocab({"size": vocab_size, "kind": "target vocabulary"})
    kept = ranked_ids(counts, size, forced)
    total = int(counts.sum())
    coverage = float(counts[kept].sum()) / total if total else 0.0
    if algorithm == "EAGLE3":
        draft_to_target, d2t, t2d = eagle3_vocab(kept, vocab_size)
        return DraftVocab({"size": len(kept), "kind": "EAGLE-3 d2t", "coverage": coverage},
                          draft_to_target, d2t, t2d, kept=kept)
    token_map = _save_map(kept, out_dir, size)
    return DraftVocab({"size": len(kept), "kind": "FR-Spec token map", "file": token_map.name,
                       "coverage": coverage}, token_map=token_map, kept=kept)


def keep_draft_vocab(draft_to_target: torch.Tensor, counts: np.ndarray) -> DraftVocab:
    """An EAGLE-3 head's own vocabulary kept as it is, row order included (fine-tuning with
    --init), with its coverage of the counted tokens."""
    ids = draft_to_target.long().cpu()
    t2d = torch.zeros(counts.shape[0], dtype=torch.bool)
    t2d[ids] = True
    total = int(counts.sum())
    kept = ids.tolist()
    coverage = float(counts[kept].sum()) / total if total else 0.0
    return DraftVocab({"size": len(kept), "kind": "EAGLE-3 d2t of --init", "coverage": coverage},
                      ids, ids - torch.arange(ids.shape[0]), t2d, kept=kept)


def write_token_maps(sizes: tuple[int, ...], counts: np.ndarray, forced: list[int],
                     out_dir: Path) -> list[dict[str, Any]]:
    """out_dir/freq_<N>.pt for each N in `sizes` (most frequent first, `forced` ids included);
    returns, per map, its file, size and coverage of the counted tokens (for the report)."""
    total = int(counts.sum())
    maps = []
    for n in sizes:
        kept = ranked_ids(counts, n, forced)
        path = _save_map(kept, out_dir, n)
        maps.append({"file": path.name, "size": len(kept),
                     "coverage": float(counts[kept].sum()) / total if total else 0.0})
    return maps


def _save_map(kept: list[int], out_dir: Path, size: int) -> Path:
    """The public FR-Spec format: torch.save(list_of_int), most frequent first."""
    path = out_dir / f"freq_{size}.pt"
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.save([int(i) for i in kept], path)
    return path
