"""EAGLE speculative decoding: prefill, then per step draft -> verify -> accept -> draft_extend.

The phases after prefill are pure tensor functions (speculative/phases.py), served by the
GraphRunner (CUDA graph, static buffers, or eager); this is the host side that chains them. Per-
request draft state between steps lives on the Request (`_DraftState` rows): the draft's top-k for
the token after the root and the draft feature that goes with it. Inside `step` the host reads
exactly one tensor (accepted lengths and tokens).

Graphs: the fused `step` (and `step[sample]`) by default; the separate phase graphs (`draft`,
`verify`, `verify[sample]`, `draft_extend`) only when the step runs as phases (`fuse_step` off)
or the phases are profiled. The fused step is launched (`launch`) and read (`collect`)
separately, so that with the overlap schedule the engine can launch step N+1 before it reads
step N (engine/launches.py). Step N+1 then takes a request's sequence length, root token and RNG
offset from the rows step N left in the `carry` buffers (seq + accept_len, the bonus token,
offset + accept_len), and its draft state from step N's outputs, which stay on the device; blocks
are reserved for the largest advance.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from dataclasses import dataclass

import torch

from hotspec.engine.launches import HostCopy, Launches
from hotspec.engine.request import Request, Status
from hotspec.engine.vanilla_worker import prefill_chunks, sample_for
from hotspec.models.draft_head import DraftHead
from hotspec.models.llama import LlamaForCausalLM
from hotspec.runtime.batch_builder import block_table_tensor, last_token_index, prefill_batch
from hotspec.runtime.forward_batch import ForwardBatch, ForwardMode
from hotspec.runtime.graph_runner import GraphRunner, PhaseGraph
from hotspec.runtime.model_runner import ModelRunner
from hotspec.runtime.phase_io import sampling_fields
from hotspec.speculative.adaptive import AdaptivePolicy, SpecShape
from hotspec.speculative.io import (
    Accepted,
    DraftIn,
    DraftState,
    ExtendIn,
    ExtendOut,
    OffIn,
    OffOut,
    SpecShapes,
    StepIn,
    StepOut,
    VerifyIn,
    emitted_rows,
)
from hotspec.speculative.phases import EaglePhases
from hotspec.speculative.stats import SpecStats
from hotspec.speculative.tree import DraftTree

__all__ = ["EagleWorker", "SpecStats"]

_OFF = (0, 0, 1)  # plain decode (speculative/adaptive.py's OFF)
MAX_PENDING = 64  # plain decode steps after which the draft catches up even while off
_STATE = ("topk_logp", "topk_ids", "feature")  # inputs the last step left on the device
_CPU = torch.device("cpu")  # the graph runner moves host inputs to the device itself


@dataclass
class _DraftState:
    topk_logp: torch.Tensor  # [K] draft log-probs of the depth-1 candidates
    topk_ids: torch.Tensor  # [K] their target ids
    feature: torch.Tensor  # [H] draft feature fed with the depth-1 candidates


@dataclass
class _PhaseGraphs:
    """The step as separate phase graphs (--no-fuse-spec-step, or profiled phases)."""

    draft: PhaseGraph[DraftIn, DraftTree]
    verify: PhaseGraph[VerifyIn, Accepted]
    verify_sample: PhaseGraph[VerifyIn, Accepted]
    draft_extend: PhaseGraph[ExtendIn, ExtendOut]


class EagleWorker:
    def __init__(self, target: LlamaForCausalLM, draft: DraftHead, target_runner: ModelRunner,
                 draft_runner: ModelRunner, graphs: GraphRunner, block_size: int,
                 device: torch.device, num_steps: int, topk: int, num_draft_tokens: int,
                 max_blocks_per_seq: int, profile: bool = False, fuse_step: bool = False,
                 overlap: bool = False, max_rows: int = 1,
                 extra_shapes: tuple[tuple[int, int, int], ...] = (),
                 policy: AdaptivePolicy | None = None) -> None:
        if overlap and not fuse_step:
            raise ValueError("the overlap schedule launches the fused step graph: needs fuse_step")
        if extra_shapes and not fuse_step:
            raise ValueError("several step shapes run as fused step graphs: needs fuse_step")
        self.target, self.draft, self.graphs, self.device = target, draft, graphs, device
        self.block_size = block_size
        self.profile = profile
        self.fuse_step = fuse_step  # one `step` graph, except while profiling phases
        self.overlap = overlap
        carry = None
        if overlap:  # what step N+1 reads of step N's rows (module docstring)
            rows = max(max_rows, graphs.max_bs)
            carry = {k: torch.zeros(rows, dtype=torch.long, device=device)
                     for k in ("seq", "root", "offsets")}
        # Every shape's phases, over the same KV, carry and draft state: the state holds the
        # largest topk's candidates, so any shape can take the step after any other.
        primary = (num_steps, topk, num_draft_tokens)
        self.shapes = list(dict.fromkeys([primary, *extra_shapes]))
        state_k = max(k for _, k, _ in self.shapes)
        self.carry = carry
        self.phases_of: dict[tuple[int, int, int], EaglePhases] = {}
        for steps_, topk_, ntok_ in [s for s in self.shapes if s != _OFF]:
            shapes = SpecShapes(steps_, topk_, ntok_, max_blocks_per_seq, draft.hidden_size,
                                draft.target_feature_size, target.lm_head.weight.dtype, device,
                                state_topk=state_k)
            self.phases_of[(steps_, topk_, ntok_)] = EaglePhases(
                target, draft, target_runner, draft_runner, block_size, shapes, carry)
        self.phases = self.phases_of[primary]
        self.shape = primary  # the shape the next step runs (the policy's choice, when there is one)
        self.policy = policy
        self._planned: tuple[int, tuple[int, int, int]] | None = None  # (batch, shape) chosen ahead
        # per launch: its shape, launch time, and for plain decode the target features it returns
        self._launched: deque[tuple[tuple[int, int, int], float, torch.Tensor | None]] = deque()
        self._last_read = 0.0  # when the host last read a step
        # per request: (position, target feature, token) of each plain decode step read since
        # the draft last ran over its tokens
        self._pending: weakref.WeakKeyDictionary[Request, list[tuple[int, torch.Tensor, int]]] = (
            weakref.WeakKeyDictionary())
        self.topk, self.width = topk, self.phases.width
        # KV slots a step writes beyond seq_len, and its largest advance, over every shape
        self.reserve = max(p.reserve for p in self.phases_of.values())
        self.max_advance = max(p.width for p in self.phases_of.values())
        self.launches = Launches()
        self.stats = SpecStats()
        # the last step's per-request states and the batch tensors they are rows of
        self._last_states: tuple[list[_DraftState], DraftState] | None = None
        self.restacks = 0  # steps that had to stack the states (the batch changed)
        ids = draft.to_target_ids(torch.arange(draft.draft_vocab_size, device=device))
        self.draft_vocab: frozenset[int] = frozenset(ids.tolist())  # host-side, for statistics
        self.step_graphs: dict[tuple[int, int, int], tuple[PhaseGraph[StepIn, StepOut], ...]] = {}
        for shape in self.shapes:
            if shape != _OFF:
                self._register(shape, carried=carry is not None)
        self.off_graphs: tuple[PhaseGraph[OffIn, OffOut], ...] = ()
        if _OFF in self.shapes:
            self.off_graphs = tuple(self._register_off(sampled, carry is not None)
                                    for sampled in (False, True))

    def _register(self, shape: tuple[int, int, int], carried: bool) -> None:
        """The graphs that run: each shape's fused step (the first shape's named `step`, the
        others `step@S/K/N`), and the first shape's phases when the step runs as phases or they
        are profiled (the phase benchmarks replay both)."""
        p, g = self.phases_of[shape], self.graphs
        s = p.shapes
        tag = "" if shape == self.shapes[0] else "@{}/{}/{}".format(*shape)
        if self.fuse_step:
            self.step_graphs[shape] = (
                g.register("step" + tag, p.step, lambda bs: StepIn.example(s, bs, carried=carried),
                           StepOut, device_inputs=_STATE, publish=("emitted",)),
                g.register("step[sample]" + tag, p.step,
                           lambda bs: StepIn.example(s, bs, sampled=True, carried=carried),
                           StepOut, device_inputs=_STATE, publish=("emitted",)))
        if tag:
            return
        self.phase_graphs: _PhaseGraphs | None = None
        if not self.fuse_step or self.profile:
            tree = ("tokens", "parents", "depth", "mask")
            self.phase_graphs = _PhaseGraphs(
                g.register("draft", p.draft_tree, lambda bs: DraftIn.example(s, bs), DraftTree,
                           device_inputs=_STATE),
                g.register("verify", p.verify_accept, lambda bs: VerifyIn.example(s, bs), Accepted,
                           device_inputs=tree),
                g.register("verify[sample]", p.verify_accept,
                           lambda bs: VerifyIn.example(s, bs, sampled=True), Accepted,
                           device_inputs=tree),
                g.register("draft_extend", p.draft_extend, lambda bs: ExtendIn.example(s, bs),
                           ExtendOut, device_inputs=("acc_tokens", "accept_len", "bonus", "acc_feature")))

    def _register_off(self, sampled: bool, carried: bool) -> PhaseGraph[OffIn, OffOut]:
        """Plain decode (the policy's "off"): `decode`, `decode[sample]`."""
        s = self.phases.shapes

        def example(bs: int) -> OffIn:
            return OffIn.example(s, bs, sampled, carried)

        return self.graphs.register("decode[sample]" if sampled else "decode", self.phases.decode,
                                    example, OffOut, publish=("emitted",))

    def measure_costs(self, replays: int = 5) -> str:
        """Seed the adaptive policy's step costs with each shape's graph replay time (greedy) at
        every captured batch size; returns the table for the start-up log. Without CUDA graphs
        the policy measures each shape as it first runs."""
        if self.policy is None or self.graphs.mode != "cuda":
            return "measured as the steps run (no CUDA graphs)"
        from hotspec.benchmark.device import graph_replay_ms

        sizes = self.graphs.batch_sizes
        lines = ["shape   " + " ".join(f"{b:>6}" for b in sizes)]
        for shape in self.shapes:
            graph = self.off_graphs[0] if shape == _OFF else self.step_graphs[shape][0]
            cells = []
            for bs in sizes:
                replay = graph.captured(bs)
                if replay is None:
                    cells.append(f"{'-':>6}")
                    continue
                ms = graph_replay_ms(replay, replays)
                self.policy.costs.seed(SpecShape(*shape), bs, ms)
                cells.append(f"{ms:>6.3f}")
            lines.append(f"{SpecShape(*shape).label:<7} " + " ".join(cells))
        return "\n".join(lines)

    def warm_catch_up(self, lengths: tuple[int, ...] = (1, 2, 4, 8, 16, 32, MAX_PENDING)) -> int:
        """Run the catch-up's eager draft pass once for every captured batch size and pending
        length (powers of two: the kernels' block shapes), at a short and a long context, writing
        only the trash slot: its kernels compile at start-up rather than on the first switch
        back from plain decode, mid-serving. Then a one-token pass at each batch size, timed,
        seeds the policy's catch-up cost. Returns the passes run (0: no plain-decode shape)."""
        if _OFF not in self.shapes:
            return 0
        p, dev = self.phases, self.device
        trash = p.draft_runner.kv.trash_slot
        blocks = p.shapes.max_blocks_per_seq
        runs = 0
        for bs in self.graphs.batch_sizes:
            for i, n in enumerate((*lengths, 1)):  # (the last: the timed one)
                for kv in sorted({n, min(2048, blocks * self.block_size)}):
                    timed = i == len(lengths) and kv == n
                    if dev.type == "cuda":
                        torch.cuda.synchronize(dev)
                    t0 = time.perf_counter()
                    q = torch.full((bs,), n, dtype=torch.long, device=dev)
                    fb = ForwardBatch(
                        mode=ForwardMode.PREFILL,
                        input_ids=torch.zeros(bs * n, dtype=torch.long, device=dev),
                        positions=torch.arange(kv - n, kv, device=dev).repeat(bs),
                        out_cache_loc=torch.full((bs * n,), trash, dtype=torch.long, device=dev),
                        q_lens=q, kv_lens=torch.full((bs,), kv, dtype=torch.long, device=dev),
                        block_tables=torch.zeros((bs, blocks), dtype=torch.int32, device=dev),
                        width=None, cu_seqlens_q=torch.arange(bs + 1, device=dev) * n, max_q=n,
                        max_kv=kv, hidden_in=torch.zeros(bs * n, self.draft.target_feature_size,
                                                         dtype=p.shapes.dtype, device=dev))
                    h_logits, _ = p.draft_runner.forward(fb)
                    p.draft_topk(h_logits[last_token_index(fb)], p.state_k)
                    if dev.type == "cuda":
                        torch.cuda.synchronize(dev)
                    runs += 1
                    if timed and self.policy is not None:
                        self.policy.observe_catch_up(bs, (time.perf_counter() - t0) * 1e3)
        return runs

    def _timed(self, phase: str, t0: float) -> float:
        self.stats.phase_calls[phase] += 1
        if not self.profile:
            return t0
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()
        # (Counter's stubs only know int counts; float seconds work the same at runtime)
        self.stats.phase_seconds[phase] += now - t0  # type: ignore[assignment]
        return now

    # -- prefill (eager, ragged) ---------------------------------------------------------------
    def prefill(self, reqs: list[Request], chunks: list[int] | None = None) -> list[list[int]]:
        """Target and draft KV for `chunks[i]` pending tokens after seq_len (all when None); a
        request whose chunk was its last samples its next token and gets its draft state."""
        p = self.phases
        tokens, final = prefill_chunks(reqs, chunks)
        fb = prefill_batch(reqs, tokens, self.block_size, self.device)
        hidden, aux = p.target_runner.forward(fb)
        last = last_token_index(fb)
        rows = [i for i, f in enumerate(final) if f]
        nxt: dict[int, int] = {}
        if rows:
            sampled = sample_for([reqs[i] for i in rows], self.target.compute_logits(hidden[last[rows]]))
            nxt = dict(zip(rows, sampled.tolist()))
        # The draft reads token p+1 with the target feature at p: the chunk shifted by one, closed
        # by the token after it: the next chunk's first pending token, or the sampled one.
        shifted = []
        for i, (r, t) in enumerate(zip(reqs, tokens)):
            after = nxt[i] if final[i] else (r.prompt_token_ids + r.output_token_ids)[r.seq_len + len(t)]
            shifted.append(t[1:] + [after])
        dfb = prefill_batch(reqs, shifted, self.block_size, self.device)
        dfb.hidden_in = p.feature(hidden, aux)
        h_logits, h_feat = p.draft_runner.forward(dfb)
        logp, ids, _ = p.draft_topk(h_logits[last], p.state_k)
        for i, (r, t) in enumerate(zip(reqs, tokens)):
            r.seq_len += len(t)
            if final[i]:
                r.spec_state = _DraftState(logp[i], ids[i], h_feat[last[i]])
                self._pending.pop(r, None)
        return [[nxt[i]] if final[i] else [] for i in range(len(reqs))]

    # -- one speculative step ----------------------------------------------------------------
    @property
    def overlapping(self) -> bool:
        """Whether the engine may launch a step before collecting the last one (not while the
        phases are profiled: that runs them one by one)."""
        return self.overlap and not self.profile

    @torch.inference_mode()
    def step(self, reqs: list[Request]) -> list[list[int]]:
        """One speculative step, launched and read."""
        if self.fuse_step and (not self.profile or self.policy is not None):
            self.launch(reqs)  # (the adaptive policy's shapes run as fused steps, profiled or not)
            return self.collect()[1]
        return self._phases_step(reqs)

    def _inputs(self, reqs: list[Request], src: bool, sampled: bool) -> StepIn:
        """The step's inputs: host tensors and the requests' draft states (device tensors); `src`:
        the rows of unread steps' outputs to read instead (the fused step, overlap schedule)."""
        ahead = [self.launches.ahead(r) for r in reqs]
        if any(ahead) and not self.overlapping:
            raise RuntimeError("a speculative step was launched before the last one was read; "
                               "that needs the overlap schedule")
        if self.graphs.mode == "eager":
            self.phases_of[self.shape].max_kv = max(r.seq_len + a * self.max_advance
                                                    for r, a in zip(reqs, ahead)) + self.reserve
        # The same requests in the same order as the last step, holding the states it set: its
        # batch tensors serve as they are (no stack kernels).
        states, last = [r.spec_state for r in reqs], self._last_states
        if last is not None and len(last[0]) == len(states) and all(
                a is b for a, b in zip(states, last[0])):
            state = last[1]
        else:
            self.restacks += 1
            state = DraftState(**{f: torch.stack([getattr(s, f) for s in states]) for f in _STATE})
        return StepIn(
            seq=torch.tensor([r.seq_len for r in reqs], dtype=torch.long),
            tables=block_table_tensor(reqs, _CPU),
            root=torch.tensor([0 if a else r.last_token for r, a in zip(reqs, ahead)], dtype=torch.long),
            src=torch.tensor(self.launches.src_rows(reqs), dtype=torch.long) if src else None,
            **state.tensors(), **(sampling_fields(reqs, _CPU, ahead) if sampled else {}))

    def drains_before(self, reqs: list[Request]) -> bool:
        """Whether every launched step must be read before the next launch (of `reqs`): the
        first speculative step after plain decode steps, whose draft first catches up on their
        tokens (the engine's overlap schedule asks)."""
        if self.policy is None:
            return False
        shape = self._choose(reqs)
        self._planned = (len(reqs), shape)
        return shape != _OFF and any(s == _OFF for s, _, _ in self._launched)

    def _choose(self, reqs: list[Request]) -> tuple[int, int, int]:
        if self._planned is not None and self._planned[0] == len(reqs):
            shape = self._planned[1]
        else:
            assert self.policy is not None
            c = self.policy.choose(len(reqs), [r.rid for r in reqs]).shape
            shape = (c.num_steps, c.topk, c.num_draft_tokens)
        self._planned = None
        return shape

    @torch.inference_mode()
    def launch(self, reqs: list[Request]) -> None:
        """Enqueue the step for `reqs` (the fused step of the current shape, or a plain decode
        step); no host sync. After a speculative step each request's draft state is its row of
        the step's outputs at once (they stay on the device)."""
        t0 = time.perf_counter()
        while len(self._launched) > len(self.launches):  # the engine dropped failed launches
            self._launched.popleft()
        if self.policy is not None:
            shape = self._choose(reqs)
            off_unread = any(s == _OFF for s, _, _ in self._launched)
            # a speculative step needs the draft caught up on every plain step: while one is
            # unread, plain decode goes on
            self.shape = _OFF if shape != _OFF and off_unread else shape
        greedy = all(r.params.temperature == 0 for r in reqs)
        if self.shape == _OFF:
            self._launch_off(reqs, greedy, t0)
            return
        behind = [r for r in reqs if self._pending.get(r)] if self._pending else []
        measured = t0
        if behind:
            self._catch_up(behind, len(reqs))
            measured = -1.0  # (the catch-up is the switch's cost: this step's time is not measured)
        x = self._inputs(reqs, src=self.overlap, sampled=not greedy)
        graph = self.step_graphs[self.shape][0 if greedy else 1]
        # (borrowed from the graph: HostCopy copies it out before the next launch)
        out = graph.run(x, borrow=("emitted",))
        self._set_states(reqs, out)
        self.launches.push(reqs, graph.read_back("emitted") or HostCopy(out.emitted))
        self._launched.append((self.shape, measured, None))
        self._timed("step", t0)

    def _launch_off(self, reqs: list[Request], greedy: bool, t0: float) -> None:
        """A plain decode step; its target features are kept for the draft's catch-up."""
        long_behind = [r for r in reqs if len(self._pending.get(r, ())) >= MAX_PENDING]
        if long_behind:
            self._catch_up(long_behind, len(reqs))
        ahead = [self.launches.ahead(r) for r in reqs]
        if any(ahead) and not self.overlapping:
            raise RuntimeError("a step was launched before the last one was read; that needs the "
                               "overlap schedule")
        if self.graphs.mode == "eager":
            self.phases.max_kv = max(r.seq_len + a * self.max_advance
                                     for r, a in zip(reqs, ahead)) + self.reserve
        x = OffIn(seq=torch.tensor([r.seq_len for r in reqs], dtype=torch.long),
                  tables=block_table_tensor(reqs, _CPU),
                  root=torch.tensor([0 if a else r.last_token for r, a in zip(reqs, ahead)],
                                    dtype=torch.long),
                  src=torch.tensor(self.launches.src_rows(reqs), dtype=torch.long)
                  if self.overlap else None,
                  **({} if greedy else sampling_fields(reqs, _CPU, ahead)))
        graph = self.off_graphs[0 if greedy else 1]
        out = graph.run(x, borrow=("emitted",))
        feature = out.feature.clone()  # (the graph's buffer: the next replay overwrites it)
        self.launches.push(reqs, graph.read_back("emitted") or HostCopy(out.emitted))
        self._launched.append((_OFF, t0, feature))
        self._last_states = None
        self._timed("decode", t0)

    def _catch_up(self, reqs: list[Request], bs: int) -> None:
        """The draft over the tokens that plain decode steps committed, as at prefill: the row at
        position p reads the token after p with the target feature at p, writing the draft's KV
        there; each request's last row gives its new draft state. Its host time is the policy's
        catch-up cost for a batch of `bs` requests."""
        t0 = time.perf_counter()
        p = self.phases
        items = [self._pending.pop(r) for r in reqs]
        for it in items:
            assert [pos for pos, _, _ in it] == list(range(it[0][0], it[0][0] + len(it))), \
                "plain decode steps are caught up on in order"
        fb = prefill_batch(reqs, [[t for _, _, t in it] for it in items], self.block_size,
                           self.device, starts=[it[0][0] for it in items])
        fb.hidden_in = torch.cat([torch.stack([f for _, f, _ in it]) for it in items])
        h_logits, h_feat = p.draft_runner.forward(fb)
        last = last_token_index(fb)
        logp, ids, _ = p.draft_topk(h_logits[last], p.state_k)
        for i, r in enumerate(reqs):
            r.spec_state = _DraftState(logp[i], ids[i], h_feat[last[i]])
        self._last_states = None
        self.stats.phase_calls["catch_up"] += 1
        if self.policy is not None:
            self.policy.observe_catch_up(bs, (time.perf_counter() - t0) * 1e3)

    def collect(self) -> tuple[list[Request], list[list[int]]]:
        """The oldest launched step's requests and emitted tokens: the one host sync of a step.
        Requests that finished since (a stop in the step before, an abort) are not counted."""
        reqs, emitted = self.launches.pop()
        rows = emitted.tolist()
        shape, t_launch, feature = self._launched.popleft()
        now = time.perf_counter()
        if self.policy is not None:  # the step's time: since its launch, or since the last read
            ms = (now - max(t_launch, self._last_read)) * 1e3 if t_launch >= 0 else None
            self.policy.observe(SpecShape(*shape), len(reqs), ms, [row[0] - 1 for row in rows],
                                [r.rid for r in reqs])
        self._last_read = now
        if feature is not None:  # plain decode: the draft catches up on these tokens later
            for i, (r, row) in enumerate(zip(reqs, rows)):
                if r.status is not Status.FINISHED:
                    self._pending.setdefault(r, []).append((r.seq_len, feature[i], row[-1]))
        self._count(shape, reqs)
        return reqs, self._account(reqs, rows, spec=feature is None)

    def _count(self, shape: tuple[int, int, int], reqs: list[Request]) -> None:
        """Steps per shape, and the draft tokens a speculative step verified."""
        self.stats.shape_steps[SpecShape(*shape).label] += 1
        if shape != _OFF:
            self.stats.drafted += (shape[2] - 1) * sum(r.status is not Status.FINISHED for r in reqs)

    def _account(self, reqs: list[Request], rows: list[list[int]], spec: bool = True
                 ) -> list[list[int]]:
        """Each request's new tokens; seq_len and the statistics advance (a plain decode step
        counts as a step of the request, not in the acceptance histogram)."""
        emitted: list[list[int]] = []
        for r, row in zip(reqs, rows):
            a = row[0]
            emitted.append(row[2 : 1 + a] + [row[-1]])  # accepted drafts after the root, the bonus
            if r.status is Status.FINISHED:
                continue
            r.seq_len += a
            r.stats.spec_steps += 1
            if spec:
                self.stats.accept_hist[a] += 1
        return emitted

    def _set_states(self, reqs: list[Request], out: DraftState) -> None:
        for i, r in enumerate(reqs):
            r.spec_state = _DraftState(out.topk_logp[i], out.topk_ids[i], out.feature[i])
        state = DraftState(topk_logp=out.topk_logp, topk_ids=out.topk_ids, feature=out.feature)
        self._last_states = ([r.spec_state for r in reqs], state)

    def _phases_step(self, reqs: list[Request]) -> list[list[int]]:
        """The step as three phase graphs (--no-fuse-spec-step, or phases profiled)."""
        g = self.phase_graphs
        if self.shape != self.shapes[0]:
            raise RuntimeError(f"the phase graphs run the first shape {self.shapes[0]}, not {self.shape}")
        if g is None:
            raise RuntimeError("the phase graphs were not built: construct the engine with "
                               "profile_phases (or without fuse_spec_step) to run phases one by one")
        t0 = time.perf_counter()
        greedy = all(r.params.temperature == 0 for r in reqs)
        x = self._inputs(reqs, src=False, sampled=False)  # (sampling: verify's inputs only)
        tree = g.draft.run(DraftIn(seq=x.seq, tables=x.tables, root=x.root,
                                   topk_logp=x.topk_logp, topk_ids=x.topk_ids, feature=x.feature))
        t0 = self._timed("draft", t0)
        verify_in = VerifyIn(seq=x.seq, tables=x.tables, **tree.tensors(),
                             **({} if greedy else sampling_fields(reqs, _CPU)))
        acc = (g.verify if greedy else g.verify_sample).run(verify_in)
        t0 = self._timed("verify", t0)
        ext = g.draft_extend.run(ExtendIn(seq=x.seq, tables=x.tables, **acc.tensors()))
        self._timed("draft_extend", t0)
        rows = emitted_rows(acc).tolist()  # the one host sync of the step
        self._set_states(reqs, ext)
        self._count(self.shape, reqs)
        return self._account(reqs, rows)

    def record_served(self, tokens: list[int]) -> None:
        """Called by the engine with the tokens of a step it kept: hot-set coverage statistics."""
        self.stats.add_served(tokens, self.draft_vocab)
