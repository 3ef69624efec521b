"""Batched, graph-capturable sampling: counter-based RNG, logit shaping, exponential race.

Every function here is pure tensor maths on the input device: no host syncs, no per-row Python,
no `torch.Generator`, so a step that samples can be captured in a CUDA graph and replayed. Each
row carries its own seed and offset (tokens generated so far), so a request's random stream is
the same whatever batch it runs in, and identical on CPU and CUDA.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hotspec.layers.argmax import argmax
from hotspec.sampling_params import SamplingParams

_U64 = 1 << 64


def _i64(value: int) -> int:
    """A Python int as the signed int64 with the same low 64 bits."""
    value %= _U64
    return value - _U64 if value >= 1 << 63 else value


# splitmix64 constants (Steele, Lea & Flood 2014), as signed int64 bit patterns.
_GOLDEN = _i64(0x9E3779B97F4A7C15)
_MIX1 = _i64(0xBF58476D1CE4E5B9)
_MIX2 = _i64(0x94D049BB133111EB)
# Temperatures below this are clamped when shaping (a row with exactly 0 is greedy instead).
_MIN_TEMPERATURE = 1e-5


def _srl(x: torch.Tensor, shift: int) -> torch.Tensor:
    # `>>` on int64 is arithmetic; masking off the sign-extended bits makes it logical.
    return (x >> shift) & ((1 << (64 - shift)) - 1)


def _mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser, a bijection on 64-bit words (int64 `*` wraps mod 2^64)."""
    x = (x ^ _srl(x, 30)) * _MIX1
    x = (x ^ _srl(x, 27)) * _MIX2
    return x ^ _srl(x, 31)


def _mix64_int(x: int) -> int:
    """`_mix64` on a Python int, for constants folded on the host."""
    x %= _U64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % _U64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % _U64
    return _i64(x ^ (x >> 31))


def random_uniform(seeds: torch.Tensor, offsets: torch.Tensor, n: int, stream: int = 0) -> torch.Tensor:
    """Float32 [R, n] uniforms in (0, 1), a pure function of (seed, offset, column, stream).

    Row key k = mix(mix(mix(seed) ^ mix(stream)) ^ offset): each mix is a bijection, so for one
    seed and stream distinct offsets give distinct keys. Column j is the j-th splitmix64 output
    from state k, mix(k + (j + 1) * golden). Its top 23 bits m give u = (m + 1/2) / 2^23, exact in
    float32 and never 0 or 1.
    """
    key = _mix64(_mix64(seeds.long()) ^ _mix64_int(stream))
    key = _mix64(key ^ offsets.long())
    cols = torch.arange(1, n + 1, device=seeds.device, dtype=torch.long) * _GOLDEN
    bits = _srl(_mix64(key[:, None] + cols), 41)
    return (bits.float() + 0.5) * (1.0 / (1 << 23))


def shape_logits_to_probs(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor,
    min_p: torch.Tensor,
) -> torch.Tensor:
    """Temperature, then top-k, top-p, min-p (Hugging Face's order): float32 probs [R, V].

    One stable descending sort: ties keep vocabulary order, so the top token is argmax(logits).
    In sorted order every filter keeps a prefix:
      top-k: rank < k (k <= 0 means all);
      top-p: mass strictly before the rank < top_p, the smallest prefix with mass >= top_p; the
             top token always survives because its preceding mass is 0 < top_p;
      min-p: p >= min_p * p_max, where p_max is the top token's probability. Renormalising
             scales all kept p alike, so this is the same on any of the intermediate distributions.
    """
    vocab = logits.shape[-1]
    # Temperature 0 rows are greedy and sampled by the caller; shape them at temperature 1.
    t = torch.where(temperature == 0, 1.0, temperature.float().clamp_min(_MIN_TEMPERATURE))
    scaled = logits.float() / t[:, None]
    sorted_logits, order = scaled.sort(dim=-1, descending=True, stable=True)
    ranks = torch.arange(vocab, device=logits.device)

    k = torch.where(top_k <= 0, vocab, top_k.clamp(max=vocab))
    keep = ranks[None, :] < k[:, None]
    probs = torch.softmax(sorted_logits.masked_fill(~keep, float("-inf")), dim=-1)

    mass_before = probs.cumsum(dim=-1) - probs
    # top_p == 1 is off outright: rounding could push mass_before to 1 before the tail ends.
    keep &= (mass_before < top_p[:, None]) | (top_p[:, None] >= 1)
    keep &= probs >= min_p[:, None] * probs[:, :1]

    kept = probs * keep
    kept = kept / kept.sum(dim=-1, keepdim=True)
    return torch.empty_like(kept).scatter_(1, order, kept)


def sample_from_probs(
    probs: torch.Tensor, seeds: torch.Tensor, offsets: torch.Tensor, stream: int = 0
) -> torch.Tensor:
    """Exact draw of one index per row from `probs` [R, V] by the exponential race.

    With E_i ~ Exp(1) independent, P(argmax_i p_i / E_i = j) = p_j / sum(p): E_i / p_i ~ Exp(p_i)
    and the first of independent exponential clocks to ring is j with probability p_j / sum(p).
    Zero-probability tokens score 0 and never win.
    """
    exp1 = -torch.log(random_uniform(seeds, offsets, probs.shape[-1], stream))
    return torch.argmax(probs / exp1, dim=-1)


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
    offsets: torch.Tensor,
) -> torch.Tensor:
    """One token id per row: argmax(logits) where temperature == 0, else a shaped random draw."""
    probs = shape_logits_to_probs(logits, temperature, top_p, top_k, min_p)
    drawn = sample_from_probs(probs, seeds, offsets)
    return torch.where(temperature == 0, argmax(logits), drawn)


@dataclass
class SamplingTensors:
    """Per-row sampling parameters on a device: float32 temperature/top_p/min_p, int64 others."""

    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    min_p: torch.Tensor
    seeds: torch.Tensor
    offsets: torch.Tensor

    @classmethod
    def from_params(
        cls,
        params: Sequence[SamplingParams],
        seeds: Sequence[int],
        offsets: Sequence[int],
        device: torch.device | str,
    ) -> SamplingTensors:
        """`seeds` are resolved by the caller (a request's seed=None becomes one random int)."""
        if not len(params) == len(seeds) == len(offsets):
            raise ValueError(
                f"one seed and offset per request: {len(params)} params, "
                f"{len(seeds)} seeds, {len(offsets)} offsets"
            )

        def build(values: list[float] | list[int], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        return cls(
            # top_k == 1 is greedy too; writing temperature 0 routes it to the argmax path.
            temperature=build([0.0 if p.greedy else float(p.temperature) for p in params], torch.float32),
            top_p=build([float(p.top_p) for p in params], torch.float32),
            top_k=build([p.top_k for p in params], torch.long),
            min_p=build([float(p.min_p) for p in params], torch.float32),
            seeds=build([_i64(s) for s in seeds], torch.long),
            offsets=build(list(offsets), torch.long),
        )

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        """`sample` with these rows' parameters."""
        return sample(logits, self.temperature, self.top_p, self.top_k, self.min_p, self.seeds, self.offsets)
