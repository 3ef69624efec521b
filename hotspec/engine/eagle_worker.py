"""EAGLE speculative decoding: prefill, then per step draft -> verify (+accept) -> draft_extend.

Each phase after prefill is a pure function of batch-leading tensors, served by the GraphRunner
(CUDA graph, static buffers, or eager). Per-request draft state between steps lives on the Request
(`_DraftState` rows): the draft's top-k for the token after the root and the draft feature that
goes with it. KV regions are described in runtime/forward_batch.py; target and draft pools share
one block table. Inside `step` the host reads exactly one tensor (accepted lengths and tokens).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from hotspec.engine.request import Request
from hotspec.engine.vanilla_worker import prefill_chunks, sample_for, sampling_inputs
from hotspec.layers.sampler import shape_logits_to_probs
from hotspec.models.draft_head import DraftHead
from hotspec.models.llama import LlamaForCausalLM
from hotspec.runtime.batch_builder import block_table_tensor, last_token_index, prefill_batch, slots_at
from hotspec.runtime.forward_batch import ForwardBatch, ForwardMode
from hotspec.runtime.graph_runner import GraphRunner, Tensors
from hotspec.runtime.model_runner import ModelRunner
from hotspec.spec.tree import MAX_LOGP, DraftTree, build_tree
from hotspec.spec.verify import Acceptance, verify_greedy, verify_stochastic


@dataclass
class SpecStats:
    accept_hist: Counter[int] = field(default_factory=Counter)  # tokens emitted per verify pass
    phase_calls: Counter[str] = field(default_factory=Counter)
    phase_seconds: Counter[str] = field(default_factory=Counter)
    hot_hits: int = 0  # served tokens inside the draft vocabulary (FR-Spec hot-set coverage)
    served: int = 0  # tokens that verify passes produced and the engine kept (stops applied)

    @property
    def hot_coverage(self) -> float:
        return self.hot_hits / self.served if self.served else 0.0


@dataclass
class _DraftState:
    topk_logp: torch.Tensor  # [K] draft log-probs of the depth-1 candidates
    topk_ids: torch.Tensor  # [K] their target ids
    feature: torch.Tensor  # [H] draft feature fed with the depth-1 candidates


class EagleWorker:
    def __init__(self, target: LlamaForCausalLM, draft: DraftHead, target_runner: ModelRunner,
                 draft_runner: ModelRunner, graphs: GraphRunner, block_size: int,
                 device: torch.device, num_steps: int, topk: int, num_draft_tokens: int,
                 max_blocks_per_seq: int, profile: bool = False) -> None:
        self.target, self.draft = target, draft
        self.target_runner, self.draft_runner = target_runner, draft_runner
        self.graphs = graphs
        self.block_size, self.device = block_size, device
        self.num_steps, self.topk, self.num_draft_tokens = num_steps, topk, num_draft_tokens
        self.scratch = topk * (num_steps - 1)  # draft-tree KV slots per request
        self.width = num_steps + 1  # draft_extend rows per request
        self.reserve = max(num_draft_tokens, self.scratch, self.width)
        self.max_blocks_per_seq = max_blocks_per_seq
        self.max_kv = max_blocks_per_seq * block_size  # attention bound for static shapes
        self.profile = profile
        self.stats = SpecStats()
        self.dtype = target.lm_head.weight.dtype  # activations (hidden states, features)
        target.capture_layers = tuple(draft.aux_layer_ids)
        ids = draft.to_target_ids(torch.arange(draft.draft_vocab_size, device=device))
        self.draft_vocab: frozenset[int] = frozenset(ids.tolist())  # host-side, for statistics
        graphs.register("draft", self.draft_phase, self._example_draft)
        graphs.register("verify", self.verify_phase, self._example_verify)
        graphs.register("verify[sample]", self.verify_sample_phase, self._example_verify_sample)
        graphs.register("draft_extend", self.draft_extend_phase, self._example_extend)

    # -- helpers -------------------------------------------------------------------------------
    def _feature(self, hidden: torch.Tensor, aux: list[torch.Tensor]) -> torch.Tensor:
        """What the draft head reads from the target: EAGLE-3's aux layers, else the final hidden."""
        return torch.cat(aux, dim=-1) if aux else hidden

    def _topk(self, h_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = self.draft.compute_logits(h_logits)  # [T, draft_vocab]: sized by the head
        top = torch.topk(torch.log_softmax(logits, dim=-1), k, dim=-1)
        return top.values.clamp(max=MAX_LOGP), self.draft.to_target_ids(top.indices), logits

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
        dev = self.device
        if self.graphs.mode == "eager":
            self.max_kv = max(r.seq_len for r in reqs) + self.reserve
        base: Tensors = {
            "seq": torch.tensor([r.seq_len for r in reqs], dtype=torch.long, device=dev),
            "tables": block_table_tensor(reqs, dev),
        }
        draft_in = dict(base, root=torch.tensor([r.last_token for r in reqs], dtype=torch.long, device=dev))
        for f in ("topk_logp", "topk_ids", "feature"):
            draft_in[f] = torch.stack([getattr(r.spec_state, f) for r in reqs])
        tree = self.graphs.run("draft", draft_in)
        t0 = self._timed("draft", t0)
        verify_in = dict(base, **{k: tree[k] for k in ("tokens", "parents", "depth", "mask")})
        if all(r.params.temperature == 0 for r in reqs):
            acc = self.graphs.run("verify", verify_in)
        else:
            acc = self.graphs.run("verify[sample]", dict(verify_in, **sampling_inputs(reqs, dev)))
        t0 = self._timed("verify", t0)
        ext = self.graphs.run("draft_extend", dict(base, **{
            k: acc[k] for k in ("acc_tokens", "accept_len", "bonus", "acc_feature")}))
        t0 = self._timed("draft_extend", t0)

        out = torch.cat([acc["accept_len"].unsqueeze(1), acc["acc_tokens"], acc["bonus"].unsqueeze(1)], 1)
        rows = out.tolist()  # the one host sync of the step
        emitted: list[list[int]] = []
        for i, (r, row) in enumerate(zip(reqs, rows)):
            a = row[0]
            toks = row[2 : 1 + a] + [row[-1]]  # accepted drafts after the root, then the bonus
            emitted.append(toks)
            r.seq_len += a
            r.stats.spec_steps += 1
            r.spec_state = _DraftState(ext["topk_logp"][i], ext["topk_ids"][i], ext["feature"][i])
            self.stats.accept_hist[a] += 1
        return emitted

    def record_served(self, tokens: list[int]) -> None:
        """Called by the engine with the tokens of a step it kept: hot-set coverage statistics."""
        self.stats.served += len(tokens)
        self.stats.hot_hits += sum(t in self.draft_vocab for t in tokens)

    # -- phases (pure tensor functions; graph-capturable) --------------------------------------
    def draft_phase(self, x: Tensors) -> Tensors:
        """`draft`: num_steps - 1 draft forwards over the top-k frontier, then the best N-1 nodes."""
        root, seq, tables = x["root"], x["seq"], x["tables"]
        b, k, m = root.shape[0], self.topk, self.scratch
        dev = root.device
        scores, tokens = [x["topk_logp"]], [x["topk_ids"]]
        parents = [torch.full((b, k), -1, dtype=torch.long, device=dev)]
        f_score, f_tok = x["topk_logp"], x["topk_ids"]
        f_global = torch.arange(k, device=dev).expand(b, k)
        f_feat = x["feature"].unsqueeze(1).expand(b, k, -1)
        f_mask = torch.zeros(b, k, max(m, 1), dtype=torch.bool, device=dev)
        branch = torch.arange(k, device=dev)
        for s in range(1, self.num_steps):
            scratch_idx = (s - 1) * k + branch  # this step's scratch kv index, relative to seq_len
            own = torch.arange(f_mask.shape[2], device=dev).unsqueeze(0) == scratch_idx.unsqueeze(1)
            f_mask = f_mask | own.unsqueeze(0)  # each frontier node also sees its own scratch slot
            fb = ForwardBatch(
                mode=ForwardMode.DRAFT, input_ids=f_tok.reshape(-1),
                positions=(seq + s - 1).repeat_interleave(k),
                out_cache_loc=slots_at(tables, seq.unsqueeze(1) + scratch_idx, self.block_size).view(-1),
                q_lens=torch.full((b,), k, dtype=torch.long, device=dev), kv_lens=seq + m,
                block_tables=tables, width=k, max_q=k, max_kv=self.max_kv, custom_mask=f_mask,
                hidden_in=f_feat.reshape(b * k, -1))
            h_logits, h_feat = self.draft_runner.forward(fb)
            logp, ids, _ = self._topk(h_logits, k)  # [B*K, K]
            c_score = (f_score.unsqueeze(2) + logp.view(b, k, k)).view(b, k * k)
            c_tok = ids.view(b, k * k)
            scores.append(c_score)
            tokens.append(c_tok)
            parents.append(f_global.unsqueeze(2).expand(b, k, k).reshape(b, k * k))
            if s == self.num_steps - 1:
                break
            j = torch.topk(c_score, k, dim=1).indices  # next frontier
            parent_local = j // k
            f_score, f_tok = torch.gather(c_score, 1, j), torch.gather(c_tok, 1, j)
            f_global = k + (s - 1) * k * k + j
            f_feat = torch.gather(h_feat.view(b, k, -1), 1,
                                  parent_local.unsqueeze(2).expand(b, k, h_feat.shape[-1]))
            f_mask = torch.gather(f_mask, 1, parent_local.unsqueeze(2).expand(b, k, f_mask.shape[2]))
        t = build_tree(root, torch.cat(scores, 1), torch.cat(tokens, 1), torch.cat(parents, 1),
                       self.num_draft_tokens, self.num_steps)
        return {"tokens": t.tokens, "parents": t.parents, "depth": t.depth, "mask": t.mask}

    def _verify_forward(self, x: Tensors) -> tuple[DraftTree, torch.Tensor, torch.Tensor]:
        """The target over every tree node; node i writes kv index seq_len + i."""
        tree = DraftTree(x["tokens"], x["parents"], x["depth"], x["mask"])
        seq, tables = x["seq"], x["tables"]
        b, n = tree.tokens.shape
        idx = seq.unsqueeze(1) + torch.arange(n, device=seq.device)
        fb = ForwardBatch(
            mode=ForwardMode.VERIFY, input_ids=tree.tokens.reshape(-1),
            positions=(seq.unsqueeze(1) + tree.depth).reshape(-1),
            out_cache_loc=slots_at(tables, idx, self.block_size).view(-1),
            q_lens=torch.full((b,), n, dtype=torch.long, device=seq.device), kv_lens=seq + n,
            block_tables=tables, width=n, max_q=n, max_kv=self.max_kv, custom_mask=tree.mask)
        hidden, aux = self.target_runner.forward(fb)
        logits = self.target.compute_logits(hidden).view(b, n, -1)
        return tree, logits, self._feature(hidden, aux).view(b, n, -1)

    def verify_phase(self, x: Tensors) -> Tensors:
        """`verify` + `accept` for an all-greedy batch."""
        tree, logits, feature = self._verify_forward(x)
        return self._commit(x, tree, verify_greedy(tree, logits, self.num_steps), feature)

    def verify_sample_phase(self, x: Tensors) -> Tensors:
        """`verify` + `accept` by tree rejection sampling (greedy rows: one-hot target)."""
        tree, logits, feature = self._verify_forward(x)
        b, n, v = logits.shape

        def rep(t: torch.Tensor) -> torch.Tensor:
            return t.repeat_interleave(n)

        probs = shape_logits_to_probs(logits.view(b * n, v), rep(x["temperature"]), rep(x["top_p"]),
                                      rep(x["top_k"]), rep(x["min_p"])).view(b, n, v)
        onehot = torch.zeros_like(probs).scatter_(2, logits.argmax(-1, keepdim=True), 1.0)
        probs = torch.where((x["temperature"] == 0).view(b, 1, 1), onehot, probs)
        acc = verify_stochastic(tree, probs, self.num_steps, x["seeds"], x["offsets"])
        return self._commit(x, tree, acc, feature)

    def _commit(self, x: Tensors, tree: DraftTree, acc: Acceptance, feature: torch.Tensor) -> Tensors:
        """Move accepted nodes' target KV from seq_len + path[i] to seq_len + i (a chain's path is
        already a prefix, so its move is a no-op); rows past the accepted length move trash."""
        seq, tables = x["seq"], x["tables"]
        kv = self.target_runner.kv
        d = torch.arange(acc.path.shape[1], device=seq.device)
        keep = d.unsqueeze(0) < acc.accept_len.unsqueeze(1)
        src = torch.where(keep, slots_at(tables, seq.unsqueeze(1) + acc.path, self.block_size), kv.trash_slot)
        dst = torch.where(keep, slots_at(tables, seq.unsqueeze(1) + d, self.block_size), kv.trash_slot)
        kv.move_slots(src.view(-1), dst.view(-1))
        b, w = acc.path.shape
        return {
            "acc_tokens": torch.gather(tree.tokens, 1, acc.path),
            "accept_len": acc.accept_len,
            "bonus": acc.bonus,
            "acc_feature": torch.gather(feature, 1, acc.path.unsqueeze(2).expand(b, w, feature.shape[-1])),
        }

    def draft_extend_phase(self, x: Tensors) -> Tensors:
        """`draft_extend`: the draft over the accepted tokens (shifted by one, the bonus last) at a
        fixed width of num_steps + 1 rows per request; the next root state is row accept_len - 1."""
        seq, tables, a = x["seq"], x["tables"], x["accept_len"]
        acc_tokens, feats = x["acc_tokens"], x["acc_feature"]
        b, w = acc_tokens.shape
        dev = seq.device
        d = torch.arange(w, device=dev).unsqueeze(0)
        shifted = torch.cat([acc_tokens[:, 1:], acc_tokens[:, :1]], 1)
        shifted = torch.where(d == (a - 1).unsqueeze(1), x["bonus"].unsqueeze(1), shifted)
        loc = torch.where(d < a.unsqueeze(1), slots_at(tables, seq.unsqueeze(1) + d, self.block_size),
                          self.draft_runner.kv.trash_slot)
        fb = ForwardBatch(
            mode=ForwardMode.DRAFT_EXTEND, input_ids=shifted.reshape(-1),
            positions=(seq.unsqueeze(1) + d).reshape(-1), out_cache_loc=loc.view(-1),
            q_lens=a, kv_lens=seq + a, block_tables=tables, width=w, max_q=w, max_kv=self.max_kv,
            hidden_in=feats.reshape(b * w, -1))
        h_logits, h_feat = self.draft_runner.forward(fb)
        last = torch.arange(b, device=dev) * w + a - 1
        logp, ids, logits = self._topk(h_logits[last], self.topk)
        return {"topk_logp": logp, "topk_ids": ids, "feature": h_feat[last], "logits": logits}

    # -- examples: static buffer shapes and padding rows (null block 0, length 1) ------------
    def _example_base(self, bs: int) -> Tensors:
        dev = self.device
        return {"seq": torch.ones(bs, dtype=torch.long, device=dev),
                "tables": torch.zeros(bs, self.max_blocks_per_seq, dtype=torch.int32, device=dev)}

    def _example_draft(self, bs: int) -> Tensors:
        k, dev = self.topk, self.device
        return dict(self._example_base(bs), root=torch.zeros(bs, dtype=torch.long, device=dev),
                    topk_logp=torch.full((bs, k), MAX_LOGP, device=dev),
                    topk_ids=torch.zeros(bs, k, dtype=torch.long, device=dev),
                    feature=torch.zeros(bs, self.draft.hidden_size, device=dev, dtype=self.dtype))

    def _example_verify(self, bs: int) -> Tensors:
        n, dev = self.num_draft_tokens, self.device
        eye = torch.eye(n, dtype=torch.bool, device=dev)
        return dict(self._example_base(bs), tokens=torch.zeros(bs, n, dtype=torch.long, device=dev),
                    parents=torch.zeros(bs, n, dtype=torch.long, device=dev),
                    depth=torch.zeros(bs, n, dtype=torch.long, device=dev),
                    mask=eye.expand(bs, n, n).contiguous())

    def _example_verify_sample(self, bs: int) -> Tensors:
        from hotspec.engine.vanilla_worker import example_sampling

        return dict(self._example_verify(bs), **example_sampling(bs, self.device))

    def _example_extend(self, bs: int) -> Tensors:
        w, dev = self.width, self.device
        feat = self.draft.target_feature_size
        return dict(self._example_base(bs), acc_tokens=torch.zeros(bs, w, dtype=torch.long, device=dev),
                    accept_len=torch.ones(bs, dtype=torch.long, device=dev),
                    bonus=torch.zeros(bs, dtype=torch.long, device=dev),
                    acc_feature=torch.zeros(bs, w, feat, device=dev, dtype=self.dtype))
