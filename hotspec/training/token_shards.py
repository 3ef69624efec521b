"""Self-distilled training data as token ids only: conversations the target answered, without
features (training recomputes those on the device from the ids, `train-draft --data`).

A folder DIR holds:
  tokens_NNNNN.npz   one shard: `tokens` (uint16 where the vocabulary fits, else uint32) of every
                     record back to back, `offsets` [R+1] int64, `mask` the packed bits
                     (np.packbits) of the per-token loss mask: 1 where the target wrote the token
                     (every assistant turn, its end-of-turn token included), 0 for the template,
                     the system turn and the user turns; written atomically (np.savez_compressed)
  manifest.json      the vocabulary size, and per shard its records, tokens and response tokens

27 M response tokens of a multi-turn corpus are about 40 MB compressed: small enough to travel
to a GPU machine and back, where features of the same size would take terabytes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MANIFEST = "manifest.json"


@dataclass
class TokenRecords:
    """Records stored flat: record r is tokens[offsets[r]:offsets[r + 1]], mask likewise."""

    tokens: np.ndarray  # [N] uint16 / uint32
    offsets: np.ndarray  # [R+1] int64
    mask: np.ndarray  # [N] bool: the target wrote this token (a loss label)

    @property
    def num_records(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    @property
    def response_tokens(self) -> int:
        return int(self.mask.sum())

    def record(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = int(self.offsets[r]), int(self.offsets[r + 1])
        return self.tokens[a:b], self.mask[a:b]

    @classmethod
    def build(cls, records: list[tuple[list[int], list[bool]]], vocab_size: int) -> TokenRecords:
        """From (ids, mask) pairs of equal lengths; ids must lie in [0, vocab_size)."""
        for ids, mask in records:
            if len(ids) != len(mask):
                raise ValueError(f"a record of {len(ids)} ids has a mask of {len(mask)}")
        lens = np.array([len(ids) for ids, _ in records], dtype=np.int64)
        flat = np.fromiter((t for ids, _ in records for t in ids), dtype=np.int64, count=int(lens.sum()))
        if flat.size and (flat.min() < 0 or flat.max() >= vocab_size):
            raise ValueError(f"token ids must lie in [0, {vocab_size}); got {flat.min()}..{flat.max()}")
        labels = np.fromiter((m for _, ms in records for m in ms), dtype=bool, count=flat.size)
        return cls(flat.astype(id_dtype(vocab_size)), np.concatenate(([0], np.cumsum(lens))), labels)

    @classmethod
    def concat(cls, parts: list[TokenRecords]) -> TokenRecords:
        if not parts:
            raise ValueError("no token records to concatenate")
        lens = np.concatenate([np.diff(p.offsets) for p in parts])
        dtype = np.result_type(*[p.tokens.dtype for p in parts])
        return cls(np.concatenate([p.tokens for p in parts]).astype(dtype),
                   np.concatenate(([0], np.cumsum(lens))), np.concatenate([p.mask for p in parts]))


def id_dtype(vocab_size: int) -> type[np.unsignedinteger[Any]]:
    return np.uint16 if vocab_size <= 1 << 16 else np.uint32


def shard_path(folder: Path, i: int) -> Path:
    return Path(folder) / f"tokens_{i:05d}.npz"


def save_shard(folder: Path, i: int, data: TokenRecords) -> Path:
    """Write shard i atomically (a crash leaves the old file or none, never half of one)."""
    path = shard_path(folder, i)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez_compressed(tmp, tokens=data.tokens, offsets=data.offsets,
                        mask=np.packbits(data.mask), n=np.int64(data.mask.size))
    os.replace(tmp, path)
    return path


def load_shard(path: Path) -> TokenRecords:
    with np.load(path) as z:
        n = int(z["n"])
        data = TokenRecords(z["tokens"], z["offsets"].astype(np.int64),
                            np.unpackbits(z["mask"], count=n).astype(bool))
    if data.tokens.size != n or int(data.offsets[-1]) != n:
        raise ValueError(f"{path}: a broken shard ({data.tokens.size} tokens, offsets end at "
                         f"{int(data.offsets[-1])}, mask of {n}); delete it and regenerate it")
    return data


def shard_indices(folder: Path) -> list[int]:
    return sorted(int(p.stem.split("_")[1]) for p in Path(folder).glob("tokens_[0-9]*.npz")
                  if ".tmp" not in p.name)


def load_records(folder: Path) -> TokenRecords:
    """Every shard of `folder`, in order."""
    idx = shard_indices(folder)
    if not idx:
        raise FileNotFoundError(f"no token shards (tokens_NNNNN.npz) in {folder}. Fix: build them "
                                "with `hotspec distill --out DIR`")
    return TokenRecords.concat([load_shard(shard_path(folder, i)) for i in idx])


def write_manifest(folder: Path, vocab_size: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Counts of every shard in `folder` (and `extra`, e.g. the sources), written atomically."""
    shards = []
    for i in shard_indices(folder):
        d = load_shard(shard_path(folder, i))
        shards.append({"index": i, "records": d.num_records, "tokens": d.num_tokens,
                       "response_tokens": d.response_tokens})
    manifest = {"vocab_size": vocab_size, "records": sum(s["records"] for s in shards),
                "tokens": sum(s["tokens"] for s in shards),
                "response_tokens": sum(s["response_tokens"] for s in shards),
                **(extra or {}), "shards": shards}
    tmp = Path(folder) / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, Path(folder) / MANIFEST)
    return manifest
