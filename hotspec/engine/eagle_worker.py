"""EAGLE speculative decoding: prefill, then per step draft -> verify (+accept) -> draft_extend.

The phases after prefill are pure tensor functions (engine/eagle_phases.py), served by the
GraphRunner (CUDA graph, static buffers, or eager); this is the host side that chains them. Per-
request draft state between steps lives on the Request (`_DraftState` rows): the draft's top-k for
the token after the root and the draft feature that goes with it. Inside `step` the host reads
exactly one tensor (accepted lengths and tokens).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from hotspec.engine.eagle_phases import EaglePhases, emitted_rows
from hotspec.engine.request import Request
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


class EagleWorker(EaglePhases):
    def __init__(self, target: LlamaForCausalLM, draft: DraftHead, target_runner: ModelRunner,
                 draft_runner: ModelRunner, graphs: GraphRunner, block_size: int,
                 device: torch.device, num_steps: int, topk: int, num_draft_tokens: int,
                 max_blocks_per_seq: int, profile: bool = False, fuse_step: bool = False) -> None:
        super().__init__(target, draft, target_runner, draft_runner, block_size, device, num_steps,
                         topk, num_draft_tokens, max_blocks_per_seq)
        self.graphs = graphs
        self.profile = profile
        self.fuse_step = fuse_step  # one `step` graph, except while profiling phases
        self.stats = SpecStats()
        # the last step's per-request states and the batch tensors they are rows of
        self._last_states: tuple[list[_DraftState], Tensors] | None = None
        self.restacks = 0  # steps that had to stack the states (the batch changed)
        ids = draft.to_target_ids(torch.arange(draft.draft_vocab_size, device=device))
        self.draft_vocab: frozenset[int] = frozenset(ids.tolist())  # host-side, for statistics
        graphs.register("draft", self.draft_phase, self._example_draft)
        graphs.register("verify", self.verify_phase, self._example_verify)
        graphs.register("verify[sample]", self.verify_sample_phase, self._example_verify_sample)
        graphs.register("draft_extend", self.draft_extend_phase, self._example_extend)
        if fuse_step:
            graphs.register("step", self.step_phase, self._example_draft)
            graphs.register("step[sample]", self.step_sample_phase, self._example_step_sample)

    def _timed(self, phase: str, t0: float) -> float:
        self.stats.phase_calls[phase] += 1
        if not self.profile:
            return t0
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.stats.phase_seconds[phase] += now - t0
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
    @torch.inference_mode()
    def step(self, reqs: list[Request]) -> list[list[int]]:
        t0 = time.perf_counter()
        if self.graphs.mode == "eager":
            self.max_kv = max(r.seq_len for r in reqs) + self.reserve
        host = torch.device("cpu")  # the graph runner copies host inputs into its buffers
        base: Tensors = {
            "seq": torch.tensor([r.seq_len for r in reqs], dtype=torch.long),
            "tables": block_table_tensor(reqs, host),
        }
        draft_in = dict(base, root=torch.tensor([r.last_token for r in reqs], dtype=torch.long))
        # The same requests in the same order as the last step, holding the states it set: its
        # batch tensors serve as they are (no stack kernels).
        states, last = [r.spec_state for r in reqs], self._last_states
        if last is not None and len(last[0]) == len(states) and all(
                a is b for a, b in zip(states, last[0])):
            draft_in.update(last[1])
        else:
            self.restacks += 1
            for f in ("topk_logp", "topk_ids", "feature"):
                draft_in[f] = torch.stack([getattr(s, f) for s in states])
        greedy = all(r.params.temperature == 0 for r in reqs)
        if self.fuse_step and not self.profile:
            name = "step" if greedy else "step[sample]"
            # (the emitted rows are read at once below: borrowed from the graph, no copy)
            ext = self.graphs.run(name, draft_in if greedy else
                                  dict(draft_in, **sampling_inputs(reqs, host)), borrow=("emitted",))
            emitted_t = ext["emitted"]
            self._timed("step", t0)
        else:
            tree = self.graphs.run("draft", draft_in)
            t0 = self._timed("draft", t0)
            verify_in = dict(base, **{k: tree[k] for k in ("tokens", "parents", "depth", "mask")})
            if greedy:
                acc = self.graphs.run("verify", verify_in)
            else:
                acc = self.graphs.run("verify[sample]", dict(verify_in, **sampling_inputs(reqs, host)))
            t0 = self._timed("verify", t0)
            ext = self.graphs.run("draft_extend", dict(base, **{
                k: acc[k] for k in ("acc_tokens", "accept_len", "bonus", "acc_feature")}))
            t0 = self._timed("draft_extend", t0)
            emitted_t = emitted_rows(acc)

        rows = emitted_t.tolist()  # the one host sync of the step
        emitted: list[list[int]] = []
        for i, (r, row) in enumerate(zip(reqs, rows)):
            a = row[0]
            toks = row[2 : 1 + a] + [row[-1]]  # accepted drafts after the root, then the bonus
            emitted.append(toks)
            r.seq_len += a
            r.stats.spec_steps += 1
            r.spec_state = _DraftState(ext["topk_logp"][i], ext["topk_ids"][i], ext["feature"][i])
            self.stats.accept_hist[a] += 1
        self._last_states = ([r.spec_state for r in reqs],
                             {f: ext[f] for f in ("topk_logp", "topk_ids", "feature")})
        return emitted

    def record_served(self, tokens: list[int]) -> None:
        """Called by the engine with the tokens of a step it kept: hot-set coverage statistics."""
        self.stats.add_served(tokens, self.draft_vocab)
