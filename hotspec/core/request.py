"""A request's life: prompt, generated tokens, its KV blocks and its statistics."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from hotspec.core.logprobs import TokenLogprob
from hotspec.sampling_params import SamplingParams

if TYPE_CHECKING:
    from hotspec.engine.stop_checker import StopChecker


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestStats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    spec_steps: int = 0  # verify passes that produced this request's tokens

    @property
    def tau(self) -> float:
        """Generated tokens per verify pass (the mean acceptance length, bonus token included)."""
        return self.generated_tokens / self.spec_steps if self.spec_steps else 0.0


class DraftRow(NamedTuple):
    """What the draft head left for a request's next speculative step: row `at` of the batch
    tensors (on the device, never written again) of the step, prefill or catch-up that wrote it.
    A reference and an index, not a view of the row: no tensor is made per request per step."""

    topk_logp: torch.Tensor  # [B, K] draft log-probs of the depth-1 candidates
    topk_ids: torch.Tensor  # [B, K] their target ids
    feature: torch.Tensor  # [B, H] the draft feature the depth-1 candidates are drafted with
    at: int  # the request's row in them

    def row(self, name: str) -> torch.Tensor:
        """The request's row of one of them (a view)."""
        t: torch.Tensor = getattr(self, name)
        return t[self.at]


@dataclass
class SpecState:
    """A request's speculative state between steps: the draft's row, and the tokens of plain
    decode steps (the adaptive policy's "off") that the draft has not read yet."""

    draft: DraftRow | None = None
    # (position, target feature at it, the token after it) per plain decode step read since the
    # draft last ran over this request's tokens: its catch-up input
    pending: list[tuple[int, torch.Tensor, int]] = field(default_factory=list)


@dataclass(eq=False)  # identity: the engine's list membership and removal are per object
class Request:
    rid: int
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int
    status: Status = Status.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    seq_len: int = 0  # tokens whose KV is committed (target and draft caches alike)
    finish_reason: str | None = None
    error: str | None = None
    stats: RequestStats = field(default_factory=RequestStats)
    checker: StopChecker | None = field(default=None, repr=False)
    spec: SpecState = field(default_factory=SpecState, repr=False)
    # with params.logprobs: the logprobs of the tokens the last prefill or step read back gave this
    # request, one per token, set by whoever read them and consumed by the engine's emit
    step_logprobs: list[TokenLogprob] | None = field(default=None, repr=False)
    # with params.prompt_logprobs: one per prompt token scored so far (the first None), filled by
    # prefill chunk by chunk
    prompt_logprobs: list[TokenLogprob | None] | None = field(default=None, repr=False)
    # with logits processing (params.processes_logits): its row of runtime/logits_state.py, -1: none
    logits_slot: int = -1
    # with params.grammar: its matcher (runtime/grammar.RequestGrammar), advanced over every token
    # the engine emits for it
    grammar: Any = field(default=None, repr=False)
    # while that matcher is compiled on the engine's grammar thread (engine/grammars.py): its
    # future; the request waits for it before admission
    grammar_job: Any = field(default=None, repr=False)
    # `blocks` as int32 for the step's block table, kept with the list it was read from: the engine
    # only appends to that list or replaces it
    _block_array: tuple[list[int], np.ndarray] | None = field(default=None, repr=False)

    def block_array(self) -> np.ndarray:
        """`blocks` as an int32 array, converted once per new block rather than every step."""
        cached, n = self._block_array, len(self.blocks)
        if cached is not None and cached[0] is self.blocks and len(cached[1]) == n:
            return cached[1]
        if cached is not None and cached[0] is self.blocks and len(cached[1]) < n:
            arr = np.concatenate([cached[1], np.asarray(self.blocks[len(cached[1]):], dtype=np.int32)])
        else:
            arr = np.asarray(self.blocks, dtype=np.int32)
        self._block_array = (self.blocks, arr)
        return arr

    @property
    def num_tokens(self) -> int:
        """Prompt and generated tokens: what counts against the context."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def last_token(self) -> int:
        """The newest token: sampled, not yet in the KV cache (the next step's input)."""
        return self.output_token_ids[-1]

    def slot(self, index: int, block_size: int) -> int:
        return self.blocks[index // block_size] * block_size + index % block_size

    def slots(self, start: int, n: int, block_size: int) -> list[int]:
        return [self.slot(i, block_size) for i in range(start, start + n)]
