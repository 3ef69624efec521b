"""Engine construction: device and dtype, KV pools sized from memory, attention backend, graph
runner, and the worker (vanilla, or EAGLE with its draft head and token map)."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import torch

from hotspec import envs
from hotspec.config import ConfigError, EngineConfig
from hotspec.core.kv_pool import KVPool
from hotspec.core.spec_shape import SpecShape
from hotspec.engine.block_allocator import BlockAllocator
from hotspec.layers import deterministic, fused
from hotspec.layers.attention.base import AttentionBackend
from hotspec.layers.attention.torch_ref import TorchRefBackend
from hotspec.models.draft_head import DraftHead
from hotspec.runtime import compile_watch
from hotspec.runtime.graph_runner import GraphRunner, default_batch_sizes
from hotspec.runtime.logits_state import LogitsState
from hotspec.runtime.model_runner import ModelRunner
from hotspec.runtime.prefill import PREFILL_ROWS, token_buckets
from hotspec.runtime.step_executor import StepExecutor
from hotspec.runtime.worker import Worker

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from hotspec.models.config import ModelConfig
    from hotspec.models.llama import LlamaForCausalLM
    from hotspec.speculative.adaptive import AdaptivePolicy

log = logging.getLogger("hotspec")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device_dtype(cfg: EngineConfig) -> tuple[torch.device, torch.dtype]:
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu")
                          if cfg.device == "auto" else cfg.device)
    if cfg.dtype == "auto":
        return device, torch.bfloat16 if device.type == "cuda" else torch.float32
    return device, DTYPES[cfg.dtype]


def load_target(cfg: EngineConfig) -> tuple[ModelConfig, LlamaForCausalLM, PreTrainedTokenizerBase | None]:
    """The checkpoint named by `cfg` (model, dtype, device): config, built target, tokenizer."""
    from hotspec.models.build import build_target
    from hotspec.models.dummy import dummy_state
    from hotspec.models.loader import load_checkpoint, load_model_config, load_tokenizer, resolve_model_path

    device, dtype = resolve_device_dtype(cfg)
    path = resolve_model_path(cfg.model)
    if cfg.load_format == "dummy":
        model_cfg = load_model_config(path)
        state = dummy_state(model_cfg, device, dtype)
        log.warning("--load-format dummy: random weights of %s's shapes; outputs are meaningless",
                    path)
    else:
        model_cfg, state = load_checkpoint(path, dtype)
    target = build_target(model_cfg, state, dtype, device)
    del state
    return model_cfg, target, None if cfg.skip_tokenizer_init else load_tokenizer(path)


@dataclass
class EngineParts:
    """What an engine runs on: the worker, the graphs it replays, the KV blocks it allocates,
    and the draft head (None without speculation)."""

    worker: Worker
    graphs: GraphRunner
    allocator: BlockAllocator
    draft: DraftHead | None
    max_model_len: int  # the context a request gets (before the KV cache's capacity)


class EngineBuilder:
    """Builds an engine's parts around a loaded target (`build`)."""

    def __init__(self, cfg: EngineConfig, model_config: ModelConfig, target: LlamaForCausalLM,
                 device: torch.device, dtype: torch.dtype, max_model_len: int) -> None:
        self.cfg, self.model_config, self.target = cfg, model_config, target
        self.device, self.dtype = device, dtype
        self.block_size, self.max_model_len = cfg.block_size, max_model_len
        self.draft: DraftHead | None = None

    def _fit_context(self, num_blocks: int, reserve: int, per_slot: int) -> None:
        """A request's context within what the KV cache holds (L tokens write L + reserve - 1
        slots), said at start-up: the cache's size, and a warning where it cuts the context."""
        tokens = num_blocks * self.block_size
        fits = tokens - reserve + 1
        if fits < self.max_model_len:
            log.warning("context %d -> %d tokens: the KV cache holds %d tokens; for the longer "
                        "context give it more memory (--kv-cache-memory-gb or --num-kv-blocks)",
                        self.max_model_len, fits, tokens)
            self.max_model_len = fits
        log.info("KV cache: %d blocks of %d tokens (%d tokens, %.2f GB); a request's context: %d "
                 "tokens", num_blocks, self.block_size, tokens, tokens * per_slot / 1e9,
                 self.max_model_len)

    def _blocks_for(self, n_slots: int) -> int:
        return -(-n_slots // self.block_size)

    def _kv_blocks(self, bytes_per_slot: int) -> int:
        if self.cfg.num_kv_blocks is not None:
            return self.cfg.num_kv_blocks
        return max(1, int(self.cfg.kv_cache_memory_gb * 2**30) // (bytes_per_slot * self.block_size))

    def _target_pool(self, num_blocks: int) -> KVPool:
        c = self.model_config
        return KVPool(c.num_hidden_layers, num_blocks + 1, self.block_size, c.num_key_value_heads,
                      c.head_dim, self.dtype, self.device)  # + block 0, the null block

    def _backend(self, kv_bound: int) -> AttentionBackend:
        """The attention backend, for rows of at most kv_bound keys (the deterministic mode's
        chunk follows it)."""
        choice = self.cfg.attention_backend
        if choice == "auto":
            choice = "triton" if self.device.type == "cuda" else "torch"
        if choice == "triton":
            from hotspec.layers.attention.triton_backend import KernelTuning, TritonBackend, det_kv_chunk

            return TritonBackend(self.block_size, KernelTuning(
                deterministic=self.cfg.deterministic, kv_chunk=det_kv_chunk(kv_bound)))
        return TorchRefBackend(self.block_size)

    def _graph_runner(self) -> GraphRunner:
        mode = "cuda" if self.device.type == "cuda" and not self.cfg.disable_cuda_graph else "eager"
        sizes = list(self.cfg.cuda_graph_bs or
                     default_batch_sizes(min(self.cfg.cuda_graph_max_bs, self.cfg.max_num_seqs)))
        return GraphRunner(self.device, mode, sizes, self.cfg.allow_eager_fallback)

    def build(self) -> EngineParts:
        if self.cfg.deterministic:
            if self.device.type != "cuda":
                raise ConfigError(f"deterministic: its batch-invariant kernels are Triton's, for "
                                  f"CUDA; this engine runs on {self.device} (drop --deterministic)")
            if not envs.switches().fused_kernels:
                raise ConfigError("deterministic: its kernels are the fused Triton ones, which "
                                  "the fused_kernels switch turns off (hotspec/envs.py)")
        with deterministic.mode(self.cfg.deterministic):  # (every capture and warm-up)
            return self._build()

    def _build(self) -> EngineParts:
        from hotspec.runtime.vanilla_worker import VanillaWorker
        from hotspec.speculative.phases import EagleModels
        from hotspec.speculative.worker import EagleWorker

        # The environment switches, read (and checked) once, before any layer asks for them.
        off = [f.metadata["env"] for f in fields(envs.Switches) if not getattr(envs.switches(), f.name)]
        if off:
            log.warning("switched off: %s (debugging; hotspec/envs.py)", ", ".join(f"{n}=0" for n in off))

        c = self.model_config
        per_slot = KVPool.bytes_per_slot(c.num_hidden_layers, c.num_key_value_heads, c.head_dim,
                                         self.dtype)
        self.graphs = self._graph_runner()
        shapes, policy = self._shapes() if self.cfg.speculative_algorithm is not None else ([], None)
        # A step writes `reserve` KV slots from a request's length on, so a request that fills
        # the context L writes up to position L + reserve - 2: the block tables hold those slots,
        # and L leaves them inside the rotary tables (at the model's whole context, a speculative
        # engine's L is reserve - 1 tokens shorter).
        reserve = max((s.reserve for s in shapes), default=1)
        asked = self.cfg.max_model_len
        if asked is not None and asked > c.max_position_embeddings:
            raise ConfigError(f"max_model_len {asked} is longer than the model's context, "
                              f"{c.max_position_embeddings} tokens (max_position_embeddings): "
                              f"pass --max-model-len {c.max_position_embeddings} or less")
        self.max_model_len = min(self.max_model_len, c.max_position_embeddings - reserve + 1)
        if asked is not None and self.max_model_len < asked:
            log.warning("max_model_len %d -> %d: a speculative step writes %d KV slots past a "
                        "request's length, and the model's positions end at %d", asked,
                        self.max_model_len, reserve, c.max_position_embeddings)
        max_blocks = self._blocks_for(self.max_model_len + reserve - 1)
        backend = self._backend(max_blocks * self.block_size)
        executor = StepExecutor(self.graphs, self.block_size, max_blocks,
                                self._overlap(), self.cfg.max_num_seqs,
                                # (no step holds more tokens than the context; padding
                                # positions stay inside the rotary tables)
                                tuple(token_buckets(min(self.cfg.cuda_graph_prefill_tokens,
                                                        self.max_model_len))),
                                min(self.cfg.max_num_seqs, PREFILL_ROWS),
                                # (a grammar mask per tree node of the largest shape)
                                LogitsState(self.cfg.max_num_seqs, c.vocab_size, self.device,
                                            max([s.num_draft_tokens for s in shapes], default=1)))
        worker: Worker
        if self.cfg.speculative_algorithm is None:
            num_blocks = self._kv_blocks(per_slot)
            allocator = BlockAllocator(num_blocks, first_block=1)
            runner = ModelRunner(self.target, self._target_pool(num_blocks), backend)
            worker = VanillaWorker(executor, self.target, runner)
        else:
            draft = self.draft = self._load_draft()
            d = draft.config
            per_slot += KVPool.bytes_per_slot(1, d.num_key_value_heads, d.head_dim, self.dtype)
            num_blocks = self._kv_blocks(per_slot)
            allocator = BlockAllocator(num_blocks, first_block=1)
            draft_pool = draft.make_kv_pool(num_blocks + 1, self.block_size, self.dtype, self.device)
            models = EagleModels(self.target, draft,
                                 ModelRunner(self.target, self._target_pool(num_blocks), backend),
                                 ModelRunner(draft, draft_pool, backend))
            worker = EagleWorker(models, executor, shapes, policy, fuse_step=self.cfg.fuse_spec_step,
                                 profile=self.cfg.profile_phases)
        self._fit_context(allocator.num_blocks, reserve, per_slot)
        if executor.reserve != reserve:
            raise RuntimeError(f"the worker's steps write {executor.reserve} KV slots past a "
                               f"request's length, the block tables were sized for {reserve}")
        reserved = torch.cuda.memory_reserved(self.device) if self.graphs.mode == "cuda" else 0
        self.graphs.capture_all()
        if self.graphs.mode == "cuda":
            graph_gb = (torch.cuda.memory_reserved(self.device) - reserved) / 1e9
            log.info("CUDA graphs (phase x batch size), %.2f GB:\n%s", graph_gb, self.graphs.report())
            log.info("layer kernels: %s", fused.describe(self.device))
        for line in worker.start_up():
            log.info("%s", line)
        if self.graphs.mode == "cuda" and not compile_watch.arm():
            log.info("this Triton has no compile hook: kernels compiled after start-up are not "
                     "counted")
        if self._overlap():
            log.info("overlap schedule: step N+1 is launched before step N is read%s",
                     "" if self.cfg.overlap_schedule else " (the default with CUDA graphs; "
                     "--no-overlap-schedule turns it off)")
        elif self.graphs.mode == "cuda":
            log.info("overlap schedule off: %s", "--no-overlap-schedule"
                     if self.cfg.overlap_schedule is False else
                     "the speculative step runs as three phase graphs (--no-fuse-spec-step)")
        return EngineParts(worker, self.graphs, allocator, self.draft, self.max_model_len)

    def _overlap(self) -> bool:
        """EngineConfig.overlap_schedule, with None resolved: on with CUDA graphs and a fused
        speculative step (or none), else off."""
        if self.cfg.overlap_schedule is not None:
            return self.cfg.overlap_schedule
        return self.graphs.mode == "cuda" and (self.cfg.speculative_algorithm is None
                                               or self.cfg.fuse_spec_step)

    def _shapes(self) -> tuple[list[SpecShape], AdaptivePolicy | None]:
        """The EAGLE worker's shapes, and the adaptive policy that chooses among them: under
        --speculative-adaptive the candidates (the shape given by --speculative-num-steps/
        -eagle-topk/-num-draft-tokens first when one is given, `off` last), else the one shape."""
        if not self.cfg.adaptive:
            return [self.cfg.spec_shape], None
        from hotspec.speculative.adaptive import AdaptivePolicy, StepCosts

        given = [self.cfg.spec_shape] if self.cfg.shape_given else []
        cands = [SpecShape.parse(c) for c in self.cfg.speculative_candidates]
        shapes = list(dict.fromkeys(given + [s for s in cands if not s.off] + [s for s in cands if s.off]))
        return shapes, AdaptivePolicy(shapes, StepCosts(self.graphs.batch_sizes))

    def _load_draft(self) -> DraftHead:
        from hotspec.models.draft_loader import load_draft_head

        path, algorithm = self._draft_source()
        head = load_draft_head(path, self.target, algorithm, self.dtype, self.device)
        if self.cfg.speculative_token_map is not None:
            from hotspec.speculative.token_map import apply_token_map, load_token_map

            apply_token_map(head, self.target, load_token_map(self.cfg.speculative_token_map,
                                                               self.model_config.vocab_size))
        check_hot_vocab_size(path, head)
        head.fuse_projections()  # one GEMM for q/k/v and one for gate/up, as in the target
        log.info("draft head: %s (%s, %d draft tokens: %s)", path, algorithm, head.draft_vocab_size,
                 self._draft_vocab_source(head.draft_vocab_size))
        return head

    def _draft_vocab_source(self, n: int) -> str:
        """Where the head's proposals come from, for the start-up log."""
        vocab = self.model_config.vocab_size
        if self.cfg.speculative_token_map is not None:
            return f"the FR-Spec map {self.cfg.speculative_token_map}, {n:,} of the target's {vocab:,}"
        if n == vocab:
            return "the target's whole vocabulary"
        return f"the head's own LM head, {n:,} of the target's {vocab:,}"

    def _draft_source(self) -> tuple[str, str]:
        """(head folder, algorithm): the configured head, or the default model's shipped one."""
        path, algorithm = self.cfg.speculative_draft_model_path, self.cfg.speculative_algorithm
        assert algorithm is not None  # only called for speculative engines
        if path is not None:
            return path, algorithm
        from hotspec.models.default_model import (
            DEFAULT_DRAFT_ALGORITHM,
            default_draft_head,
            is_default_model,
        )

        if not is_default_model(self.cfg.model):
            raise ConfigError("speculative_algorithm needs speculative_draft_model_path (a folder "
                              "with config.json and the head's weights); only the default model "
                              "has a built-in draft head")
        if algorithm != DEFAULT_DRAFT_ALGORITHM:
            log.warning("speculative_algorithm %s: the default model's built-in draft head is %s "
                        "and runs as such", algorithm, DEFAULT_DRAFT_ALGORITHM)
        return str(default_draft_head()), DEFAULT_DRAFT_ALGORITHM


def check_hot_vocab_size(path: str, head: DraftHead) -> None:
    """A draft config may name `hot_vocab_size` (SGLang's FR-Spec key); it never sizes anything,
    but if it disagrees with the head actually built, the user's setup is not what they think."""
    cfg_file = os.path.join(path, "config.json")
    named = None
    if os.path.isfile(cfg_file):
        with open(cfg_file) as f:
            named = json.load(f).get("hot_vocab_size")
    if named is not None and named != head.draft_vocab_size:
        raise ConfigError(
            f"the draft config names hot_vocab_size={named} but the draft LM head has "
            f"{head.draft_vocab_size} rows after the token map; pass --speculative-token-map with "
            f"{named} ids, or remove hot_vocab_size from {cfg_file}")
