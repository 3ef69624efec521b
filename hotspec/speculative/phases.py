"""The speculative step's phases after prefill: pure functions of typed batch-leading tensors.

`draft` -> `verify` -> `accept` (with the KV commit) -> `draft_extend`, or all of them as one
`step` (one CUDA graph per batch size, the default). Inputs and outputs are the types of
speculative/io.py, which also declare the static shapes the graph runner allocates. No phase
syncs with the host, so the GraphRunner serves each as a CUDA graph, from static buffers, or
eagerly. A phase samples (tree rejection sampling) when its input carries sampling fields, else it
is greedy. KV regions are described in core/forward_batch.py; target and draft pools share one
block table. The host side that chains the phases is speculative/worker.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from hotspec.core.forward_batch import ForwardBatch, ForwardMode
from hotspec.layers import deterministic
from hotspec.layers.argmax import argmax
from hotspec.layers.logprobs import token_logprobs
from hotspec.layers.sampler import shape_logits_to_probs
from hotspec.layers.topk_logp import topk_logp
from hotspec.models.draft_head import DraftHead
from hotspec.models.llama import LlamaForCausalLM
from hotspec.runtime.carry import from_carry, to_carry
from hotspec.runtime.logits_state import LogitsState, path_counts, processed
from hotspec.runtime.model_runner import ModelRunner
from hotspec.runtime.phase_io import Sampled, Tensors
from hotspec.speculative.frontier import next_frontier
from hotspec.speculative.io import (
    Accepted,
    DraftIn,
    ExtendIn,
    ExtendOut,
    MaskedExtendIn,
    Rows,
    SpecShapes,
    StepIn,
    StepOut,
    VerifyIn,
    emitted_rows,
)
from hotspec.speculative.phase_inputs import draft_inputs, extend_inputs, verify_inputs
from hotspec.speculative.tree import MAX_LOGP, DraftTree, build_tree
from hotspec.speculative.verify import Acceptance, commit_rows, greedy_accept, verify_stochastic

Process = Callable[[torch.Tensor], torch.Tensor]  # draft logits -> processed (float32)


class Verified(NamedTuple):
    """`verify`'s output, what `accept` judges: target logits and features of every tree node."""

    tree: DraftTree
    logits: torch.Tensor  # [B, N, V] target logits
    feature: torch.Tensor  # [B, N, F] what the draft head reads of the target
    slots: torch.Tensor  # [B, max(N, W)] KV slots of seq + 0, 1, ...


