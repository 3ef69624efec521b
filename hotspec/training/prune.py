"""Prune an EAGLE-3 head to an FR-Spec hot vocabulary, offline (`hotspec prune-draft`).

The pruned head's draft vocabulary is SRC's draft vocabulary intersected with the map's ids, kept
in SRC's own row order: exactly the rows `apply_token_map` keeps when SRC runs with
`--speculative-token-map`. The pruned head therefore computes the same draft logits in the same
order (same top-k, same ties) as SRC with that map, so every proposal, acceptance and output token
is identical; only its LM head is smaller, on disk and in memory.

Written in the public format: config.json (draft_vocab_size updated, hot_vocab_size dropped: the
map is now built in) and model.safetensors with lm_head.weight restricted to the kept rows, d2t
(offsets: target id = draft id + d2t[draft id]) and t2d (membership mask over the target
vocabulary) rebuilt. Every other tensor is copied bit for bit, in its stored dtype.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hotspec.errors import ModelLoadError
from hotspec.models.draft_checkpoint import save_draft_checkpoint
from hotspec.models.draft_loader import draft_folder, read_draft_tensors, read_json_object
from hotspec.speculative.token_map import check_token_ids, load_token_map

# Weight files the loader would read before (or instead of) the model.safetensors written here.
_SHADOWING = ("model.safetensors.index.json", "pytorch_model.bin.index.json", "pytorch_model.bin")


@dataclass(frozen=True)
class PruneResult:
    out_dir: Path
    source_vocab: int  # SRC's draft vocabulary size
    map_size: int  # ids in the token map
    draft_vocab: int  # the pruned head's draft vocabulary (the intersection)


def prune_eagle3_head(src_dir: str | os.PathLike, token_map: str | os.PathLike | Sequence[int],
                      out_dir: str | os.PathLike) -> PruneResult:
    """Write to `out_dir` the EAGLE-3 head of `src_dir` restricted to the ids of `token_map` (a
    .pt file in the FR-Spec format, or the ids themselves); see the module docstring."""
    src = draft_folder(src_dir)
    out = Path(out_dir)
    _check_out(src, out)
    config = read_json_object(src / "config.json")
    state = read_draft_tensors(src, None)
    if not any(k.startswith("midlayer.") for k in state):
        kind = ("an EAGLE-1/2 head (keys layers.0.*)" if any(k.startswith("layers.0.") for k in state)
                else "not an EAGLE draft head")
        raise ModelLoadError(
            f"{src} is {kind}; only EAGLE-3 heads (keys midlayer.*) have a draft vocabulary of "
            "their own to prune. Fix: for EAGLE-1/2 heads pass the map at run time with "
            "--speculative-token-map.")
    vocab_size = _target_vocab(config, state, src)
    hot = _hot_ids(token_map, vocab_size)
    lm_head = state.get("lm_head.weight")
    if lm_head is None:
        raise ModelLoadError(
            f"{src} has no lm_head.weight: this EAGLE-3 head drafts with the target's LM head, "
            "which is not in the folder. Fix: pass the map at run time with --speculative-token-map.")
    draft_to_target = _draft_to_target(state, lm_head.shape[0], vocab_size, src)
    rows = torch.isin(draft_to_target, hot).nonzero().squeeze(1)
    if rows.numel() == 0:
        raise ModelLoadError(
            f"the token map shares no token with the draft vocabulary of {src} "
            f"({draft_to_target.numel()} ids). Fix: use a map built for this head's target model.")
    kept = draft_to_target[rows]
    d2t_dtype = state["d2t"].dtype if "d2t" in state else torch.long
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[kept] = True
    state["lm_head.weight"] = lm_head[rows]
    state["d2t"] = (kept - torch.arange(kept.numel())).to(d2t_dtype)
    state["t2d"] = t2d
    new_config: dict[str, Any] = {k: v for k, v in config.items() if k != "hot_vocab_size"}
    new_config["draft_vocab_size"] = int(kept.numel())
    save_draft_checkpoint(state, new_config, out)
    return PruneResult(out, int(draft_to_target.numel()), int(hot.numel()), int(kept.numel()))


def _check_out(src: Path, out: Path) -> None:
    if out.exists() and out.resolve() == src.resolve():
        raise ModelLoadError(f"--out {out} is the source folder. Fix: write the pruned head elsewhere.")
    stale = [name for name in _SHADOWING if (out / name).exists()]
    if stale:
        raise ModelLoadError(f"{out} already holds {', '.join(stale)}, which a loader would read "
                             "instead of the pruned model.safetensors. Fix: choose an empty --out.")


def _target_vocab(config: dict[str, Any], state: dict[str, torch.Tensor], src: Path) -> int:
    """The target vocabulary size: config.json's vocab_size, else the length of t2d."""
    n = config.get("vocab_size")
    if isinstance(n, int) and n > 0:
        return n
    if "t2d" in state:
        return int(state["t2d"].numel())
    raise ModelLoadError(f"{src}/config.json names no vocab_size and the head has no t2d, so the "
                         "target vocabulary is unknown. Fix: restore the head's original config.json.")


def _hot_ids(token_map: str | os.PathLike | Sequence[int], vocab_size: int) -> torch.Tensor:
    if isinstance(token_map, (str, os.PathLike)):
        return load_token_map(token_map, vocab_size)
    return check_token_ids(torch.as_tensor(list(token_map), dtype=torch.long), vocab_size, "the token ids")


def _draft_to_target(state: dict[str, torch.Tensor], rows: int, vocab_size: int,
                     src: Path) -> torch.Tensor:
    """Target id of each LM-head row: row + d2t[row], or the row itself without d2t."""
    d2t = state.get("d2t")
    if d2t is None:
        if rows != vocab_size:
            raise ModelLoadError(f"{src}: lm_head.weight has {rows} rows but no d2t maps them to "
                                 f"the {vocab_size} target ids. Fix: restore d2t from the original head.")
        return torch.arange(rows)
    if d2t.shape != (rows,) or d2t.is_floating_point() or d2t.dtype == torch.bool:
        raise ModelLoadError(f"{src}: d2t must be integer offsets of shape ({rows},), got {d2t.dtype} "
                             f"{tuple(d2t.shape)}. Fix: restore d2t from the original head.")
    ids = torch.arange(rows) + d2t.long()
    if bool(((ids < 0) | (ids >= vocab_size)).any()):
        raise ModelLoadError(f"{src}: d2t maps draft ids outside the target vocabulary [0, {vocab_size}). "
                             "Fix: restore d2t from the original head.")
    return ids
