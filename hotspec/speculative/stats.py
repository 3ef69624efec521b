"""Speculative decoding statistics, summed over the engine's lifetime: the accept-length
histogram, per-phase call counts and (with profiling) seconds, and FR-Spec hot-set coverage."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class SpecStats:
    accept_hist: Counter[int] = field(default_factory=Counter)  # tokens emitted per verify pass
    phase_calls: Counter[str] = field(default_factory=Counter)
    phase_seconds: Counter[str] = field(default_factory=Counter)
    hot_hits: int = 0  # served tokens inside the draft vocabulary (FR-Spec hot-set coverage)
    served: int = 0  # tokens that verify passes produced and the engine kept (stops applied)

    @property
    def hot_coverage(self) -> float:
        return self.hot_hits / self.served if self.served else 0.0

    def add_served(self, tokens: list[int], hot: frozenset[int]) -> None:
        """Count the tokens of a step the engine kept; `hot` is the draft vocabulary (target ids)."""
        self.served += len(tokens)
        self.hot_hits += sum(t in hot for t in tokens)
