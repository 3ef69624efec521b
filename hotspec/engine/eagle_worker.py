"""EAGLE speculative decoding: prefill, then per step draft -> verify -> accept -> draft_extend.

Per-request draft state between steps (device tensors, on the Request): the draft's top-k
(log-probabilities and target ids) for the token after the root, and the draft feature at the
root's predecessor position. KV regions are described in runtime/forward_batch.py; the target and
draft pools share one block table. Inside `step` the host reads exactly one tensor (accepted
lengths and tokens); the ints it builds batches from (seq_len) are already on the host.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from hotspec.engine.request import Request
from hotspec.engine.vanilla_worker import sample_for
from hotspec.layers.sampler import SamplingTensors, shape_logits_to_probs
from hotspec.models.draft_head import DraftHead
from hotspec.models.llama import LlamaForCausalLM
from hotspec.runtime.batch_builder import block_table_tensor, last_token_index, prefill_batch, slots_at
from hotspec.runtime.forward_batch import ForwardBatch, ForwardMode
from hotspec.runtime.model_runner import ModelRunner
from hotspec.spec.tree import MAX_LOGP, DraftTree, build_tree
from hotspec.spec.verify import Acceptance, verify_greedy, verify_stochastic


@dataclass
class SpecStats:
    accept_hist: Counter[int] = field(default_factory=Counter)  # accepted tokens per verify pass
    phase_calls: Counter[str] = field(default_factory=Counter)
    phase_seconds: Counter[str] = field(default_factory=Counter)


@dataclass
class _DraftState:
    """What `draft` needs at the start of a step, per request (rows of a [B, ...] batch)."""
    topk_logp: torch.Tensor  # [B, K] draft log-probs of the depth-1 candidates
    topk_ids: torch.Tensor  # [B, K] their target ids
    feature: torch.Tensor  # [B, H] draft feature fed with the depth-1 candidates


class EagleWorker:
    def __init__(self, target: LlamaForCausalLM, draft: DraftHead, target_runner: ModelRunner,
                 draft_runner: ModelRunner, block_size: int, device: torch.device,
                 num_steps: int, topk: int, num_draft_tokens: int, profile: bool = False) -> None:
        self.target, self.draft = target, draft
        self.target_runner, self.draft_runner = target_runner, draft_runner
        self.block_size, self.device = block_size, device
        self.num_steps, self.topk, self.num_draft_tokens = num_steps, topk, num_draft_tokens
        self.scratch = topk * (num_steps - 1)  # draft-tree KV slots per request
        self.width = num_steps + 1  # draft_extend rows per request
        self.reserve = max(num_draft_tokens, self.scratch, self.width)
        self.profile = profile
        self.stats = SpecStats()
        target.capture_layers = tuple(draft.aux_layer_ids)

    # -- helpers -------------------------------------------------------------------------------
    def _feature(self, hidden: torch.Tensor, aux: list[torch.Tensor]) -> torch.Tensor:
        """What the draft head reads from the target: EAGLE-3's aux layers, else the final hidden."""
        return torch.cat(aux, dim=-1) if aux else hidden

    def _topk(self, h_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        logp = torch.log_softmax(self.draft.compute_logits(h_logits), dim=-1)
        top = torch.topk(logp, k, dim=-1)
        return top.values.clamp(max=MAX_LOGP), self.draft.to_target_ids(top.indices)

    def _timed(self, phase: str, t0: float) -> float:
        self.stats.phase_calls[phase] += 1
        if self.profile:
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            now = time.perf_counter()
            self.stats.phase_seconds[phase] += now - t0
            return now
        return t0

    # -- prefill -------------------------------------------------------------------------------
    def prefill(self, reqs: list[Request]) -> list[list[int]]:
        tokens = [r.prompt_token_ids + r.output_token_ids for r in reqs]
        fb = prefill_batch(reqs, tokens, self.block_size, self.device)
        hidden, aux = self.target_runner.forward(fb)
        last = last_token_index(fb)
        nxt = sample_for(reqs, self.target.compute_logits(hidden[last])).tolist()
        # The draft reads token p+1 with the target feature at p: the prompt shifted by one.
        shifted = [t[1:] + [n] for t, n in zip(tokens, nxt)]
        dfb = prefill_batch(reqs, shifted, self.block_size, self.device)
        dfb.hidden_in = self._feature(hidden, aux)
        h_logits, h_feat = self.draft_runner.forward(dfb)
        logp, ids = self._topk(h_logits[last], self.topk)
        for i, (r, t) in enumerate(zip(reqs, tokens)):
            r.seq_len += len(t)
            r.spec_state = _DraftState(logp[i], ids[i], h_feat[last[i]])
        return [[n] for n in nxt]

    # -- one speculative step ----------------------------------------------------------------
    @torch.inference_mode()
    def step(self, reqs: list[Request]) -> list[list[int]]:
        t0 = time.perf_counter()
        dev = self.device
        seq = torch.tensor([r.seq_len for r in reqs], dtype=torch.long, device=dev)
        tables = block_table_tensor(reqs, dev)
        max_seq = max(r.seq_len for r in reqs)
        state = _DraftState(*(torch.stack([getattr(r.spec_state, f) for r in reqs])
                              for f in ("topk_logp", "topk_ids", "feature")))
        root = torch.tensor([r.last_token for r in reqs], dtype=torch.long, device=dev)

        tree = self.draft_tree(root, state, seq, tables, max_seq)
        t0 = self._timed("draft", t0)
        logits, feature = self.verify_forward(tree, seq, tables, max_seq)
        t0 = self._timed("verify", t0)
        acc = self.accept(reqs, tree, logits)
        self.commit_target_kv(acc, seq, tables)
        t0 = self._timed("accept", t0)
        new_state = self.draft_extend(tree, acc, feature, seq, tables, max_seq)
        t0 = self._timed("draft_extend", t0)

        acc_tokens = torch.gather(tree.tokens, 1, acc.path)
        out = torch.cat([acc.accept_len.unsqueeze(1), acc_tokens, acc.bonus.unsqueeze(1)], 1)
        rows = out.tolist()  # the one host sync of the step
        emitted: list[list[int]] = []
        for i, (r, row) in enumerate(zip(reqs, rows)):
            a = row[0]
            emitted.append(row[2 : 1 + a] + [row[-1]])  # accepted drafts after the root, then bonus
            r.seq_len += a
            r.stats.spec_steps += 1
            r.spec_state = _DraftState(new_state.topk_logp[i], new_state.topk_ids[i],
                                       new_state.feature[i])
            self.stats.accept_hist[a] += 1
        return emitted

    def draft_tree(self, root: torch.Tensor, state: _DraftState, seq: torch.Tensor,
                   tables: torch.Tensor, max_seq: int) -> DraftTree:
        """`draft`: num_steps - 1 draft forwards over the top-k frontier, then the best N-1 nodes."""
        b, k, m = root.shape[0], self.topk, self.scratch
        dev = root.device
        scores, tokens = [state.topk_logp], [state.topk_ids]
        parents = [torch.full((b, k), -1, dtype=torch.long, device=dev)]
        f_score, f_tok = state.topk_logp, state.topk_ids
        f_global = torch.arange(k, device=dev).expand(b, k)
        f_feat = state.feature.unsqueeze(1).expand(b, k, -1)
        f_mask = torch.zeros(b, k, max(m, 1), dtype=torch.bool, device=dev)
        branch = torch.arange(k, device=dev)
        for s in range(1, self.num_steps):
            scratch_idx = (s - 1) * k + branch  # this step's scratch kv index, relative to seq_len
            f_mask = f_mask.clone()
            f_mask[:, branch, scratch_idx] = True
            fb = ForwardBatch(
                mode=ForwardMode.DRAFT, input_ids=f_tok.reshape(-1),
                positions=(seq + s - 1).repeat_interleave(k),
                out_cache_loc=slots_at(tables, seq.unsqueeze(1) + scratch_idx, self.block_size).view(-1),
                q_lens=torch.full((b,), k, dtype=torch.long, device=dev), kv_lens=seq + m,
                block_tables=tables, width=k, max_q=k, max_kv=max_seq + m, custom_mask=f_mask,
                hidden_in=f_feat.reshape(b * k, -1))
            h_logits, h_feat = self.draft_runner.forward(fb)
            logp, ids = self._topk(h_logits, k)  # [B*K, K]
            c_score = (f_score.unsqueeze(2) + logp.view(b, k, k)).view(b, k * k)
            c_tok = ids.view(b, k * k)
            scores.append(c_score)
            tokens.append(c_tok)
            parents.append(f_global.unsqueeze(2).expand(b, k, k).reshape(b, k * k))
            if s == self.num_steps - 1:
                break
            j = torch.topk(c_score, k, dim=1).indices  # next frontier
            parent_local = j // k
            base = k + (s - 1) * k * k
            f_score, f_tok = torch.gather(c_score, 1, j), torch.gather(c_tok, 1, j)
            f_global = base + j
            f_feat = torch.gather(h_feat.view(b, k, -1), 1,
                                  parent_local.unsqueeze(2).expand(b, k, h_feat.shape[-1]))
            f_mask = torch.gather(f_mask, 1, parent_local.unsqueeze(2).expand(b, k, f_mask.shape[2]))
        return build_tree(root, torch.cat(scores, 1), torch.cat(tokens, 1), torch.cat(parents, 1),
                          self.num_draft_tokens, self.num_steps)

    def verify_forward(self, tree: DraftTree, seq: torch.Tensor, tables: torch.Tensor,
                       max_seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`verify`: the target over every tree node; node i writes kv index seq_len + i."""
        b, n = tree.tokens.shape
        dev = seq.device
        idx = seq.unsqueeze(1) + torch.arange(n, device=dev)
        fb = ForwardBatch(
            mode=ForwardMode.VERIFY, input_ids=tree.tokens.reshape(-1),
            positions=(seq.unsqueeze(1) + tree.depth).reshape(-1),
            out_cache_loc=slots_at(tables, idx, self.block_size).view(-1),
            q_lens=torch.full((b,), n, dtype=torch.long, device=dev), kv_lens=seq + n,
            block_tables=tables, width=n, max_q=n, max_kv=max_seq + n, custom_mask=tree.mask)
        hidden, aux = self.target_runner.forward(fb)
        logits = self.target.compute_logits(hidden).view(b, n, -1)
        return logits, self._feature(hidden, aux).view(b, n, -1)

    def accept(self, reqs: list[Request], tree: DraftTree, logits: torch.Tensor) -> Acceptance:
        if all(r.params.temperature == 0 for r in reqs):
            return verify_greedy(tree, logits, self.num_steps)
        b, n, v = logits.shape
        st = SamplingTensors.from_params([r.params for r in reqs], [r.seed for r in reqs],
                                         [len(r.output_token_ids) for r in reqs], logits.device)
        rep = lambda x: x.repeat_interleave(n)  # noqa: E731
        probs = shape_logits_to_probs(logits.view(b * n, v), rep(st.temperature), rep(st.top_p),
                                      rep(st.top_k), rep(st.min_p)).view(b, n, v)
        greedy = (st.temperature == 0).view(b, 1, 1)
        onehot = torch.zeros_like(probs).scatter_(2, logits.argmax(-1, keepdim=True), 1.0)
        probs = torch.where(greedy, onehot, probs)
        return verify_stochastic(tree, probs, self.num_steps, st.seeds, st.offsets)

    def commit_target_kv(self, acc: Acceptance, seq: torch.Tensor, tables: torch.Tensor) -> None:
        """Move accepted nodes' target KV from seq_len + path[i] to seq_len + i (a chain is a
        no-op move); rows past the accepted length move trash to trash."""
        kv = self.target_runner.kv
        d = torch.arange(acc.path.shape[1], device=seq.device)
        keep = d.unsqueeze(0) < acc.accept_len.unsqueeze(1)
        src = torch.where(keep, slots_at(tables, seq.unsqueeze(1) + acc.path, self.block_size), kv.trash_slot)
        dst = torch.where(keep, slots_at(tables, seq.unsqueeze(1) + d, self.block_size), kv.trash_slot)
        kv.move_slots(src.view(-1), dst.view(-1))

    def draft_extend(self, tree: DraftTree, acc: Acceptance, feature: torch.Tensor,
                     seq: torch.Tensor, tables: torch.Tensor, max_seq: int) -> _DraftState:
        """`draft_extend`: the draft over the accepted tokens (shifted by one, the bonus last),
        fixed width num_steps + 1 per request; the next root state is row accept_len - 1."""
        b, w = acc.path.shape
        dev = seq.device
        a = acc.accept_len
        d = torch.arange(w, device=dev).unsqueeze(0)
        acc_tokens = torch.gather(tree.tokens, 1, acc.path)
        shifted = torch.cat([acc_tokens[:, 1:], acc_tokens[:, :1]], 1)
        shifted = torch.where(d == (a - 1).unsqueeze(1), acc.bonus.unsqueeze(1), shifted)
        feats = torch.gather(feature, 1, acc.path.unsqueeze(2).expand(b, w, feature.shape[-1]))
        loc = torch.where(d < a.unsqueeze(1), slots_at(tables, seq.unsqueeze(1) + d, self.block_size),
                          self.draft_runner.kv.trash_slot)
        fb = ForwardBatch(
            mode=ForwardMode.DRAFT_EXTEND, input_ids=shifted.reshape(-1),
            positions=(seq.unsqueeze(1) + d).reshape(-1), out_cache_loc=loc.view(-1),
            q_lens=a, kv_lens=seq + a, block_tables=tables, width=w, max_q=w, max_kv=max_seq + w,
            hidden_in=feats.reshape(b * w, -1))
        h_logits, h_feat = self.draft_runner.forward(fb)
        last = torch.arange(b, device=dev) * w + a - 1
        logp, ids = self._topk(h_logits[last], self.topk)
        return _DraftState(logp, ids, h_feat[last])

