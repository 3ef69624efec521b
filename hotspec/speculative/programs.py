"""The speculative step as step programs (runtime/step_executor.py): `EagleStep`, one shape's
fused step (draft -> verify -> accept -> draft_extend in one graph per batch size), and
`PhasedStep`, the same step as three phase graphs run one by one (--profile-phases,
--no-fuse-spec-step, and steps with a grammar), which times each phase.

Both read the requests' draft states (DraftRow, on the device) beside the executor's host rows.
When the batch is the last step's, in the same order, the last step's output tensors serve as
they are (no stack kernels).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import cast

import torch

from hotspec.core.launches import HostCopy
from hotspec.core.request import DraftRow, Request
from hotspec.core.spec_shape import SpecShape
from hotspec.core.spec_stats import SpecStats
from hotspec.runtime.graph_runner import GraphRunner, PhaseGraph
from hotspec.runtime.step_executor import (
    StepExecutor,
    StepRows,
    constrained,
    emitted_tokens,
    needs_sampled_graph,
)
from hotspec.speculative.io import (
    Accepted,
    DraftIn,
    DraftState,
    ExtendIn,
    ExtendOut,
    MaskedExtendIn,
    StepIn,
    StepOut,
    VerifyIn,
    emitted_rows,
)
from hotspec.speculative.phases import EaglePhases
from hotspec.speculative.tree import DraftTree

STATE = ("topk_logp", "topk_ids", "feature")  # inputs the last step left on the device


class DraftStates:
    """The batch's draft states as batch tensors: the last step's outputs when the batch is the
    same requests in the same order holding the rows that step set, else gathered from the rows'
    batches (gather_rows)."""

    def __init__(self) -> None:
        self._last: tuple[list[DraftRow | None], DraftState] | None = None
        self.restacks = 0  # steps that had to stack the states (the batch changed)

    def of(self, reqs: list[Request]) -> DraftState:
        rows = [r.spec.draft for r in reqs]
        last = self._last
        if last is not None and len(last[0]) == len(rows) and all(
                a is b for a, b in zip(rows, last[0])):
            return last[1]
        self.restacks += 1
        missing = [r.rid for r, row in zip(reqs, rows) if row is None]
        if missing:
            raise RuntimeError(f"requests {missing} have no draft state: prefill them first")
        return gather_rows(cast(list[DraftRow], rows))

    def set(self, reqs: list[Request], out: DraftState) -> None:
        """Each request's row of a step's outputs becomes its draft state."""
        logp, ids, feat = out.topk_logp, out.topk_ids, out.feature
        drafts = [DraftRow(logp, ids, feat, i) for i in range(len(reqs))]
        for r, d in zip(reqs, drafts):
            r.spec.draft = d
        self._last = (list(drafts), DraftState(topk_logp=logp, topk_ids=ids, feature=feat))

    def forget(self) -> None:
        """Rows were set elsewhere (prefill, catch-up): the next step stacks."""
        self._last = None


def gather_rows(rows: list[DraftRow]) -> DraftState:
    """The rows as batch tensors, in order: runs of consecutive rows of one batch are slices,
    one cat per field joins them (a batch changes by a few requests a step: a few runs of the
    last step's outputs and a prefill's; no index is copied to the device); rows in many runs
    are stacked one by one, a whole batch in order is its own tensors."""
    runs: list[list] = []  # [a row of the batch, first, end]
    for r in rows:
        last = runs[-1] if runs else None
        if last is not None and last[0].feature is r.feature and last[2] == r.at:
            last[2] += 1
        else:
            runs.append([r, r.at, r.at + 1])
    if len(runs) == 1 and runs[0][1] == 0 and runs[0][2] == runs[0][0].feature.shape[0]:
        return DraftState(**{f: getattr(runs[0][0], f) for f in STATE})
    if len(rows) <= 16 or len(runs) > len(rows) // 8:
        return DraftState(**{f: torch.stack([r.row(f) for r in rows]) for f in STATE})
    return DraftState(**{f: torch.cat([getattr(src, f)[a:b] for src, a, b in runs])
                         for f in STATE})


class EagleStep:
    """One shape's fused step: graphs `step`, `step[sample]` and `step[full]` (logprobs and logits
    processing; suffixed `@S/K/N` for every shape but the first)."""

    def __init__(self, phases: EaglePhases, graphs: GraphRunner, states: DraftStates, tag: str,
                 carried: bool) -> None:
        self.phases, self.states = phases, states
        s = phases.shapes

        identity = phases.logits_state.identity if phases.logits_state is not None else None

        def reg(name: str, sampled: bool, full: bool) -> PhaseGraph[StepIn, StepOut]:
            return graphs.register(
                name + tag, lambda x: phases.step(x, full),
                lambda bs: StepIn.example(s, bs, sampled=sampled, carried=carried,
                                          identity=identity if full else None), StepOut,
                device_inputs=STATE, publish=("emitted",))

        self.graphs = (reg("step", False, False), reg("step[sample]", True, False),
                       reg("step[full]", True, True))
        self._reqs: list[Request] = []

    @property
    def max_kv(self) -> int:
        return self.phases.max_kv

    @max_kv.setter
    def max_kv(self, value: int) -> None:
        self.phases.max_kv = value

    def graph(self, greedy: bool, full: bool = False) -> PhaseGraph[StepIn, StepOut]:
        return self.graphs[2 if full else 0 if greedy else 1]

    def inputs(self, rows: StepRows) -> StepIn:
        return StepIn(**rows.fields(), **self.states.of(self._reqs).tensors())

    def launch(self, executor: StepExecutor, reqs: list[Request], tag: object) -> None:
        """The step for `reqs`; their draft states are its outputs at once (on the device)."""
        self._reqs = reqs
        out = executor.launch(self, reqs, tag)
        assert isinstance(out, StepOut)
        self.states.set(reqs, out)


@dataclass
class _Graphs:
    draft: PhaseGraph[DraftIn, DraftTree]
    verify_full: PhaseGraph[VerifyIn, Accepted]
    draft_extend: PhaseGraph[ExtendIn, ExtendOut]
    masked_extend: PhaseGraph[MaskedExtendIn, ExtendOut]
    verify: PhaseGraph[VerifyIn, Accepted] | None = None
    verify_sample: PhaseGraph[VerifyIn, Accepted] | None = None


class PhasedStep:
    """The step as graphs `draft`, `verify` (`verify[sample]`, `verify[full]`: verify + accept)
    and `draft_extend`, run one after the other; with `profile`, each phase's time. It is also
    the step of a batch with a grammar (structured output): between draft and verify the host
    reads the tree and writes each node's grammar mask, which `verify[full]` applies. `full_only`:
    only the graphs that step needs (draft, verify[full], draft_extend)."""

    def __init__(self, phases: EaglePhases, graphs: GraphRunner, states: DraftStates,
                 stats: SpecStats, full_only: bool = False) -> None:
        self.phases, self.states, self.stats = phases, states, stats
        self.full_only = full_only
        s = phases.shapes
        tree = ("tokens", "parents", "depth", "mask")
        identity = phases.logits_state.identity if phases.logits_state is not None else None

        def verify(name: str, sampled: bool, full: bool) -> PhaseGraph[VerifyIn, Accepted]:
            return graphs.register(name, lambda x: phases.verify_accept(x, full=full),
                                   lambda bs: VerifyIn.example(s, bs, sampled=sampled,
                                                               identity=identity if full else None),
                                   Accepted, device_inputs=tree)

        accepted = ("acc_tokens", "accept_len", "bonus", "acc_feature")
        self.g = _Graphs(
            graphs.register("draft", phases.draft_tree, lambda bs: DraftIn.example(s, bs),
                            DraftTree, device_inputs=STATE),
            verify("verify[full]", True, True),
            graphs.register("draft_extend", phases.draft_extend, lambda bs: ExtendIn.example(s, bs),
                            ExtendOut, device_inputs=accepted),
            graphs.register("draft_extend[grammar]", phases.masked_extend,
                            lambda bs: MaskedExtendIn.example(s, bs, identity or 0), ExtendOut,
                            device_inputs=accepted))
        if not full_only:
            self.g.verify = verify("verify", False, False)
            self.g.verify_sample = verify("verify[sample]", True, False)

    def _timed(self, phase: str, t0: float, profile: bool) -> float:
        self.stats.phase_calls[phase] += 1
        if not profile:
            return t0
        if self.phases.shapes.device.type == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()
        # (Counter's stubs only know int counts; float seconds work the same at runtime)
        self.stats.phase_seconds[phase] += now - t0  # type: ignore[assignment]
        return now

    def launch(self, executor: StepExecutor, reqs: list[Request], tag: object,
               profile: bool = False) -> None:
        """One step of `reqs`, queued for the executor's `collect` as a fused step's is (a batch
        with a grammar syncs once, to read the tree)."""
        g, t0 = self.g, time.perf_counter()
        grammar = constrained(reqs)
        rows = executor.rows(reqs, sampled=grammar or needs_sampled_graph(reqs))
        executor.bound(self.phases, reqs)
        state = self.states.of(reqs)
        tree = g.draft.run(DraftIn(seq=rows.seq, tables=rows.tables, root=rows.root,
                                   **state.tensors()))
        if grammar:
            assert executor.logits_state is not None
            executor.logits_state.fill_grammar_tree(reqs, tree.tokens.cpu(), tree.parents.cpu())
        t0 = self._timed("draft", t0, profile)
        verify = g.verify_full if rows.full else g.verify if rows.greedy else g.verify_sample
        if verify is None:
            raise RuntimeError("built for constrained steps only: the [full] verify graph")
        acc = verify.run(
            VerifyIn(seq=rows.seq, tables=rows.tables, **tree.tensors(), **rows.sampling))
        t0 = self._timed("verify", t0, profile)
        emitted = HostCopy(emitted_rows(acc))
        x = dict(seq=rows.seq, tables=rows.tables, **acc.extend_tensors())
        if grammar:  # the grammar after the accepted tokens masks the draft's next candidates
            assert executor.logits_state is not None
            executor.logits_state.fill_grammar_after(reqs, [emitted_tokens(e) for e in emitted.tolist()])
            ext = g.masked_extend.run(MaskedExtendIn(**x, slot=rows.sampling["slot"]))
        else:
            ext = g.draft_extend.run(ExtendIn(**x))
        self._timed("draft_extend", t0, profile)
        self.states.set(reqs, ext)
        executor.push(reqs, emitted, tag, acc.logprobs, acc.top_ids)


def shape_tag(shape: SpecShape, first: SpecShape) -> str:
    """Graph-name suffix of a shape's step: none for the first shape, else `@S/K/N`."""
    return "" if shape == first else "@" + shape.label
