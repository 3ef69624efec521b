"""EAGLE speculative decoding: prefill, then per step draft -> verify (+accept) -> draft_extend.

The phases after prefill are pure tensor functions (engine/eagle_phases.py), served by the
GraphRunner (CUDA graph, static buffers, or eager); this is the host side that chains them. Per-
request draft state between steps lives on the Request (`_DraftState` rows): the draft's top-k for
the token after the root and the draft feature that goes with it. Inside `step` the host reads
exactly one tensor (accepted lengths and tokens).

The fused step is launched (`launch`) and read (`collect`) separately, so that with the overlap
schedule the engine can launch step N+1 before it reads step N (engine/launches.py). Step N+1
then takes a request's sequence length, root token and RNG offset from the rows step N left in
the `carry` buffers (seq + accept_len, the bonus token, offset + accept_len), and its draft state
from step N's outputs, which stay on the device; blocks are reserved for the largest advance.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from hotspec.engine.eagle_phases import EaglePhases, emitted_rows
from hotspec.engine.launches import HostCopy, Launches, LaunchingWorker
from hotspec.engine.request import Request, Status
from hotspec.engine.spec_stats import SpecStats
from hotspec.engine.vanilla_worker import prefill_chunks, sample_for, sampling_inputs
from hotspec.models.draft_head import DraftHead
from hotspec.models.llama import LlamaForCausalLM
from hotspec.runtime.batch_builder import block_table_tensor, last_token_index, prefill_batch
from hotspec.runtime.graph_runner import GraphRunner, Tensors
from hotspec.runtime.model_runner import ModelRunner

__all__ = ["EagleWorker", "SpecStats"]


@dataclass
class _DraftState:
    topk_logp: torch.Tensor  # [K] draft log-probs of the depth-1 candidates
    topk_ids: torch.Tensor  # [K] their target ids
    feature: torch.Tensor  # [H] draft feature fed with the depth-1 candidates


class EagleWorker(EaglePhases, LaunchingWorker):
    def __init__(self, target: LlamaForCausalLM, draft: DraftHead, target_runner: ModelRunner,
                 draft_runner: ModelRunner, graphs: GraphRunner, block_size: int,
                 device: torch.device, num_steps: int, topk: int, num_draft_tokens: int,
                 max_blocks_per_seq: int, profile: bool = False, fuse_step: bool = False,
                 overlap: bool = False, max_rows: int = 1) -> None:
        super().__init__(target, draft, target_runner, draft_runner, block_size, device, num_steps,
                         topk, num_draft_tokens, max_blocks_per_seq)
        self.graphs = graphs
        self.profile = profile
        self.fuse_step = fuse_step  # one `step` graph, except while profiling phases
        if overlap and not fuse_step:
            raise ValueError("the overlap schedule launches the fused step graph: needs fuse_step")
        self.overlap = overlap
        self.max_advance = self.width  # a step commits at most num_steps + 1 tokens
        self.launches = Launches()
        if overlap:  # what step N+1 reads of step N's rows (module docstring)
            rows = max(max_rows, graphs.max_bs)
            self.carry = {k: torch.zeros(rows, dtype=torch.long, device=device)
                          for k in ("seq", "root", "offsets")}
        self.stats = SpecStats()
        # the last step's per-request states and the batch tensors they are rows of
        self._last_states: tuple[list[_DraftState], Tensors] | None = None
        self.restacks = 0  # steps that had to stack the states (the batch changed)
        ids = draft.to_target_ids(torch.arange(draft.draft_vocab_size, device=device))
        self.draft_vocab: frozenset[int] = frozenset(ids.tolist())  # host-side, for statistics
        state = ("topk_logp", "topk_ids", "feature")  # inputs the last step left on the device
        tree = ("tokens", "parents", "depth", "mask")
        graphs.register("draft", self.draft_phase, self._example_draft, device_inputs=state)
        graphs.register("verify", self.verify_phase, self._example_verify, device_inputs=tree)
        graphs.register("verify[sample]", self.verify_sample_phase, self._example_verify_sample,
                        device_inputs=tree)
        graphs.register("draft_extend", self.draft_extend_phase, self._example_extend,
                        device_inputs=("acc_tokens", "accept_len", "bonus", "acc_feature"))
        if fuse_step:
            graphs.register("step", self.step_phase, self._example_step, device_inputs=state,
                            publish=("emitted",))
            graphs.register("step[sample]", self.step_sample_phase, self._example_step_sample,
                            device_inputs=state, publish=("emitted",))

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
        tokens, final = prefill_chunks(reqs, chunks)
        fb = prefill_batch(reqs, tokens, self.block_size, self.device)
        hidden, aux = self.target_runner.forward(fb)
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
        dfb.hidden_in = self._feature(hidden, aux)
        h_logits, h_feat = self.draft_runner.forward(dfb)
        logp, ids, _ = self._topk(h_logits[last], self.topk)
        for i, (r, t) in enumerate(zip(reqs, tokens)):
            r.seq_len += len(t)
            if final[i]:
                r.spec_state = _DraftState(logp[i], ids[i], h_feat[last[i]])
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
        if self.fuse_step and not self.profile:
            self.launch(reqs)
            return self.collect()[1]
        return self._phases_step(reqs)

    def _inputs(self, reqs: list[Request], src: bool) -> Tensors:
        """The step's inputs: host tensors and the requests' draft states (device tensors); `src`:
        the rows of unread steps' outputs to read instead (the fused step, overlap schedule)."""
        ahead = [self.launches.ahead(r) for r in reqs]
        if any(ahead) and not self.overlapping:
            raise RuntimeError("a speculative step was launched before the last one was read; "
                               "that needs the overlap schedule")
        if self.graphs.mode == "eager":
            self.max_kv = max(r.seq_len + a * self.max_advance for r, a in zip(reqs, ahead)) + self.reserve
        host = torch.device("cpu")  # the graph runner copies host inputs into its buffers
        x: Tensors = {
            "seq": torch.tensor([r.seq_len for r in reqs], dtype=torch.long),
            "tables": block_table_tensor(reqs, host),
            "root": torch.tensor([0 if a else r.last_token for r, a in zip(reqs, ahead)], dtype=torch.long),
        }
        if src:
            x["src"] = torch.tensor(self.launches.src_rows(reqs), dtype=torch.long)
        # The same requests in the same order as the last step, holding the states it set: its
        # batch tensors serve as they are (no stack kernels).
        states, last = [r.spec_state for r in reqs], self._last_states
        if last is not None and len(last[0]) == len(states) and all(
                a is b for a, b in zip(states, last[0])):
            x.update(last[1])
        else:
            self.restacks += 1
            for f in ("topk_logp", "topk_ids", "feature"):
                x[f] = torch.stack([getattr(s, f) for s in states])
        return x

    @torch.inference_mode()
    def launch(self, reqs: list[Request]) -> None:
        """Enqueue the fused step for `reqs`; no host sync. Each request's draft state becomes its
        row of this step's outputs at once (they stay on the device)."""
        t0 = time.perf_counter()
        x = self._inputs(reqs, src=self.overlap)
        greedy = all(r.params.temperature == 0 for r in reqs)
        if not greedy:
            ahead = [self.launches.ahead(r) for r in reqs]
            x.update(sampling_inputs(reqs, torch.device("cpu"), ahead))
        # (borrowed from the graph: HostCopy copies it out before the next launch)
        ext = self.graphs.run("step" if greedy else "step[sample]", x, borrow=("emitted",))
        self._set_states(reqs, ext)
        self.launches.push(reqs, self.graphs.read_back("emitted") or HostCopy(ext["emitted"]))
        self._timed("step", t0)

    def collect(self) -> tuple[list[Request], list[list[int]]]:
        """The oldest launched step's requests and emitted tokens: the one host sync of a step.
        Requests that finished since (a stop in the step before, an abort) are not counted."""
        reqs, emitted = self.launches.pop()
        return reqs, self._account(reqs, emitted.tolist())

    def _account(self, reqs: list[Request], rows: list[list[int]]) -> list[list[int]]:
        emitted: list[list[int]] = []
        for r, row in zip(reqs, rows):
            a = row[0]
            emitted.append(row[2 : 1 + a] + [row[-1]])  # accepted drafts after the root, the bonus
            if r.status is Status.FINISHED:
                continue
            r.seq_len += a
            r.stats.spec_steps += 1
            self.stats.accept_hist[a] += 1
        return emitted

    def _set_states(self, reqs: list[Request], ext: Tensors) -> None:
        for i, r in enumerate(reqs):
            r.spec_state = _DraftState(ext["topk_logp"][i], ext["topk_ids"][i], ext["feature"][i])
        self._last_states = ([r.spec_state for r in reqs],
                             {f: ext[f] for f in ("topk_logp", "topk_ids", "feature")})

    def _phases_step(self, reqs: list[Request]) -> list[list[int]]:
        """The step as three phase graphs (--no-fuse-spec-step, or phases profiled)."""
        t0 = time.perf_counter()
        x = self._inputs(reqs, src=False)
        base = {k: x[k] for k in ("seq", "tables")}
        greedy = all(r.params.temperature == 0 for r in reqs)
        tree = self.graphs.run("draft", x)
        t0 = self._timed("draft", t0)
        verify_in = dict(base, **{k: tree[k] for k in ("tokens", "parents", "depth", "mask")})
        if greedy:
            acc = self.graphs.run("verify", verify_in)
        else:
            acc = self.graphs.run("verify[sample]",
                                  dict(verify_in, **sampling_inputs(reqs, torch.device("cpu"))))
        t0 = self._timed("verify", t0)
        ext = self.graphs.run("draft_extend", dict(base, **{
            k: acc[k] for k in ("acc_tokens", "accept_len", "bonus", "acc_feature")}))
        self._timed("draft_extend", t0)
        rows = emitted_rows(acc).tolist()  # the one host sync of the step
        self._set_states(reqs, ext)
        return self._account(reqs, rows)

    def record_served(self, tokens: list[int]) -> None:
        """Called by the engine with the tokens of a step it kept: hot-set coverage statistics."""
        self.stats.add_served(tokens, self.draft_vocab)
