"""The engine loop: admit, prefill, step, stream tokens through stop checks, free what finishes."""

from __future__ import annotations

import itertools
import random
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import torch

from hotspec.config import ConfigError, EngineConfig
from hotspec.engine.block_allocator import BlockAllocator, OutOfBlocks
from hotspec.engine.kv_pool import KVPool
from hotspec.engine.request import Request, Status
from hotspec.engine.stop_checker import StopChecker
from hotspec.errors import InvalidRequestError
from hotspec.layers.attention.torch_ref import TorchRefBackend
from hotspec.models.build import build_target
from hotspec.models.draft_head import DraftHead
from hotspec.models.loader import load_checkpoint, load_tokenizer, resolve_model_path
from hotspec.runtime.model_runner import ModelRunner
from hotspec.sampling_params import SamplingParams

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Worker(Protocol):
    reserve: int

    def prefill(self, reqs: list[Request]) -> list[list[int]]: ...

    def step(self, reqs: list[Request]) -> list[list[int]]: ...


@dataclass
class StepOutput:
    request: Request
    text_delta: str
    new_token_ids: list[int]


def resolve_device_dtype(cfg: EngineConfig) -> tuple[torch.device, torch.dtype]:
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu")
                          if cfg.device == "auto" else cfg.device)
    if cfg.dtype == "auto":
        return device, torch.bfloat16 if device.type == "cuda" else torch.float32
    return device, _DTYPES[cfg.dtype]


