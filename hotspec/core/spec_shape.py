"""A speculation shape: num_steps/topk/num_draft_tokens (SGLang's --speculative-num-steps,
--speculative-eagle-topk, --speculative-num-draft-tokens), validated here and nowhere else.
OFF (0/0/1) is plain decoding, one of the adaptive engine's candidates."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class SpecShape:
    num_steps: int  # draft forwards per step: the depth of the draft tree
    topk: int  # children kept per draft node: 1 drafts a chain
    num_draft_tokens: int  # tokens verified per step: the root plus the best drafted nodes

    def __post_init__(self) -> None:
        s, k, n = self.num_steps, self.topk, self.num_draft_tokens
        if (s, k, n) == (0, 0, 1):  # OFF
            return
        if s < 1:
            raise ValueError(f"num_steps must be >= 1, got {s}")
        if k < 1:
            raise ValueError(f"topk must be >= 1, got {k}")
        if k == 1 and n != s + 1:
            raise ValueError(f"a chain (topk 1) of {s} steps verifies {s + 1} tokens: set "
                             f"speculative_num_draft_tokens={s + 1} (got {n})")
        nodes = self.max_nodes
        if not 2 <= n <= nodes + 1:
            raise ValueError(f"num_draft_tokens={n} must be in [2, {nodes + 1}] for num_steps={s}, "
                             f"topk={k} (the root plus at most {nodes} drafted nodes)")

    @property
    def max_nodes(self) -> int:
        """Nodes the draft proposes: k at depth 1, then k*k children of the k frontier nodes a step."""
        return self.topk + (self.num_steps - 1) * self.topk * self.topk

    @property
    def off(self) -> bool:
        return self.num_steps == 0

    @property
    def chain(self) -> bool:
        return self.topk == 1

    @property
    def width(self) -> int:
        """The longest accepted path, root included: num_steps + 1 (1 for plain decoding)."""
        return self.num_steps + 1

    @property
    def reserve(self) -> int:
        """KV slots a step writes from a request's length on: the tree's tokens, the draft
        tree's scratch slots, the accepted path's draft_extend rows (1 for plain decoding)."""
        return max(self.num_draft_tokens, self.topk * (self.num_steps - 1), self.width)

    @property
    def label(self) -> str:
        return "off" if self.off else f"{self.num_steps}/{self.topk}/{self.num_draft_tokens}"

    @classmethod
    def of(cls, num_steps: int | None, topk: int | None, num_draft_tokens: int | None) -> SpecShape:
        """SGLang's defaults for what is unset: 3 steps, topk 1, num_steps + 1 tokens for a chain,
        else min(8, the tree's nodes + 1)."""
        s = 3 if num_steps is None else num_steps
        k = 1 if topk is None else topk
        n = num_draft_tokens
        if n is None:
            n = s + 1 if k == 1 else min(8, k + (s - 1) * k * k + 1)
        return cls(s, k, n)

    @classmethod
    def parse(cls, text: str) -> SpecShape:
        """"off" or "STEPS/TOPK/TOKENS" (e.g. 3/1/4, 4/8/12); ValueError says what is wrong."""
        if text.strip().lower() == "off":
            return OFF
        try:
            s, k, n = (int(v) for v in text.split("/"))
        except ValueError:
            raise ValueError(f"a speculation shape is 'off' or STEPS/TOPK/TOKENS (e.g. 3/1/4), "
                             f"got {text!r}") from None
        try:
            return cls(s, k, n)
        except ValueError as e:
            raise ValueError(f"shape {text!r}: {e}") from None


OFF = SpecShape(0, 0, 1)
# The shapes that are the best fixed one at some batch size (benchmarks/RESULTS.md, "Adaptive
# speculation shape"); each further candidate costs exploration steps, start-up graphs, and
# choices made within the estimates' noise.
DEFAULT_CANDIDATES = ("off", "3/1/4", "4/8/12")
