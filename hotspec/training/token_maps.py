"""FR-Spec token maps from distilled token shards (`hotspec token-map --data`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hotspec.speculative.token_map_builder import (
    TokenMapResult,
    end_of_turn_ids,
    map_result,
    map_size,
)
from hotspec.training.token_shards import load_records

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def build_token_maps_from_shards(tokenizer: PreTrainedTokenizerBase, folder: Path, sizes: list[int],
                                 vocab_size: int | None = None) -> list[TokenMapResult]:
    """The maps of the target's own tokens in `hotspec distill`'s token shards (the response
    tokens: what the draft has to propose), one per size, ranked as build_token_map ranks a
    corpus's."""
    vocab = len(tokenizer) if vocab_size is None else vocab_size
    data = load_records(Path(folder))
    forced = end_of_turn_ids(tokenizer, vocab)
    keeps = [map_size(size, vocab, forced) for size in sizes]
    ids = data.tokens[data.mask].astype(np.int64)
    if ids.size == 0:
        raise ValueError(f"the token shards of {folder} hold no response tokens to count")
    if int(ids.max()) >= vocab:
        raise ValueError(f"the token shards of {folder} hold id {int(ids.max())}, outside this "
                         f"model's vocabulary of {vocab}: they were made for another model")
    counts = np.bincount(ids, minlength=vocab)
    return [map_result(counts, int(ids.size), n_keep, forced, 0) for n_keep in keeps]