class Engine:
    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.device, self.dtype = resolve_device_dtype(cfg)
        path = resolve_model_path(cfg.model)
        model_cfg, state = load_checkpoint(path, self.dtype)
        self.model_config = model_cfg
        self.target = build_target(model_cfg, state, self.dtype, self.device)
        del state
        self.tokenizer = None if cfg.skip_tokenizer_init else load_tokenizer(path)
        self.eos_token_ids = set(model_cfg.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            self.eos_token_ids.add(self.tokenizer.eos_token_id)
        self.max_model_len = min(cfg.max_model_len or model_cfg.max_position_embeddings,
                                 model_cfg.max_position_embeddings)
        self.block_size = cfg.block_size
        self._rng = random.Random(cfg.seed)
        self._ids = itertools.count()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.worker: Worker = self._build_worker()

    # -- construction --------------------------------------------------------------------------
    def _kv_blocks(self, bytes_per_slot: int) -> int:
        if self.cfg.num_kv_blocks is not None:
            return self.cfg.num_kv_blocks
        return max(1, int(self.cfg.kv_cache_memory_gb * 2**30) // (bytes_per_slot * self.block_size))

    def _target_pool(self, num_blocks: int) -> KVPool:
        c = self.model_config
        return KVPool(c.num_hidden_layers, num_blocks, self.block_size, c.num_key_value_heads,
                      c.head_dim, self.dtype, self.device)

    def _build_worker(self) -> Worker:
        from hotspec.engine.eagle_worker import EagleWorker
        from hotspec.engine.vanilla_worker import VanillaWorker

        c = self.model_config
        per_slot = KVPool.bytes_per_slot(c.num_hidden_layers, c.num_key_value_heads, c.head_dim,
                                         self.dtype)
        backend = TorchRefBackend(self.block_size)
        if self.cfg.speculative_algorithm is None:
            num_blocks = self._kv_blocks(per_slot)
            self.allocator = BlockAllocator(num_blocks)
            runner = ModelRunner(self.target, self._target_pool(num_blocks), backend)
            return VanillaWorker(self.target, runner, self.block_size, self.device)
        self.draft = self._load_draft()
        d = self.draft.config
        per_slot += KVPool.bytes_per_slot(1, d.num_key_value_heads, d.head_dim, self.dtype)
        num_blocks = self._kv_blocks(per_slot)
        self.allocator = BlockAllocator(num_blocks)
        steps, topk, ntok = self.cfg.spec_shape
        return EagleWorker(
            self.target, self.draft, ModelRunner(self.target, self._target_pool(num_blocks), backend),
            ModelRunner(self.draft, self.draft.make_kv_pool(num_blocks, self.block_size, self.dtype,
                                                            self.device), backend),
            self.block_size, self.device, steps, topk, ntok, profile=self.cfg.profile_phases)

    def _load_draft(self) -> DraftHead:
        from hotspec.models.draft_loader import load_draft_head

        path = self.cfg.speculative_draft_model_path
        if path is None:
            raise ConfigError("speculative_algorithm needs speculative_draft_model_path (a folder "
                              "with config.json and the head's weights)")
        head = load_draft_head(path, self.target, self.cfg.speculative_algorithm, self.dtype,
                               self.device)
        if self.cfg.speculative_token_map is not None:
            from hotspec.spec.token_map import apply_token_map, load_token_map

            apply_token_map(head, self.target, load_token_map(self.cfg.speculative_token_map,
                                                               self.model_config.vocab_size))
        return head

    # -- requests ------------------------------------------------------------------------------
    def add_request(self, prompt_token_ids: list[int], params: SamplingParams) -> Request:
        """Validate and queue a request; a bad request raises InvalidRequestError and changes nothing."""
        if not prompt_token_ids:
            raise InvalidRequestError("empty prompt: give at least one token or character")
        vocab = self.model_config.vocab_size
        bad = [t for t in prompt_token_ids if not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        room = self.max_model_len - self.worker.reserve
        if len(prompt_token_ids) >= room:
            raise InvalidRequestError(
                f"prompt of {len(prompt_token_ids)} tokens does not fit the context of "
                f"{self.max_model_len} tokens (at most {room - 1} prompt tokens leave room to "
                "generate); shorten the prompt or raise max_model_len")
        need = self._blocks_for(len(prompt_token_ids) + self.worker.reserve)
        if need > self.allocator.num_blocks:
            raise InvalidRequestError(
                f"prompt needs {need} KV blocks but the cache has {self.allocator.num_blocks}; "
                "shorten the prompt or give the KV cache more memory")
        if params.stop and self.tokenizer is None:
            raise InvalidRequestError("stop strings need a tokenizer; this engine was started with "
                                      "skip_tokenizer_init: use stop_token_ids instead")
        req = Request(next(self._ids), list(prompt_token_ids), params,
                      params.seed if params.seed is not None else self._rng.getrandbits(62))
        req.stats.prompt_tokens = len(prompt_token_ids)
        req.checker = StopChecker(self.tokenizer, params, self.eos_token_ids,
                                  req.prompt_token_ids)
        self.waiting.append(req)
        return req

    def abort(self, req: Request, reason: str = "abort") -> None:
        if req.status is Status.FINISHED:
            return
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        self._finish(req, reason)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- the loop ------------------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        admitted = self._admit()
        if admitted:
            return self._emit(admitted, self.worker.prefill(admitted))
        if not self.running:
            return []
        reqs = self._reserve_step_slots()
        return self._emit(reqs, self.worker.step(reqs))

    def _blocks_for(self, n_slots: int) -> int:
        return -(-n_slots // self.block_size)

    def _grow(self, req: Request, n_slots: int) -> None:
        extra = self._blocks_for(n_slots) - len(req.blocks)
        if extra > 0:
            req.blocks += self.allocator.allocate(extra)

    def _admit(self) -> list[Request]:
        admitted: list[Request] = []
        while self.waiting and len(self.running) + len(admitted) < self.cfg.max_num_seqs:
            req = self.waiting[0]
            n = len(req.prompt_token_ids) + len(req.output_token_ids) + self.worker.reserve
            if self._blocks_for(n) > self.allocator.num_free:
                break
            self.waiting.popleft()
            self._grow(req, n)
            req.status = Status.RUNNING
            admitted.append(req)
        self.running += admitted
        return admitted

    def _reserve_step_slots(self) -> list[Request]:
        """Make room for this step's writes; preempt (recompute later) the newest when out of blocks."""
        for req in list(self.running):
            while req in self.running:
                try:
                    self._grow(req, req.seq_len + self.worker.reserve)
                    break
                except OutOfBlocks:
                    victim = self.running[-1]
                    self._preempt(victim)
        return list(self.running)

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.allocator.free(req.blocks)
        req.blocks, req.seq_len, req.status = [], 0, Status.WAITING
        self.waiting.appendleft(req)

    def _emit(self, reqs: list[Request], tokens: list[list[int]]) -> list[StepOutput]:
        outs: list[StepOutput] = []
        for req, toks in zip(reqs, tokens):
            delta, taken = "", []
            for t in toks:
                req.output_token_ids.append(t)
                taken.append(t)
                assert req.checker is not None
                piece, reason = req.checker.append(t)
                delta += piece
                if reason is None and req.seq_len + self.worker.reserve + 1 >= self.max_model_len:
                    reason = "length"
                if reason is not None:
                    self.running.remove(req)
                    self._finish(req, reason)
                    break
            req.stats.generated_tokens = len(req.output_token_ids)
            outs.append(StepOutput(req, delta, taken))
        return outs

    def _finish(self, req: Request, reason: str) -> None:
        req.status, req.finish_reason = Status.FINISHED, reason
        if req.blocks:
            self.allocator.free(req.blocks)
        req.blocks = []
