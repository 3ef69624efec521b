"""Build an FR-Spec token map: count a corpus's target-token frequencies, keep the `size` most
frequent ids (plus the tokens that end a turn, which the draft must always be able to propose).

Corpus files are read by speculative/corpus.py (streamed, never read whole): `.jsonl` and `.json`
(ShareGPT, truncated arrays included) records count their `text` and every turn; anything else is
plain UTF-8 text, tokenized in paragraph-aligned chunks. Records or lines that cannot be decoded,
or hold no text, are counted in `skipped`.

The map is written in the public format `load_token_map` reads: `torch.save(list_of_int)`, most
frequent first, with a JSON sidecar (`<out>.json`) describing how it was made.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tqdm import tqdm

from hotspec.speculative.corpus import iter_texts

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Texts are tokenized in batches of about this many characters (the fast tokenizer parallelises
# across a batch).
_BATCH_CHARS = 1 << 20
# Assistant reply used to find the chat template's end-of-turn tokens; unlikely to occur in it.
_PROBE_REPLY = "hotspec probe reply"


@dataclass(frozen=True)
class TokenMapResult:
    ids: list[int]  # the map, most frequent first; unique ids < vocab size
    tokens_counted: int  # corpus tokens seen, including any outside the vocabulary
    coverage: float  # fraction of counted tokens whose id is in `ids`
    forced: list[int]  # ids required in the map (EOS, end-of-turn), all present in `ids`
    skipped: int  # records or lines that were undecodable or held no text


def build_token_map(
    tokenizer: PreTrainedTokenizerBase,
    corpus_files: list[Path],
    size: int,
    progress: bool = True,
    vocab_size: int | None = None,
) -> TokenMapResult:
    """Count token frequencies over `corpus_files` and keep the `size` most frequent ids (ties:
    lower id first), with EOS and the end-of-turn tokens replacing the least frequent ones.

    `vocab_size` defaults to len(tokenizer); pass the model's vocabulary size when it differs.
    A vocabulary smaller than `size` gives a map of the whole vocabulary, ranked.
    """
    return build_token_maps(tokenizer, corpus_files, [size], progress, vocab_size)[0]


def build_token_maps(
    tokenizer: PreTrainedTokenizerBase,
    corpus_files: list[Path],
    sizes: list[int],
    progress: bool = True,
    vocab_size: int | None = None,
) -> list[TokenMapResult]:
    """build_token_map for each of `sizes`, counting the corpus once."""
    vocab = len(tokenizer) if vocab_size is None else vocab_size
    files = [Path(f) for f in corpus_files]
    if not files:
        raise ValueError("no corpus files given")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"corpus file(s) not found: {', '.join(missing)}")
    forced = end_of_turn_ids(tokenizer, vocab)
    keeps = [map_size(size, vocab, forced) for size in sizes]

    counts = np.zeros(vocab, dtype=np.int64)
    out_of_vocab = 0
    skipped = 0
    total_bytes = sum(f.stat().st_size for f in files)
    with tqdm(total=total_bytes, unit="B", unit_scale=True, desc="token-map",
              disable=not progress) as bar:
        batch: list[str] = []
        batch_chars = 0
        for f in files:
            for text in iter_texts(f, bar.update):
                if text is None:
                    skipped += 1
                    continue
                batch.append(text)
                batch_chars += len(text)
                if batch_chars >= _BATCH_CHARS:
                    out_of_vocab += _count(tokenizer, batch, counts)
                    batch, batch_chars = [], 0
                    bar.set_postfix(tokens=f"{int(counts.sum()) + out_of_vocab:,}")
        out_of_vocab += _count(tokenizer, batch, counts)

    tokens_counted = int(counts.sum()) + out_of_vocab
    if tokens_counted == 0:
        raise ValueError(f"the corpus ({', '.join(map(str, files))}) holds no text to count")
    return [map_result(counts, tokens_counted, n_keep, forced, skipped) for n_keep in keeps]


def map_size(size: int, vocab: int, forced: list[int]) -> int:
    """Ids the map keeps: `size`, at most the vocabulary, at least room for the forced ids."""
    n_keep = min(size, vocab)
    if n_keep < max(1, len(forced)):
        raise ValueError(f"map size {size} is too small: it must hold at least the {len(forced)} "
                         f"end-of-turn token(s) {forced}")
    return n_keep


def map_result(counts: np.ndarray, tokens_counted: int, n_keep: int, forced: list[int],
            skipped: int) -> TokenMapResult:
    ids = rank_ids(counts, n_keep, forced)
    coverage = float(counts[ids].sum()) / tokens_counted
    return TokenMapResult(ids=ids, tokens_counted=tokens_counted, coverage=coverage,
                          forced=forced, skipped=skipped)


def end_of_turn_ids(tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> list[int]:
    """EOS plus the special tokens the chat template puts right after an assistant reply
    (`<|im_end|>` for SmolLM2, `<|eot_id|>` for Llama 3), in that order, without repeats."""
    ids: list[int] = []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    special = set(tokenizer.all_special_ids)
    special.update(i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if t.special)
    try:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": _PROBE_REPLY}],
            tokenize=False)
    except Exception:  # best-effort probe: no template, or one that rejects this conversation
        rendered = None
    if isinstance(rendered, str) and _PROBE_REPLY in rendered:
        tail = rendered[rendered.rindex(_PROBE_REPLY) + len(_PROBE_REPLY):]
        ids.extend(t for t in tokenizer.encode(tail, add_special_tokens=False) if t in special)
    return [i for i in dict.fromkeys(ids) if 0 <= i < vocab_size]


def save_token_map(
    result: TokenMapResult, out_path: str | os.PathLike, model: str, corpus_files: Iterable[Path]
) -> Path:
    """Write the map as `torch.save(list_of_int)` and a JSON sidecar `<out_path>.json`; returns
    the sidecar's path."""
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save([int(i) for i in result.ids], out)
    meta: dict[str, Any] = {
        "format": "FR-Spec token map: torch.save(list of int), most frequent first",
        "model": model,
        "corpus_files": [str(f) for f in corpus_files],
        "size": len(result.ids),
        **{k: v for k, v in asdict(result).items() if k != "ids"},
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    sidecar = out.with_name(out.name + ".json")
    sidecar.write_text(json.dumps(meta, indent=2) + "\n")
    return sidecar


def rank_ids(counts: np.ndarray, n_keep: int, forced: list[int]) -> list[int]:
    """The `n_keep` most frequent ids (the FR-Spec ranking), with every id of `forced` kept: they
    replace the least frequent ones. Most frequent first."""
    # Stable sort on -count: equal counts keep id order, so ties go to the lower id.
    order = np.argsort(-counts, kind="stable")
    top = order[:n_keep].tolist()
    in_top = set(top)
    add = [f for f in forced if f not in in_top]
    if add:
        # Drop the least frequent non-forced ids; the forced ones ranked below them all, so
        # appending them (in rank order) keeps the list sorted by frequency.
        keep_forced = set(forced)
        least_frequent = [i for i in reversed(top) if i not in keep_forced][: len(add)]
        drop = set(least_frequent)
        top = [i for i in top if i not in drop]
        top += sorted(add, key=lambda i: (-counts[i], i))
    return top


def _count(tokenizer: PreTrainedTokenizerBase, texts: list[str], counts: np.ndarray) -> int:
    """Add the texts' token counts into `counts`; returns how many ids fell outside it."""
    if not texts:
        return 0
    enc = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
    arrays = [np.asarray(x, dtype=np.int64) for x in enc if len(x)]
    if not arrays:
        return 0
    ids = np.concatenate(arrays)
    inside = ids < counts.shape[0]
    counts += np.bincount(ids[inside], minlength=counts.shape[0])
    return int((~inside).sum())
