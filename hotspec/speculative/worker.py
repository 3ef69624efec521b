"""EAGLE speculative decoding: prefill, then per step draft -> verify -> accept -> draft_extend.

The phases after prefill are pure tensor functions (speculative/phases.py); the step executor
(runtime/step_executor.py) runs them as programs: each shape's fused step (`EagleStep`) and, when
the adaptive policy turns speculation off, plain decoding (`PlainDecode`, keeping the target's
features), after which the draft catches up on those tokens (`CatchUp`) before the next
speculative step. The policy chooses the program before each step. A request's draft state
(`Request.spec`) is its row of the last step's outputs, which stay on the device.

Inside a step the host reads exactly one tensor (accepted lengths and tokens). With the overlap
schedule the engine launches step N+1 before it reads step N (core/launches.py).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from hotspec.core.forward_batch import ForwardBatch
from hotspec.core.request import DraftRow, Request, Status
from hotspec.core.spec_shape import OFF, SpecShape
from hotspec.core.spec_stats import SpecStats
from hotspec.runtime.decode import DecodeOut, PlainDecode
from hotspec.runtime.prefill import Prefilled, PrefillGraphs, PrefillIn
from hotspec.runtime.step_executor import StepExecutor, constrained
from hotspec.runtime.timing import graph_replay_ms
from hotspec.runtime.worker import Worker
from hotspec.speculative.adaptive import AdaptivePolicy
from hotspec.speculative.catch_up import MAX_PENDING, CatchUp
from hotspec.speculative.io import DraftState, SpecShapes
from hotspec.speculative.phases import EagleModels, EaglePhases
from hotspec.speculative.programs import DraftStates, EagleStep, PhasedStep, shape_tag

__all__ = ["EagleWorker", "SpecStats"]


@dataclass
class _Launch:
    """What a launched step carries to its collection."""

    shape: SpecShape
    t_launch: float  # when it was launched; -1: not timed (it paid a catch-up)
    feature: torch.Tensor | None = None  # plain decode: the target features, for the catch-up


class EagleWorker(Worker):
    """`shapes`: the first is the primary (its phase graphs, and the shape without a policy);
    OFF among them is plain decoding. `fuse_step`: each shape's step as one graph (else the
    first shape's three phase graphs); `profile`: the phase graphs too, timed."""

    def __init__(self, models: EagleModels, executor: StepExecutor, shapes: list[SpecShape],
                 policy: AdaptivePolicy | None = None, fuse_step: bool = True,
                 profile: bool = False) -> None:
        super().__init__(executor, models.target, models.target_runner, feature=models.feature)
        if executor.overlap and not fuse_step:
            raise ValueError("the overlap schedule launches the fused step graph: needs fuse_step")
        if len(shapes) > 1 and not fuse_step:
            raise ValueError("several step shapes run as fused step graphs: needs fuse_step")
        self.models, self.policy, self.fuse_step = models, policy, fuse_step
        self.shapes = list(dict.fromkeys(shapes))
        self.stats = SpecStats()
        self.states = DraftStates()
        # Every shape's phases, over the same KV, carry and draft state: the state holds the
        # largest topk's candidates, so any shape can take the step after any other.
        draft, dev = models.draft, executor.device
        state_k = max(s.topk for s in self.shapes)
        self.phases_of: dict[SpecShape, EaglePhases] = {
            s: EaglePhases(models, executor.block_size, SpecShapes(
                s, executor.max_blocks_per_seq,
                draft.hidden_size, draft.target_feature_size, models.target.lm_head.weight.dtype,
                dev, state_topk=state_k), executor.carry, executor.logits_state)
            for s in self.shapes if not s.off}
        primary = next(s for s in self.shapes if not s.off)
        self.phases = self.phases_of[primary]
        executor.reserve = max(p.reserve for p in self.phases_of.values())
        executor.max_advance = max(p.width for p in self.phases_of.values())
        g = executor.graphs
        self.steps = {s: EagleStep(p, g, self.states, shape_tag(s, self.shapes[0]),
                                   carried=executor.carry is not None)
                      for s, p in self.phases_of.items()} if fuse_step else {}
        # (fused and not profiled: only the graphs of steps with a grammar)
        self.phased = PhasedStep(self.phases, g, self.states, self.stats,
                                 full_only=fuse_step and not profile)
        self.off = PlainDecode(g, models.target_runner, models.target, executor.max_blocks_per_seq,
                               executor.carry, feature=models.feature,
                               logits_state=executor.logits_state) if OFF in self.shapes else None
        self.prefill_draft: PrefillGraphs | None = None
        if self.prefill_graphs is not None:  # the draft's prefill over the target's feature
            self.prefill_draft = PrefillGraphs(
                executor, "prefill_draft", self._draft_prefill_step, DraftState,
                models.draft_runner.kv.trash_slot,
                hidden_in=(draft.target_feature_size, models.target.lm_head.weight.dtype))
        self.catch_up = CatchUp(self.phases, executor,
                                policy.observe_catch_up if policy is not None else None,
                                self.prefill_draft)
        self.shape = primary  # the shape the next step runs (the policy's choice, when there is one)
        self._planned: tuple[int, SpecShape] | None = None  # (batch, shape) chosen ahead
        self._launched: deque[SpecShape] = deque()  # the shapes of the uncollected launches
        self._last_read = 0.0  # when the host last read a step
        self._timed = True  # False while a prefill collects steps: its host work is in their wait
        ids = draft.to_target_ids(torch.arange(draft.draft_vocab_size, device=dev))
        self.draft_vocab: frozenset[int] = frozenset(ids.tolist())  # host-side, for statistics
        self.profile = profile
        self._synced = False  # a phased step (a grammar's) is unread

    # -- the contract's optional capabilities ----------------------------------------------------
    @property
    def spec_stats(self) -> SpecStats:
        return self.stats

    @property
    def overlapping(self) -> bool:
        """Not while the phases are profiled: that runs them one by one."""
        return self.executor.overlap and not self.profile

    def chosen_shapes(self) -> dict[int, str]:
        return dict(self.policy.chosen) if self.policy is not None else {}

    def record_served(self, tokens: list[int]) -> None:
        """FR-Spec hot-set coverage of the tokens the engine kept."""
        self.stats.add_served(tokens, self.draft_vocab)

    def start_up(self) -> list[str]:
        """Under the adaptive policy: each shape's step time at every captured batch size (graph
        replays, greedy) seeds its costs, and the catch-up's kernels are compiled and timed."""
        if self.policy is None:
            return []
        ex = self.executor
        if ex.graphs.mode != "cuda":
            return ["speculative-adaptive step times: measured as the steps run (no CUDA graphs)"]
        sizes = ex.graphs.batch_sizes
        lines = ["speculative-adaptive step times, ms (shape x batch size):",
                 "shape   " + " ".join(f"{b:>6}" for b in sizes)]
        for shape in self.shapes:
            graph = self.off.graph(True) if shape.off and self.off else self.steps[shape].graph(True)
            cells = []
            for bs in sizes:
                replay = graph.captured(bs)
                if replay is None:
                    cells.append(f"{'-':>6}")
                    continue
                ms = graph_replay_ms(replay, 5)
                self.policy.costs.seed(shape, bs, ms)
                cells.append(f"{ms:>6.3f}")
            lines.append(f"{shape.label:<7} " + " ".join(cells))
        if self.off is not None:
            t0 = time.perf_counter()
            runs = self.catch_up.warm()
            how = "draft prefill graphs" if self.prefill_draft is not None else "eager passes"
            lines.append(f"speculative-adaptive: the draft's catch-up after plain decode steps "
                         f"({how}) timed in {runs} passes ({time.perf_counter() - t0:.1f} s)")
        return lines

    # -- prefill (eager, ragged) -----------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, reqs: list[Request], chunks: list[int] | None = None, *,
                meanwhile: Callable[[], None] | None = None) -> list[list[int]]:
        """Target and draft KV for the chunks; a request whose chunk was its last samples its
        next token and gets its draft state."""
        m = self.models
        pre = Prefilled(self, reqs, chunks, None if meanwhile is None else
                        lambda: self._untimed(meanwhile))
        assert pre.feature is not None
        # The draft reads token p+1 with the target feature at p: the chunk shifted by one, closed
        # by the token after it: the next chunk's first pending token, or the sampled one.
        shifted: list[int] = []
        for r, t, nxt in zip(reqs, pre.tokens, pre.next):
            after = nxt if nxt is not None else (r.prompt_token_ids + r.output_token_ids)[r.seq_len + len(t)]
            shifted += t[1:] + [after]
        if pre.graphed is not None and self.prefill_draft is not None:
            ids = torch.zeros_like(pre.graphed.input_ids)
            ids[:len(shifted)] = torch.tensor(shifted, dtype=torch.long)
            x = replace(pre.graphed, input_ids=ids, hidden_in=pre.feature)
            out = self.prefill_draft.run(x)
            assert isinstance(out, DraftState)  # (the graph's buffers: the next prefill reuses them)
            logp, ids_k, feat = out.topk_logp.clone(), out.topk_ids.clone(), out.feature.clone()
        else:
            assert pre.batch is not None
            dfb = replace(pre.batch, input_ids=torch.tensor(shifted, dtype=torch.long,
                                                             device=self.executor.device),
                          hidden_in=pre.feature, attn_meta=None)
            h_logits, h_feat = m.draft_runner.forward(dfb)
            logp, ids_k, _ = m.draft_topk(h_logits[pre.last], self.phases.state_k)
            feat = h_feat[pre.last]
        for i, r in enumerate(reqs):
            if pre.final[i]:
                r.spec.draft = DraftRow(logp, ids_k, feat, i)
                r.spec.pending = []
        self.states.forget()
        return pre.advance()

    def _draft_prefill_step(self, x: PrefillIn, fb: ForwardBatch) -> DraftState:
        """The graphed draft prefill: the draft's top-k and feature at each request's last token."""
        h_logits, h_feat = self.models.draft_runner.forward(fb)
        logp, ids, _ = self.models.draft_topk(h_logits[x.last], self.phases.state_k)
        return DraftState(topk_logp=logp, topk_ids=ids, feature=h_feat[x.last])

    # -- steps -----------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self, reqs: list[Request]) -> list[list[int]]:
        """One step, launched and read (the phase graphs when they run the step: profiled
        without a policy, or not fused)."""
        if self.fuse_step and self.profile and self.policy is None and self.phased.full_only:
            raise RuntimeError("the phase graphs were not built: construct the engine with "
                               "profile_phases (or without fuse_spec_step) to run phases one by one")
        if not self.fuse_step or (self.profile and self.policy is None):
            if self.shape != self.shapes[0]:
                raise RuntimeError(f"the phase graphs run the first shape {self.shapes[0].label}, "
                                   f"not {self.shape.label}")
            self.phased.launch(self.executor, reqs, None, self.profile)
            c = self.executor.collect()
            self._count(self.shape, c.reqs, c.accepted)
            return c.tokens
        return super().step(reqs)

    def drains_before(self, reqs: list[Request]) -> bool:
        """The first speculative step after plain decode steps waits for them to be read: its
        draft first catches up on their tokens."""
        if super().drains_before(reqs) or (self._synced and self.unread() > 0):
            return True  # (a phased step leaves no carry: the next launch reads it first)
        if self.policy is None:
            return False
        shape = self._choose(reqs)
        self._planned = (len(reqs), shape)
        return not shape.off and OFF in self._launched

    def _choose(self, reqs: list[Request]) -> SpecShape:
        if self._planned is not None and self._planned[0] == len(reqs):
            shape = self._planned[1]
        else:
            assert self.policy is not None
            shape = self.policy.choose(len(reqs), [r.rid for r in reqs]).shape
        self._planned = None
        return shape

    @torch.inference_mode()
    def launch(self, reqs: list[Request]) -> None:
        """Enqueue the step for `reqs`: the chosen shape's fused step, or a plain decode step."""
        t0 = time.perf_counter()
        while len(self._launched) > self.unread():  # the engine dropped failed launches
            self._launched.popleft()
        if self.policy is not None:
            shape = self._choose(reqs)
            # a speculative step needs the draft caught up on every plain step: while one is
            # unread, plain decoding goes on
            self.shape = OFF if not shape.off and OFF in self._launched else shape
        if self.shape.off:
            assert self.off is not None
            behind = [r for r in reqs if len(r.spec.pending) >= MAX_PENDING]
            if behind:
                self._run_catch_up(behind, len(reqs))
            tag = _Launch(OFF, t0)
            out = self.executor.launch(self.off, reqs, tag)
            assert isinstance(out, DecodeOut) and out.feature is not None
            tag.feature = out.feature.clone()  # (the graph's buffer: the next replay overwrites it)
            self.states.forget()
        else:
            behind = [r for r in reqs if r.spec.pending]
            if behind:
                self._run_catch_up(behind, len(reqs))
            if constrained(reqs):  # the phase graphs of the first shape (not timed: host masks)
                self.shape = self.phases.shapes.shape
                self.phased.launch(self.executor, reqs, _Launch(self.shape, -1.0))
                self._synced = True
            else:
                # (after a catch-up the step's time is the switch's cost, not the shape's: not
                # measured)
                self.steps[self.shape].launch(self.executor, reqs,
                                              _Launch(self.shape, -1.0 if behind else t0))
        self._launched.append(self.shape)
        phase = "decode" if self.shape.off else "step"
        self.stats.phase_calls[phase] += 1
        if self.profile:  # (the policy's steps are timed whole, each read before the next)
            if self.executor.device.type == "cuda":
                torch.cuda.synchronize()
            # (Counter's stubs only know int counts; float seconds work the same at runtime)
            self.stats.phase_seconds[phase] += time.perf_counter() - t0  # type: ignore[assignment]

    def _untimed(self, collect: Callable[[], None]) -> None:
        """`collect` (steps read after a prefill's launch) without timing those steps for the
        policy: their wait holds the prefill's host work."""
        self._timed = False
        try:
            collect()
        finally:
            self._timed = True

    def _run_catch_up(self, reqs: list[Request], bs: int) -> None:
        self.catch_up.run(reqs, bs)
        self.states.forget()
        self.stats.phase_calls["catch_up"] += 1

    def collect(self) -> tuple[list[Request], list[list[int]]]:
        """The oldest launched step's requests and emitted tokens. Requests that finished since
        (a stop in the step before, an abort) are not counted."""
        c = self.executor.collect()
        self._launched.popleft()
        if not self.unread():
            self._synced = False
        tag: _Launch = c.tag
        now = time.perf_counter()
        if self.policy is not None:  # the step's time: since its launch, or since the last read
            ms = (now - max(tag.t_launch, self._last_read)) * 1e3 \
                if tag.t_launch >= 0 and self._timed else None
            self.policy.observe(tag.shape, len(c.reqs), ms, [a - 1 for a in c.accepted],
                                [r.rid for r in c.reqs])
        self._last_read = now
        if tag.feature is not None:  # plain decode: the draft catches up on these tokens later
            for i, (r, toks) in enumerate(zip(c.reqs, c.tokens)):
                if r.status is not Status.FINISHED:  # (its length already counts the token)
                    r.spec.pending.append((r.seq_len - 1, tag.feature[i], toks[-1]))
        self._count(tag.shape, c.reqs, c.accepted)
        return c.reqs, c.tokens

    def _count(self, shape: SpecShape, reqs: list[Request], accepted: list[int]) -> None:
        """A step's statistics: steps per shape, and for each request still running a step,
        and for a speculative step its accepted count and the draft tokens it verified."""
        self.stats.shape_steps[shape.label] += 1
        for r, a in zip(reqs, accepted):
            if r.status is Status.FINISHED:
                continue
            r.stats.spec_steps += 1
            if not shape.off:
                self.stats.accept_hist[a] += 1
                self.stats.drafted += shape.num_draft_tokens - 1
