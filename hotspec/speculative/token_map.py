"""FR-Spec token maps: a ranked list of "hot" target token ids that the draft LM head keeps.

Public format (the FR-Spec repository, SGLang's --speculative-token-map): `torch.save(list_of_int)`
or a 1-D integer tensor, most frequent first. Loaded with `weights_only=True`, so a pickle that
names any other class is refused without running it.

Applying a map replaces the draft head's LM head with `lm_head.weight[rows]`; its row count
becomes the draft vocabulary everything downstream is sized from, and `draft_to_target` the one
mapping from a draft index back to a target id. Verification always uses the full target vocab.
  * EAGLE-1/2 heads share the target's LM head: rows = hot ids.
  * EAGLE-3 heads with their own (d2t) vocabulary: the draft vocabulary becomes the intersection
    of the head's vocabulary and the hot set, in the head's own order (rows of the head's LM head
    whose target id is hot). An empty intersection is refused.
"""

from __future__ import annotations

import os
import pickle

import torch

from hotspec.errors import ModelLoadError
from hotspec.models.draft_head import DraftHead
from hotspec.models.llama import LlamaForCausalLM


def load_token_map(path: str | os.PathLike, vocab_size: int) -> torch.Tensor:
    """Load and validate a token map: unique integer ids in [0, vocab_size), as a 1-D LongTensor."""
    if not os.path.isfile(path):
        raise ModelLoadError(f"token map {path} does not exist; pass the .pt file written by "
                             "`hotspec token-map` or published with FR-Spec (e.g. freq_32768.pt)")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as e:
        raise ModelLoadError(
            f"token map {path} is not a plain list or tensor of token ids ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:200]}); it must be torch.save(list_of_int) or a 1-D int "
            "tensor. Objects of other classes are refused without being run.") from None
    if isinstance(obj, torch.Tensor):
        if obj.dim() != 1 or obj.dtype.is_floating_point or obj.dtype == torch.bool:
            raise ModelLoadError(f"token map {path}: expected a 1-D integer tensor, got "
                                 f"{obj.dtype} of shape {tuple(obj.shape)}")
        ids = obj.long()
    elif isinstance(obj, (list, tuple)):
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in obj):
            bad = next(t for t in obj if not isinstance(t, int) or isinstance(t, bool))
            raise ModelLoadError(f"token map {path}: every entry must be an int token id, found "
                                 f"{bad!r} ({type(bad).__name__})")
        ids = torch.tensor(list(obj), dtype=torch.long)
    else:
        raise ModelLoadError(f"token map {path} holds a {type(obj).__name__}; expected a list of "
                             "token ids or a 1-D integer tensor")
    return check_token_ids(ids, vocab_size, f"token map {path}")


def check_token_ids(ids: torch.Tensor, vocab_size: int, what: str) -> torch.Tensor:
    """`ids` (1-D LongTensor) if it is a non-empty set of ids in [0, vocab_size); `what` names it
    in the error."""
    if ids.numel() == 0:
        raise ModelLoadError(f"{what} is empty")
    out = ids[(ids < 0) | (ids >= vocab_size)]
    if out.numel():
        raise ModelLoadError(f"{what} has ids outside the target vocabulary "
                             f"[0, {vocab_size}): {out[:5].tolist()}; was it built for another model?")
    if torch.unique(ids).numel() != ids.numel():
        raise ModelLoadError(f"{what} repeats token ids; each id must appear once")
    return ids


def apply_token_map(head: DraftHead, target: LlamaForCausalLM, hot_ids: torch.Tensor) -> None:
    """Shrink the draft LM head to the hot tokens (see the module docstring for EAGLE-3)."""
    dev = head.lm_head.weight.device
    hot_ids = hot_ids.to(dev)
    if head.draft_to_target is None and head.lm_head.weight.data_ptr() == target.lm_head.weight.data_ptr():
        head.set_lm_head(target.lm_head.weight[hot_ids], hot_ids)
        return
    vocab = (head.draft_to_target if head.draft_to_target is not None
             else torch.arange(head.draft_vocab_size, device=dev))
    rows = torch.isin(vocab, hot_ids).nonzero().squeeze(1)
    if rows.numel() == 0:
        raise ModelLoadError("the token map shares no token with the EAGLE-3 head's draft "
                             "vocabulary (d2t); use a map built for this model, or none")
    head.set_lm_head(head.lm_head.weight[rows], vocab[rows])