@dataclass
class EagleModels:
    """A target and its draft head, each with its runner (KV pool and attention backend)."""

    target: LlamaForCausalLM
    draft: DraftHead
    target_runner: ModelRunner
    draft_runner: ModelRunner

    def feature(self, hidden: torch.Tensor, aux: list[torch.Tensor]) -> torch.Tensor:
        """What the draft head reads from the target: EAGLE-3's aux layers, else the final hidden."""
        return torch.cat(aux, dim=-1) if aux else hidden

    def draft_topk(self, h_logits: torch.Tensor, k: int, process: Process | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The draft LM head's top-k: log-probs, target ids, and the logits (sized by the head);
        `process`: the requests' logits processing first (the [full] step: proposals the
        penalties leave worth verifying)."""
        logits = self.draft.draft_logits(h_logits)  # [T, draft_vocab]
        if process is not None:
            logits = process(logits)
        logp, idx = topk_logp(logits, k, MAX_LOGP)
        return logp, self.draft.to_target_ids(idx), logits


class EaglePhases:
    """The phases of one draft head over one target at one shape. `carry`: the overlap
    schedule's row buffers (runtime/step_executor.CARRY), which the fused step reads for rows
    with `src` >= 0 and writes for the next step; None: no overlap schedule."""

    def __init__(self, models: EagleModels, block_size: int, shapes: SpecShapes,
                 carry: Tensors | None = None, logits_state: LogitsState | None = None) -> None:
        self.models = models
        self.target, self.draft = models.target, models.draft
        self.target_runner, self.draft_runner = models.target_runner, models.draft_runner
        self.feature, self.draft_topk = models.feature, models.draft_topk
        self.block_size, self.shapes, self.carry = block_size, shapes, carry
        self.logits_state = logits_state  # the [full] graphs' logits processing
        self.num_steps, self.topk, self.state_k = shapes.num_steps, shapes.topk, shapes.state_k
        self.num_draft_tokens, self.width = shapes.num_draft_tokens, shapes.width
        self.scratch = self.topk * (self.num_steps - 1)  # draft-tree KV slots per request
        self.reserve = shapes.shape.reserve  # (max of num_draft_tokens, scratch, width)
        self.max_kv = shapes.max_blocks_per_seq * block_size  # attention bound for static shapes
        # constants of the draft loop: frontier node ids, and owns[s][i, j]: node i of draft step
        # s + 1 writes scratch slot j (j == s*k + i)
        dev = shapes.device
        sidx = torch.arange(self.scratch, device=dev)
        self.node_ids = torch.arange(self.topk, device=dev)
        self.owns = sidx.view(-1, self.topk, 1) == sidx  # [S-1, k, M]
        models.target.capture_layers = tuple(models.draft.aux_layer_ids)

    # -- phases (pure tensor functions; graph-capturable) --------------------------------------
    def draft_tree(self, x: DraftIn, sampling: Sampled | None = None) -> DraftTree:
        """`draft`: num_steps - 1 draft forwards over the top-k frontier, then the best N-1 nodes
        (with `sampling`'s processing fields, the draft's logits processed as the target's)."""
        root, seq, tables = x.root, x.seq, x.tables
        b, k, n_fw = root.shape[0], self.topk, self.num_steps - 1
        dev = root.device
        # the state holds the best state_k >= k candidates, best first: this shape takes k
        top_logp, top_ids = (x.topk_logp, x.topk_ids) if self.state_k == k else (
            x.topk_logp[:, :k], x.topk_ids[:, :k])
        scores, tokens = [top_logp], [top_ids]
        f_score, f_tok = top_logp, top_ids
        f_global = self.node_ids.expand(b, k)
        f_globals: list[torch.Tensor] = []  # each step's frontier: the parents of its k*k children
        f_feat = x.feature.unsqueeze(1).expand(b, k, -1).reshape(b * k, -1)
        if n_fw > 0:  # the scratch slots, positions, root mask and lengths of every step
            locs, positions, f_mask, q_lens, kv_lens = draft_inputs(tables, seq, k, n_fw,
                                                                    self.block_size)
        for s in range(1, self.num_steps):
            fb = ForwardBatch(
                mode=ForwardMode.DRAFT, input_ids=f_tok.reshape(-1), positions=positions[s - 1],
                out_cache_loc=locs[s - 1], q_lens=q_lens, kv_lens=kv_lens, block_tables=tables,
                width=k, max_q=k, max_kv=self.max_kv, custom_mask=f_mask, hidden_in=f_feat)
            h_logits, h_feat = self.draft_runner.forward(fb)
            process = self._draft_process(sampling, k, s) if sampling is not None else None
            logp, ids, _ = self.draft_topk(h_logits, k, process)  # [B*K, K]
            tokens.append(ids.view(b, k * k))
            f_globals.append(f_global)
            if s == self.num_steps - 1:
                scores.append((f_score.unsqueeze(2) + logp.view(b, k, k)).view(b, k * k))
                break
            c_score, f_score, f_tok, f_global, f_feat, f_mask = next_frontier(
                f_score, logp, ids, h_feat, f_mask, self.owns[s], k + (s - 1) * k * k)
            scores.append(c_score)
        parents = [torch.full((b, k), -1, dtype=torch.long, device=dev)]
        if f_globals:  # every child of frontier node i has parent i: [B, S-1, K] -> [B, (S-1)*K*K]
            fg = torch.stack(f_globals, 1)
            parents.append(fg.unsqueeze(3).expand(b, n_fw, k, k).reshape(b, n_fw * k * k))
        return build_tree(root, torch.cat(scores, 1), torch.cat(tokens, 1), torch.cat(parents, 1),
                          self.num_draft_tokens, self.num_steps)

    def verify(self, x: VerifyIn) -> Verified:
        """`verify`: the target over every tree node; node i writes kv index seq + i. Also the
        slots of kv indices seq + [0, max(N, W)), which the commit reuses."""
        tree = DraftTree(tokens=x.tokens, parents=x.parents, depth=x.depth, mask=x.mask)
        seq, tables = x.seq, x.tables
        b, n = tree.tokens.shape
        slots, positions, loc, q_lens, kv_lens = verify_inputs(tables, seq, tree.depth,
                                                                max(n, self.width), self.block_size)
        # a chain's tree mask is causal: the deterministic mode attends it so, several nodes a
        # tile, where a tree's nodes each read their own keys (one node a tile: TREE_SEQ)
        chain = self.topk == 1 and deterministic.on()
        fb = ForwardBatch(
            mode=ForwardMode.VERIFY, input_ids=tree.tokens.reshape(-1), positions=positions,
            out_cache_loc=loc, q_lens=q_lens, kv_lens=kv_lens, block_tables=tables, width=n,
            max_q=n, max_kv=self.max_kv, custom_mask=None if chain else tree.mask)
        hidden, aux = self.target_runner.forward(fb)
        logits = self.target.compute_logits(hidden).view(b, n, -1)
        return Verified(tree, logits, self.feature(hidden, aux).view(b, n, -1), slots)

    def accept(self, v: Verified, sampling: Sampled, with_slots: bool = False,
               full: bool = False) -> Accepted:
        """`accept`: the verdict (greedy, or tree rejection sampling when `sampling` has its
        fields; greedy rows of a sampled batch use a one-hot target), then the commit: the
        accepted nodes' target KV moves from seq + path[i] to seq + i; rows past the accepted
        length move trash. A chain's path is already a prefix, so a chain moves nothing.
        `with_slots` passes the draft_extend rows' slots on (the fused step: no second lookup);
        `full` (sampled only) judges every node by its processed logits (penalties counted along
        its path: runtime/logits_state.py), counts the emitted tokens, and adds their logprobs."""
        kv, slots = self.target_runner.kv, v.slots
        raw = v.logits
        if full:
            v = v._replace(logits=self._processed(v, sampling))
        if sampling.temperature is None:
            c = greedy_accept(v.tree, argmax(v.logits), slots, kv.trash_slot, self.num_steps)
        else:
            c = commit_rows(v.tree, self._rejection_sample(v, sampling), slots, kv.trash_slot)
        if self.topk > 1:
            kv.move_slots(c.src.reshape(-1), c.dst.reshape(-1))
        f = v.feature
        b, w = c.acc.path.shape
        lp = top = None
        if full:
            assert self.logits_state is not None and sampling.slot is not None
            chosen = self._emitted(c.acc, c.tokens)
            valid = torch.arange(w, device=chosen.device).unsqueeze(0) < c.acc.accept_len.unsqueeze(1)
            self.logits_state.count(sampling.slot, chosen, valid)
            lp, top = token_logprobs(raw.gather(1, c.acc.path.unsqueeze(2).expand(b, w, raw.shape[-1]))
                                     .reshape(b * w, -1), chosen.reshape(-1))
            lp, top = lp.view(b, w, -1), top.view(b, w, -1)
        return Accepted(acc_tokens=c.tokens, accept_len=c.acc.accept_len, bonus=c.acc.bonus,
                        acc_feature=torch.gather(f, 1, c.acc.path.unsqueeze(2).expand(b, w, f.shape[-1])),
                        slots=slots[:, :w] if with_slots else None, logprobs=lp, top_ids=top)

    @staticmethod
    def _emitted(acc: Acceptance, tokens: torch.Tensor) -> torch.Tensor:
        """[B, W]: the token emitted at path position d, chosen at path node d: token d + 1 of
        the path, the bonus at d = a - 1 (and past it: the host reads a)."""
        d = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0)
        nxt = torch.cat([tokens[:, 1:], acc.bonus.unsqueeze(1)], 1)
        return torch.where(d < (acc.accept_len - 1).unsqueeze(1), nxt, acc.bonus.unsqueeze(1))

    def _processed(self, v: Verified, x: Sampled) -> torch.Tensor:
        """Every node's logits processed as plain decoding would at its position: its request's
        counts plus the drafted tokens on its path, its depth's generated count."""
        assert self.logits_state is not None and x.offsets is not None
        t = v.tree
        b, n, vocab = v.logits.shape
        extra = path_counts(t.tokens, t.mask, t.depth, vocab).view(b * n, vocab)
        generated = (x.offsets.unsqueeze(1) + t.depth).reshape(-1)
        return processed(self.logits_state, x, v.logits.reshape(b * n, vocab), generated, extra,
                         per_row=n).view(b, n, vocab)

    def _rejection_sample(self, v: Verified, sampling: Sampled) -> Acceptance:
        st = sampling.sampling()
        b, n, vocab = v.logits.shape

        def rep(t: torch.Tensor) -> torch.Tensor:
            return t.repeat_interleave(n)

        probs = shape_logits_to_probs(v.logits.view(b * n, vocab), rep(st.temperature), rep(st.top_p),
                                      rep(st.top_k), rep(st.min_p)).view(b, n, vocab)
        onehot = torch.zeros_like(probs).scatter_(2, argmax(v.logits).unsqueeze(-1), 1.0)
        probs = torch.where((st.temperature == 0).view(b, 1, 1), onehot, probs)
        return verify_stochastic(v.tree, probs, self.num_steps, st.seeds, st.offsets)

    def verify_accept(self, x: VerifyIn, full: bool = False) -> Accepted:
        """The `verify` graph: verify, then accept (sampled when `x` has sampling fields)."""
        return self.accept(self.verify(x), x, full=full)

    def _draft_process(self, x: Sampled, per_row: int, ahead: torch.Tensor | int) -> Process | None:
        """The draft's logits processing for rows of `per_row` per request, `ahead` tokens past
        the request's generated count; None without processing fields."""
        st = self.logits_state
        if st is None or x.slot is None or x.offsets is None:
            return None
        columns = self._columns(x.slot.device)
        f = [x.slot, x.min_tokens, x.presence, x.frequency, x.repetition, x.offsets + ahead]
        slot, min_tokens, presence, frequency, repetition, generated = (
            t.repeat_interleave(per_row) if per_row > 1 else t for t in f if t is not None)
        return lambda logits: st.process_columns(logits, slot, columns, generated, min_tokens,
                                                 presence, frequency, repetition)

    def _columns(self, device: torch.device) -> torch.Tensor:
        """The target id of each draft logits column (an FR-Spec head's hot ids)."""
        d2t = self.draft.draft_to_target
        return d2t if d2t is not None else torch.arange(self.draft.target_vocab_size, device=device)

    def masked_extend(self, x: MaskedExtendIn) -> ExtendOut:
        """`draft_extend` of a step with a grammar: the draft's candidates (the next step's
        depth-1 nodes) only tokens the grammar allows after the accepted ones."""
        st = self.logits_state
        assert st is not None
        columns = self._columns(x.slot.device)
        return self.draft_extend(x, mask=lambda logits: st.mask_columns(logits, x.slot, columns))

    def draft_extend(self, x: ExtendIn, sampling: Sampled | None = None,
                     mask: Process | None = None) -> ExtendOut:
        """`draft_extend`: the draft over the accepted tokens (shifted by one, the bonus last) at a
        fixed width of W rows per request; the next root state is row accept_len - 1."""
        seq, tables, a = x.seq, x.tables, x.accept_len
        b, w = x.acc_tokens.shape
        ids, loc, positions, last, kv_lens = extend_inputs(
            tables, seq, x.acc_tokens, x.bonus, a, x.slots, self.draft_runner.kv.trash_slot,
            self.block_size)
        fb = ForwardBatch(
            mode=ForwardMode.DRAFT_EXTEND, input_ids=ids, positions=positions, out_cache_loc=loc,
            q_lens=a, kv_lens=kv_lens, block_tables=tables, width=w, max_q=w, max_kv=self.max_kv,
            hidden_in=x.acc_feature.reshape(b * w, -1))
        h_logits, h_feat = self.draft_runner.forward(fb)
        process = self._draft_process(sampling, 1, a) if sampling is not None else mask
        logp, ids, logits = self.draft_topk(h_logits[last], self.state_k, process)
        return ExtendOut(topk_logp=logp, topk_ids=ids, feature=h_feat[last], logits=logits)

    def step(self, x: StepIn, full: bool = False) -> StepOut:
        """`step`: draft -> verify -> accept -> draft_extend as one function (one graph per batch
        size; sampled when `x` has sampling fields; `full`: as `accept`'s)."""
        if self.carry is not None:
            x = StepIn.of(from_carry(x.tensors(), self.carry))
        tree = self.draft_tree(x, x if full else None)
        rows = Rows(seq=x.seq, tables=x.tables)
        verified = self.verify(VerifyIn(**rows.tensors(), **tree.tensors()))
        acc = self.accept(verified, x, with_slots=True, full=full)
        # What needs only the verdict runs before draft_extend, not after its LM head: small
        # plain kernels at a graph's tail slow every launch of the replay; here they sit between
        # two large phases instead.
        emitted = emitted_rows(acc)
        if self.carry is not None:  # seq + accepted, the bonus (next root), offset + emitted
            a = acc.accept_len
            offsets = {"offsets": x.offsets} if x.offsets is not None else {}
            to_carry(self.carry, {"seq": x.seq, "root": acc.bonus} | offsets,
                     plus={"seq": a} | ({"offsets": a} if offsets else {}))
        ext = self.draft_extend(ExtendIn(**rows.tensors(), **acc.extend_tensors()), x if full else None)
        return StepOut(emitted=emitted, topk_logp=ext.topk_logp, topk_ids=ext.topk_ids,
                       feature=ext.feature, logprobs=acc.logprobs, top_ids=acc.top_ids)
