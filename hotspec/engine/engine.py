"""The engine loop: admit, prefill, step, stream tokens through stop checks, free what finishes."""

from __future__ import annotations

import itertools
import random
import sys
from collections import deque
from typing import TYPE_CHECKING

import torch

from hotspec.config import ConfigError, EngineConfig
from hotspec.core.request import Request, Status
from hotspec.engine.block_allocator import OutOfBlocks
from hotspec.engine.builder import DTYPES, EngineBuilder, load_target, resolve_device_dtype
from hotspec.engine.grammars import Grammars
from hotspec.engine.outputs import StepOutput
from hotspec.engine.prefix_share import SharedPrefixes
from hotspec.engine.request_checks import check_request
from hotspec.engine.stop_checker import StopChecker
from hotspec.layers import deterministic
from hotspec.models.config import ModelConfig
from hotspec.models.llama import LlamaForCausalLM
from hotspec.runtime.logits_state import LogitsState
from hotspec.runtime.worker import Worker
from hotspec.sampling_params import SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class Engine:
    """Requests in, tokens out. Construction (device, KV pools, backend, graphs, worker) is
    EngineBuilder's (engine/builder.py); this class owns the request lifecycle."""

    def __init__(self, cfg: EngineConfig) -> None:
        model_cfg, target, tokenizer = load_target(cfg)
        device, dtype = resolve_device_dtype(cfg)
        self._setup(cfg, model_cfg, target, tokenizer, device, dtype)

    @classmethod
    def from_model(cls, cfg: EngineConfig, model_config: ModelConfig, target: LlamaForCausalLM,
                   tokenizer: PreTrainedTokenizerBase | None = None) -> Engine:
        """An engine around a target that is already built (random weights for benchmarks, tests):
        no checkpoint is read and `cfg.model` is ignored; device and dtype are the target's."""
        param = next(target.parameters())
        if cfg.dtype != "auto" and DTYPES[cfg.dtype] != param.dtype:
            raise ConfigError(f"dtype={cfg.dtype!r} but the model is {param.dtype}; use dtype='auto'")
        if cfg.device != "auto" and torch.device(cfg.device).type != param.device.type:
            raise ConfigError(f"device={cfg.device!r} but the model is on {param.device}; "
                              "use device='auto'")
        engine = cls.__new__(cls)
        engine._setup(cfg, model_config, target, tokenizer, param.device, param.dtype)
        return engine

    def _setup(self, cfg: EngineConfig, model_cfg: ModelConfig, target: LlamaForCausalLM,
               tokenizer: PreTrainedTokenizerBase | None, device: torch.device,
               dtype: torch.dtype) -> None:
        self.cfg = cfg
        self.device, self.dtype = device, dtype
        self.model_config, self.target, self.tokenizer = model_cfg, target, tokenizer
        self.grammars = Grammars(tokenizer, model_cfg.vocab_size)
        self.eos_token_ids = set(model_cfg.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            self.eos_token_ids.add(self.tokenizer.eos_token_id)
        self.max_model_len = min(cfg.max_model_len or model_cfg.max_position_embeddings,
                                 model_cfg.max_position_embeddings)
        self.block_size, self._rng, self._ids = cfg.block_size, random.Random(cfg.seed), itertools.count()
        self.waiting: deque[Request] = deque()
        # Admitted (blocks held), pending tokens not all in the KV yet (chunked prefill); then running
        self.prefilling: list[Request] = []
        self.running: list[Request] = []
        # The requests the current step hands to a model pass; when step() raises, exactly these
        # may have half-written KV or draft state (see fail_in_flight).
        self.in_flight: list[Request] = []
        self._prefill_turn = True  # decode_during_prefill: whose turn the next step is
        self._decodes_since_admit = 0  # num_continuous_decode_steps: decode steps since admission
        parts = EngineBuilder(cfg, model_cfg, target, device, dtype, self.max_model_len).build()
        self.worker: Worker = parts.worker
        self.graphs, self.allocator, self.draft = parts.graphs, parts.allocator, parts.draft
        self.max_model_len = parts.max_model_len
        self.prefixes = SharedPrefixes(self.allocator, self.block_size)
        # Rows of launched steps whose request had finished when read (overlap: EOS, stops, aborts)
        self.dropped_rows = 0
        # A request (L tokens: L + reserve - 1 slots at most) never needs more KV than the cache
        # holds (EngineBuilder._fit_context): alone, it fits, so preemption never evicts it for
        # nothing (_reserve_step_slots).
        self.kv_capacity = self.allocator.num_blocks * self.block_size

    # -- requests ------------------------------------------------------------------------------
    def add_request(self, prompt_token_ids: list[int], params: SamplingParams,
                    wait_grammar: bool = True) -> Request:
        """Validate and queue a request; a bad request raises InvalidRequestError and changes
        nothing. `wait_grammar=False` (a serving loop): a grammar compiles on the engine's grammar
        thread while the request waits (engine/grammars.py), its failure an "error" finish."""
        check_request(self, prompt_token_ids, params)
        later = params.grammar is not None and not wait_grammar
        grammar = None if later else self.grammars.matcher(params)
        req = Request(next(self._ids), list(prompt_token_ids), params,
                      params.seed if params.seed is not None else self._rng.getrandbits(62))
        req.stats.prompt_tokens = len(prompt_token_ids)
        req.grammar = grammar
        if later:
            self.grammars.submit(req)
        req.checker = StopChecker(self.tokenizer if params.detokenize else None, params,
                                  self.eos_token_ids, req.prompt_token_ids)
        self.waiting.append(req)
        return req

    def abort(self, req: Request, reason: str = "abort") -> None:
        if req.status is Status.FINISHED:
            return
        for queue in (self.waiting, self.prefilling, self.running):
            if req in queue:
                queue.remove(req)
        self._finish(req, reason)

    def has_unfinished(self) -> bool:
        """Requests to serve, or steps in flight (overlap: the next `step()` collects the step
        launched after a request ended, before a later replay overwrites its pinned outputs)."""
        return bool(self.waiting or self.prefilling or self.running or self.worker.unread())

    def fail_in_flight(self, error: str) -> list[Request]:
        """After step() raised: finish the requests that step was computing (reason "error", blocks
        freed; their KV may be half-written) and return them, so the loop goes on with the others,
        whose KV a pass never touches. A failure outside any model pass (nothing in flight) fails
        every unfinished request, so that it cannot loop forever. Requests in flight that had
        finished are returned too: the step's outputs, their last tokens included, were lost."""
        victims = self.in_flight or [*self.waiting, *self.prefilling, *self.running]
        self.in_flight = []
        self.worker.drop_unread()  # uncollected steps (overlap) die with the step that failed
        for req in victims:
            if req.status is not Status.FINISHED:
                req.error = error
                self.abort(req, "error")
        return victims

    # -- the loop ------------------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        with deterministic.mode(self.cfg.deterministic):  # (every kernel launched from here)
            return self._settle_grammars() + self._step()

    def _settle_grammars(self) -> list[StepOutput]:
        failed = self.grammars.settle() if self.grammars.pending else []
        for req in failed:  # (its grammar did not compile: engine/grammars.py)
            self.waiting.remove(req)
            self._finish(req, "error")
        if self.grammars.pending and len(self.grammars.pending) == len(self.waiting) and \
                not (self.running or self.prefilling or self.worker.unread()):
            self.grammars.wait(0.002)  # nothing to run until a compile ends
        return [StepOutput(r, "", []) for r in failed]

    def _step(self) -> list[StepOutput]:
        self.in_flight = []
        n = self.cfg.num_continuous_decode_steps
        if n == 1 or not self.running or self._decodes_since_admit >= n:
            self._decodes_since_admit = 0
            self._admit()
        # Prefill chunks go first, except that with decode_during_prefill the running requests
        # get every other step, so they keep streaming while long prompts prefill.
        alternate = self.cfg.decode_during_prefill and bool(self.running) and not self._prefill_turn
        if self.prefilling and not alternate:
            self._prefill_turn = False
            return self._prefill_step()
        self._prefill_turn = True
        if not self.running:
            return self._served(self._drain())
        self._decodes_since_admit += 1
        if self.worker.overlapping:
            return self._overlap_step()
        outs = self._drain()  # steps launched while overlapping (profiling switched it off since)
        if not self.running:
            return outs
        reqs = self._reserve_step_slots()
        if not reqs:  # every running request was preempted for room: prefill goes next
            return outs
        self.in_flight = reqs
        outs += self._emit(reqs, self.worker.step(reqs))
        self.in_flight = []
        return self._served(outs)

    def _served(self, outs: list[StepOutput]) -> list[StepOutput]:
        """Hand the decode steps' kept tokens to the worker's statistics (EAGLE: hot-set hits)."""
        self.worker.record_served([t for o in outs for t in o.new_token_ids])
        return outs

    # -- the overlap schedule (core/launches.py) ---------------------------------------------
    def _overlap_step(self) -> list[StepOutput]:
        """Launch the next step, then collect the one before it: the host emits step N's tokens
        while the device computes step N+1 (core/launches.py)."""
        worker = self.worker
        reqs, rooms = self._launchable()
        outs: list[StepOutput] = []
        if reqs and worker.drains_before(reqs):
            outs = self._drain()
            reqs, rooms = self._launchable()
        if not self._grow(reqs, rooms):  # out of blocks: preemption needs every step read first
            outs += self._drain()
            reqs = self._reserve_step_slots()
        launched, ahead = set(reqs), worker.ahead_counts()
        self.in_flight = reqs + [r for r in self.running if r in ahead and r not in launched]
        if reqs:
            worker.launch(reqs)
        while worker.unread() > (1 if reqs else 0):
            outs += self._emit(*worker.collect())
        self.in_flight = []
        return self._served(outs)

    def _launchable(self) -> tuple[list[Request], list[int]]:
        """The running requests the next launch takes and the KV slots each may need (its unread
        steps' largest advances, then `reserve`), in one pass (host time of every step). Left
        out while its unread steps end it (max_tokens: a step emits at least one token) or may
        (the context, at the largest advances): launched again once they are read."""
        ahead, adv, reserve = self.worker.ahead_counts(), self.worker.max_advance, self.worker.reserve
        limit = self.max_model_len + reserve - 1
        reqs, rooms = [], []
        for r in self.running:
            a = ahead.get(r, 0)
            room = r.seq_len + a * adv + reserve
            if a and (len(r.output_token_ids) + a >= r.params.max_tokens or room > limit):
                continue
            reqs.append(r)
            rooms.append(room)
        return reqs, rooms

    def _grow(self, reqs: list[Request], rooms: list[int]) -> bool:
        """`rooms` KV slots for the next step of `reqs`, without preempting; False if out of blocks."""
        try:
            for req, room in zip(reqs, rooms):
                if room > len(req.blocks) * self.block_size:
                    self._grow_to(req, room)
        except OutOfBlocks:
            return False
        return True

    def _drain(self) -> list[StepOutput]:
        """Collect every launched step (the overlap schedule's; none otherwise)."""
        outs: list[StepOutput] = []
        while self.worker.unread():
            outs += self._emit(*self.worker.collect())
        return outs

    def _pending(self, req: Request) -> int:
        """Tokens (prompt, then any generated before a preemption) whose KV is not written yet."""
        return len(req.prompt_token_ids) + len(req.output_token_ids) - req.seq_len

    def _prefill_step(self) -> list[StepOutput]:
        """Prefill the oldest admitted requests' pending tokens, at most max_prefill_tokens in all
        (and no more tokens and requests than the prefill graphs hold): the last one taken may
        get only a chunk (its KV grows over several steps). Requests whose pending tokens are all
        written sample their next token and join `running`. Decode steps still in flight are
        collected once the prefill is launched, while the device runs it."""
        budget = self.cfg.max_prefill_tokens or sys.maxsize
        rows = sys.maxsize
        graphed = self.worker.prefill_limits()
        if graphed is not None:  # a step the prefill graphs hold
            budget, rows = min(budget, graphed[0]), graphed[1]
        batch: list[Request] = []
        chunks: list[int] = []
        for req in self.prefilling:
            if budget == 0 or len(batch) == rows:
                break
            chunks.append(min(self._pending(req), budget))
            batch.append(req)
            budget -= chunks[-1]
        drained: list[StepOutput] = []

        def collect() -> None:  # (a failure here is no pass's: every request fails, as before)
            self.in_flight = []
            drained.extend(self._served(self._drain()))
            self.in_flight = batch

        self.in_flight = batch
        tokens = self.worker.prefill(batch, chunks, meanwhile=collect if self.worker.unread() else None)
        for r in batch:
            self.prefixes.register(r)
        done = [(r, t) for r, t in zip(batch, tokens) if self._pending(r) == 0]
        for r, _ in done:
            self.prefilling.remove(r)
            self.running.append(r)
        outs = self._emit([r for r, _ in done], [t for _, t in done])
        self.in_flight = []
        return drained + outs

    def _blocks_for(self, n_slots: int) -> int:
        return -(-n_slots // self.block_size)

    def _grow_to(self, req: Request, n_slots: int) -> None:
        extra = self._blocks_for(n_slots) - len(req.blocks)
        if extra > 0:
            req.blocks += self.allocator.allocate(extra)

    def _admit(self) -> list[Request]:
        admitted: list[Request] = []
        busy, opening = len(self.running) + len(self.prefilling), self.prefixes.opening(self.prefilling)
        # (requests whose grammar is still compiling are passed over: engine/grammars.py)
        for req in [r for r in self.waiting if r.grammar_job is None]:
            if busy + len(admitted) >= self.cfg.max_num_seqs:
                break
            if self.prefixes.waits(req, opening):
                break  # its prompt's first block is being computed: shared next step
            shared = self.prefixes.lookup(req)
            n = len(req.prompt_token_ids) + len(req.output_token_ids) + self.worker.reserve
            if self._blocks_for(n) - len(shared) > self.allocator.num_free:
                break
            self.waiting.remove(req)
            if shared:
                self.prefixes.share(req, shared)
            self.prefixes.admitted(req, opening)
            self._grow_to(req, n)
            if req.params.processes_logits:  # (max_num_seqs rows: one for every busy request)
                self._logits_rows().acquire(req, self.eos_token_ids)
            req.status = Status.RUNNING
            admitted.append(req)
        self.prefilling += admitted
        return admitted

    def _reserve_step_slots(self) -> list[Request]:
        """Make room for this step's writes; preempt (recompute later) the newest when out of blocks.
        Runs only when nothing is prefilling, so `running` holds every block-owning request."""
        reserve, i = self.worker.reserve, 0
        while i < len(self.running):  # (the newest are preempted from the end)
            try:
                self._grow_to(self.running[i], self.running[i].seq_len + reserve)
                i += 1
            except OutOfBlocks:
                self._preempt(self.running[-1])
        return list(self.running)

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self._free_blocks(req)
        self._logits_rows().release(req)  # (its row is rebuilt from its tokens when admitted)
        req.blocks, req.seq_len, req.status = [], 0, Status.WAITING
        self.waiting.appendleft(req)

    def _emit(self, reqs: list[Request], tokens: list[list[int]]) -> list[StepOutput]:
        outs: list[StepOutput] = []
        for req, toks in zip(reqs, tokens):
            if req.status is not Status.RUNNING:  # overlap: finished (EOS, abort) after a launch
                self.dropped_rows += 1
                continue
            delta, taken = "", []
            first = not req.output_token_ids  # (prompt logprobs go with the first output)
            if req.params.max_tokens == 0:  # prompt scored (prompt_logprobs), nothing generated
                toks = []
                self.running.remove(req)
                self._finish(req, "length")
            out_ids, checker, grammar = req.output_token_ids, req.checker, req.grammar
            assert checker is not None
            room = self.max_model_len - len(req.prompt_token_ids)  # (outputs that fit the context)
            for t in toks:
                out_ids.append(t)
                taken.append(t)
                piece, reason = checker.append(t)
                delta += piece
                if reason is None and grammar is not None:
                    if not grammar.accept([t]):  # (masked: it cannot happen)
                        raise RuntimeError(f"request {req.rid}: token {t} is outside its grammar")
                    if grammar.terminated:
                        reason = "stop"  # the grammar is complete
                if reason is None and len(out_ids) >= room:
                    reason = "length"  # the context is full
                if reason is not None:
                    self.running.remove(req)
                    self._finish(req, reason)
                    break
            req.stats.generated_tokens = len(req.output_token_ids)
            logprobs = None
            if req.params.logprobs is not None:
                if req.step_logprobs is None or len(req.step_logprobs) < len(taken):
                    raise RuntimeError(f"request {req.rid}: its step produced no logprobs")
                logprobs, req.step_logprobs = req.step_logprobs[:len(taken)], None
            prompt = None
            if first and req.params.prompt_logprobs is not None:  # (a 1-token prompt: [None])
                prompt = req.prompt_logprobs or [None]
            outs.append(StepOutput(req, delta, taken, logprobs, prompt))
        return outs

    def _finish(self, req: Request, reason: str) -> None:
        req.status, req.finish_reason = Status.FINISHED, reason
        self._free_blocks(req)
        req.blocks = []
        self._logits_rows().release(req)

    def _free_blocks(self, req: Request) -> None:
        self.allocator.free(req.blocks)
        self.prefixes.release(req, req.blocks)

    def _logits_rows(self) -> LogitsState:
        state = self.worker.executor.logits_state
        assert state is not None, "the builder gives every executor its logits state"
        return state
