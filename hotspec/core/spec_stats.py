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
    drafted: int = 0  # draft tokens verified (num_draft_tokens - 1 per request and step)
    shape_steps: Counter[str] = field(default_factory=Counter)  # steps run per shape (label)

    @property
    def accepted(self) -> int:
        """Draft tokens accepted."""
        return sum((a - 1) * n for a, n in self.accept_hist.items())

    @property
    def hot_coverage(self) -> float:
        return self.hot_hits / self.served if self.served else 0.0

    def acceptance_by_depth(self) -> list[tuple[int, int, int]]:
        """Per draft depth d = 1, 2, ...: (d, passes that reached d, passes that accepted a node at
        d). A pass of accept length a (the root included) reached depths 1..a and accepted
        1..a-1, so the rate at d is P(accept at d | accepted at d - 1). Depths up to the deepest
        accepted one, and depth 1 always (every pass drafts there): a head that never hits gets
        its row at rate 0, not an empty table."""
        if not self.accept_hist:
            return []
        deepest = max(max(self.accept_hist) - 1, 1)
        rows = []
        for d in range(1, deepest + 1):
            reached = sum(n for a, n in self.accept_hist.items() if a >= d)
            accepted = sum(n for a, n in self.accept_hist.items() if a >= d + 1)
            rows.append((d, reached, accepted))
        return rows

    def add_served(self, tokens: list[int], hot: frozenset[int]) -> None:
        """Count the tokens of a step the engine kept; `hot` is the draft vocabulary (target ids)."""
        self.served += len(tokens)
        self.hot_hits += sum(t in hot for t in tokens)
