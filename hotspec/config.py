"""Engine configuration: one frozen dataclass, validated in one place, also the CLI's source."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from hotspec.errors import HotspecError

DTYPES = ("auto", "float32", "bfloat16", "float16")
SPEC_ALGORITHMS = ("EAGLE", "EAGLE3")


class ConfigError(HotspecError, ValueError):
    """An invalid engine option or combination of options."""


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # None: the embedded default (SmolLM2-135M-Instruct)
    dtype: str = "auto"  # auto: bfloat16 on GPU, float32 on CPU
    device: str = "auto"  # auto: cuda when available
    block_size: int = 16
    num_kv_blocks: int | None = None  # None: sized from kv_cache_memory_gb
    kv_cache_memory_gb: float = 1.0
    max_num_seqs: int = 64
    max_model_len: int | None = None  # None: the model's context length
    max_prefill_tokens: int | None = 8192  # chunked prefill: prompt tokens per step (None: no limit)
    # while prompts prefill, alternate their chunks with decode steps of the running requests
    # (else every prefill chunk goes first and running requests stall until all are prefilled)
    decode_during_prefill: bool = True
    seed: int = 0
    attention_backend: str = "auto"  # auto: triton on GPU, torch reference on CPU
    disable_cuda_graph: bool = False  # debugging: every phase eager
    allow_eager_fallback: bool = False  # a failed capture warns (and is counted) instead of stopping
    cuda_graph_max_bs: int = 64
    profile_phases: bool = False  # time each speculative phase (synchronises the device)
    # One graph per batch size for the whole speculative step (draft -> verify -> draft_extend)
    # instead of three: fewer launches and input copies per step (H200, SmolLM2: 2.61 -> 2.49 ms
    # per step at batch 1, never slower at 8 or 32; benchmarks/RESULTS.md). The three phase graphs
    # are still captured: profiling and the phase benchmarks use them. --no-fuse-spec-step for A/Bs.
    fuse_spec_step: bool = True
    # Launch step N+1 before reading step N's tokens, so the host's per-step work (stop checks,
    # detokenizing, building the next batch) overlaps the device (SGLang's overlap schedule, vLLM's
    # async scheduling): vanilla decode, and the fused speculative step. A request that stops on
    # EOS or a stop string costs one wasted row; max_tokens is foreseen and costs none; near the
    # context limit a request waits for its unread step. engine/launches.py.
    # None (auto): on with CUDA graphs (H200, benchmarks/RESULTS.md session 7: SmolLM2 vanilla
    # decode 1.04 -> 0.84 ms per step at batch 1, the graph's replay time), unless the speculative
    # step runs as three phases (--no-fuse-spec-step); off on CPU, where nothing runs ahead.
    overlap_schedule: bool | None = None
    skip_tokenizer_init: bool = False  # token ids in and out only (no text, no stop strings)
    # Speculative decoding (SGLang's option names)
    speculative_algorithm: str | None = None
    speculative_draft_model_path: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    speculative_token_map: str | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype={self.dtype!r}; choose one of {', '.join(DTYPES)}")
        if self.attention_backend not in ("auto", "torch", "triton"):
            raise ConfigError(f"attention_backend={self.attention_backend!r}; choose auto, torch or triton")
        for name in ("block_size", "max_num_seqs", "cuda_graph_max_bs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("num_kv_blocks", "max_prefill_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be >= 1 (or None), got {value}")
        self._validate_spec()
        spec = self.speculative_algorithm is not None
        if self.overlap_schedule is True and spec and not self.fuse_spec_step:
            raise ConfigError("overlap_schedule with speculative decoding launches the fused step "
                              "graph: drop --no-fuse-spec-step or --overlap-schedule")

    def _validate_spec(self) -> None:
        algo = self.speculative_algorithm
        spec_fields = ("speculative_draft_model_path", "speculative_num_steps",
                       "speculative_eagle_topk", "speculative_num_draft_tokens",
                       "speculative_token_map")
        if algo is None:
            given = [f for f in spec_fields if getattr(self, f) is not None]
            if given:
                raise ConfigError(f"{', '.join(given)} given without speculative_algorithm; "
                                  f"set speculative_algorithm to one of {SPEC_ALGORITHMS}")
            return
        if algo not in SPEC_ALGORITHMS:
            raise ConfigError(f"speculative_algorithm={algo!r}; choose one of {SPEC_ALGORITHMS}")
        steps, topk, ntok = self.spec_shape
        if steps < 1:
            raise ConfigError(f"speculative_num_steps must be >= 1, got {steps}")
        if topk < 1:
            raise ConfigError(f"speculative_eagle_topk must be >= 1, got {topk}")
        if topk == 1 and ntok != steps + 1:
            raise ConfigError(
                f"chain drafting (speculative_eagle_topk=1) verifies exactly num_steps + 1 tokens: "
                f"set speculative_num_draft_tokens={steps + 1} (got {ntok})")
        max_nodes = topk + (steps - 1) * topk * topk
        if not 2 <= ntok <= max_nodes + 1:
            raise ConfigError(
                f"speculative_num_draft_tokens={ntok} must be in [2, {max_nodes + 1}] for "
                f"num_steps={steps}, topk={topk} (the root plus at most {max_nodes} drafted nodes)")

    @property
    def spec_shape(self) -> tuple[int, int, int]:
        """(num_steps, topk, num_draft_tokens) with SGLang's defaults filled in."""
        steps = self.speculative_num_steps if self.speculative_num_steps is not None else 3
        topk = self.speculative_eagle_topk if self.speculative_eagle_topk is not None else 1
        ntok = self.speculative_num_draft_tokens
        if ntok is None:
            ntok = steps + 1 if topk == 1 else min(8, topk + (steps - 1) * topk * topk + 1)
        return steps, topk, ntok

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise ConfigError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
        return cls(**kwargs)
