"""The speculative step's phases after prefill, as pure functions of batch-leading tensors.

`draft` -> `verify` (or `verify[sample]`) with `accept` -> `draft_extend`, or all three as one
`step` (`step[sample]`) when the engine fuses them (`fuse_spec_step`). Each reads and returns
a dict of device tensors and never syncs with the host, so the GraphRunner can serve it as a CUDA
graph, from static buffers, or eagerly; the `_example_*` methods give each phase's static buffer
shapes. KV regions are described in runtime/forward_batch.py; target and draft pools share one
block table. The host-side step that chains the phases is engine/eagle_worker.py.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hotspec.engine.launches import from_carry, to_carry
from hotspec.engine.vanilla_worker import example_sampling
from hotspec.layers.argmax import argmax
from hotspec.layers.sampler import shape_logits_to_probs
from hotspec.layers.topk_logp import topk_logp
from hotspec.models.draft_head import DraftHead
from hotspec.models.llama import LlamaForCausalLM
from hotspec.runtime.batch_builder import slots_at
from hotspec.runtime.forward_batch import ForwardBatch, ForwardMode
from hotspec.runtime.graph_runner import Tensors
from hotspec.runtime.model_runner import ModelRunner
from hotspec.spec.frontier import next_frontier
from hotspec.spec.tree import MAX_LOGP, DraftTree, build_tree
from hotspec.spec.verify import Acceptance, verify_greedy, verify_stochastic


def emitted_rows(acc: Tensors) -> torch.Tensor:
    """What the host reads after a step, as one [B, 2 + width] tensor (one copy, one sync): per
    request the accept length a, the accepted path (root first) and the bonus token."""
    return torch.cat([acc["accept_len"].unsqueeze(1), acc["acc_tokens"], acc["bonus"].unsqueeze(1)], 1)


class EaglePhases:
    # The overlap schedule's row buffers ("seq", "root", "offsets"; engine/launches.py), which
    # the fused step reads for rows with `src` >= 0 and writes for the next step; None: unused.
    carry: Tensors | None = None

    def __init__(self, target: LlamaForCausalLM, draft: DraftHead, target_runner: ModelRunner,
                 draft_runner: ModelRunner, block_size: int, device: torch.device, num_steps: int,
                 topk: int, num_draft_tokens: int, max_blocks_per_seq: int) -> None:
        self.target, self.draft = target, draft
        self.target_runner, self.draft_runner = target_runner, draft_runner
        self.block_size, self.device = block_size, device
        self.num_steps, self.topk, self.num_draft_tokens = num_steps, topk, num_draft_tokens
        self.scratch = topk * (num_steps - 1)  # draft-tree KV slots per request
        self.width = num_steps + 1  # draft_extend rows per request
        self.reserve = max(num_draft_tokens, self.scratch, self.width)
        self.max_blocks_per_seq = max_blocks_per_seq
        self.max_kv = max_blocks_per_seq * block_size  # attention bound for static shapes
        self.dtype = target.lm_head.weight.dtype  # activations (hidden states, features)
        target.capture_layers = tuple(draft.aux_layer_ids)

    # -- helpers -------------------------------------------------------------------------------
    def _feature(self, hidden: torch.Tensor, aux: list[torch.Tensor]) -> torch.Tensor:
        """What the draft head reads from the target: EAGLE-3's aux layers, else the final hidden."""
        return torch.cat(aux, dim=-1) if aux else hidden

    def _topk(self, h_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = self.draft.draft_logits(h_logits)  # [T, draft_vocab]: sized by the head
        logp, idx = topk_logp(logits, k, MAX_LOGP)
        return logp, self.draft.to_target_ids(idx), logits

    # -- phases (pure tensor functions; graph-capturable) --------------------------------------
    def draft_phase(self, x: Tensors) -> Tensors:
        """`draft`: num_steps - 1 draft forwards over the top-k frontier, then the best N-1 nodes."""
        root, seq, tables = x["root"], x["seq"], x["tables"]
        b, k, m, n_fw = root.shape[0], self.topk, self.scratch, self.num_steps - 1
        dev = root.device
        scores, tokens = [x["topk_logp"]], [x["topk_ids"]]
        f_score, f_tok = x["topk_logp"], x["topk_ids"]
        f_global = torch.arange(k, device=dev).expand(b, k)
        f_globals: list[torch.Tensor] = []  # each step's frontier: the parents of its k*k children
        f_feat = x["feature"].unsqueeze(1).expand(b, k, -1).reshape(b * k, -1)
        if n_fw > 0:
            # What the forwards need and that does not depend on what they draft, once for all
            # steps (a few small kernels each, per step, otherwise; the loop is launch-bound):
            # step s (1-based) writes scratch kv index (s-1)*k + i for frontier node i, at
            # position seq + s - 1.
            sidx = torch.arange(m, device=dev)
            locs = slots_at(tables, seq.unsqueeze(1) + sidx, self.block_size)  # [B, M]
            # (contiguous: with k == 1 the reshape is a strided view, and kernels read the rows of
            # these with unit stride)
            locs = locs.view(b, n_fw, k).transpose(0, 1).reshape(n_fw, b * k).contiguous()
            steps = torch.arange(n_fw, device=dev).view(n_fw, 1, 1)
            positions = (seq.view(1, b, 1) + steps).expand(n_fw, b, k).reshape(n_fw, b * k).contiguous()
            owns = sidx.view(n_fw, k, 1) == sidx  # [S-1, K, M]: node i of step s sees its own slot
            f_mask = owns[0].expand(b, k, m).contiguous()  # the roots see only their own slot
            q_lens = torch.full((b,), k, dtype=torch.long, device=dev)
            kv_lens = seq + m
        for s in range(1, self.num_steps):
            fb = ForwardBatch(
                mode=ForwardMode.DRAFT, input_ids=f_tok.reshape(-1), positions=positions[s - 1],
                out_cache_loc=locs[s - 1], q_lens=q_lens, kv_lens=kv_lens, block_tables=tables,
                width=k, max_q=k, max_kv=self.max_kv, custom_mask=f_mask, hidden_in=f_feat)
            h_logits, h_feat = self.draft_runner.forward(fb)
            logp, ids, _ = self._topk(h_logits, k)  # [B*K, K]
            tokens.append(ids.view(b, k * k))
            f_globals.append(f_global)
            if s == self.num_steps - 1:
                scores.append((f_score.unsqueeze(2) + logp.view(b, k, k)).view(b, k * k))
                break
            c_score, f_score, f_tok, f_global, f_feat, f_mask = next_frontier(
                f_score, logp, ids, h_feat, f_mask, owns[s], k + (s - 1) * k * k)
            scores.append(c_score)
        parents = [torch.full((b, k), -1, dtype=torch.long, device=dev)]
        if f_globals:  # every child of frontier node i has parent i: [B, S-1, K] -> [B, (S-1)*K*K]
            fg = torch.stack(f_globals, 1)
            parents.append(fg.unsqueeze(3).expand(b, n_fw, k, k).reshape(b, n_fw * k * k))
        t = build_tree(root, torch.cat(scores, 1), torch.cat(tokens, 1), torch.cat(parents, 1),
                       self.num_draft_tokens, self.num_steps)
        return {"tokens": t.tokens, "parents": t.parents, "depth": t.depth, "mask": t.mask}

    def _verify_forward(self, x: Tensors) -> tuple[DraftTree, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The target over every tree node; node i writes kv index seq_len + i. Also returns the
        slots of kv indices seq_len + [0, max(N, num_steps + 1)), which the commit reuses."""
        tree = DraftTree(x["tokens"], x["parents"], x["depth"], x["mask"])
        seq, tables = x["seq"], x["tables"]
        b, n = tree.tokens.shape
        span = torch.arange(max(n, self.num_steps + 1), device=seq.device)
        slots = slots_at(tables, seq.unsqueeze(1) + span, self.block_size)
        fb = ForwardBatch(
            mode=ForwardMode.VERIFY, input_ids=tree.tokens.reshape(-1),
            positions=(seq.unsqueeze(1) + tree.depth).reshape(-1),
            out_cache_loc=slots[:, :n].reshape(-1),
            q_lens=torch.full((b,), n, dtype=torch.long, device=seq.device), kv_lens=seq + n,
            block_tables=tables, width=n, max_q=n, max_kv=self.max_kv, custom_mask=tree.mask)
        hidden, aux = self.target_runner.forward(fb)
        logits = self.target.compute_logits(hidden).view(b, n, -1)
        return tree, logits, self._feature(hidden, aux).view(b, n, -1), slots

    def verify_phase(self, x: Tensors, with_slots: bool = False) -> Tensors:
        """`verify` + `accept` for an all-greedy batch (`with_slots`: see _commit)."""
        tree, logits, feature, slots = self._verify_forward(x)
        return self._commit(tree, verify_greedy(tree, logits, self.num_steps), feature, slots,
                            with_slots)

    def verify_sample_phase(self, x: Tensors, with_slots: bool = False) -> Tensors:
        """`verify` + `accept` by tree rejection sampling (greedy rows: one-hot target)."""
        tree, logits, feature, slots = self._verify_forward(x)
        b, n, v = logits.shape

        def rep(t: torch.Tensor) -> torch.Tensor:
            return t.repeat_interleave(n)

        probs = shape_logits_to_probs(logits.view(b * n, v), rep(x["temperature"]), rep(x["top_p"]),
                                      rep(x["top_k"]), rep(x["min_p"])).view(b, n, v)
        onehot = torch.zeros_like(probs).scatter_(2, argmax(logits).unsqueeze(-1), 1.0)
        probs = torch.where((x["temperature"] == 0).view(b, 1, 1), onehot, probs)
        acc = verify_stochastic(tree, probs, self.num_steps, x["seeds"], x["offsets"])
        return self._commit(tree, acc, feature, slots, with_slots)

    def _commit(self, tree: DraftTree, acc: Acceptance, feature: torch.Tensor,
                slots: torch.Tensor, with_slots: bool = False) -> Tensors:
        """Move accepted nodes' target KV from seq_len + path[i] to seq_len + i (a chain's path is
        already a prefix, so its move is a no-op); rows past the accepted length move trash.
        `slots[:, j]` is the slot of kv index seq_len + j; `with_slots` passes those of the
        draft_extend rows on (the fused step: draft_extend need not look them up again)."""
        kv = self.target_runner.kv
        b, w = acc.path.shape
        keep = torch.arange(w, device=slots.device).unsqueeze(0) < acc.accept_len.unsqueeze(1)
        src = torch.where(keep, torch.gather(slots, 1, acc.path), kv.trash_slot)
        dst = torch.where(keep, slots[:, :w], kv.trash_slot)
        kv.move_slots(src.reshape(-1), dst.reshape(-1))
        return {
            "acc_tokens": torch.gather(tree.tokens, 1, acc.path),
            "accept_len": acc.accept_len,
            "bonus": acc.bonus,
            "acc_feature": torch.gather(feature, 1, acc.path.unsqueeze(2).expand(b, w, feature.shape[-1])),
        } | ({"slots": slots[:, :w]} if with_slots else {})

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
        slots = x["slots"] if "slots" in x else slots_at(tables, seq.unsqueeze(1) + d, self.block_size)
        loc = torch.where(d < a.unsqueeze(1), slots, self.draft_runner.kv.trash_slot)
        fb = ForwardBatch(
            mode=ForwardMode.DRAFT_EXTEND, input_ids=shifted.reshape(-1),
            positions=(seq.unsqueeze(1) + d).reshape(-1), out_cache_loc=loc.view(-1),
            q_lens=a, kv_lens=seq + a, block_tables=tables, width=w, max_q=w, max_kv=self.max_kv,
            hidden_in=feats.reshape(b * w, -1))
        h_logits, h_feat = self.draft_runner.forward(fb)
        last = torch.arange(b, device=dev) * w + a - 1
        logp, ids, logits = self._topk(h_logits[last], self.topk)
        return {"topk_logp": logp, "topk_ids": ids, "feature": h_feat[last], "logits": logits}

    def step_phase(self, x: Tensors) -> Tensors:
        """`step`: draft -> verify -> draft_extend as one function (one graph per batch size)."""
        return self._step(x, self.verify_phase)

    def step_sample_phase(self, x: Tensors) -> Tensors:
        """`step[sample]`: the same with `verify[sample]`."""
        return self._step(x, self.verify_sample_phase)

    def _step(self, x: Tensors, verify: Callable[[Tensors, bool], Tensors]) -> Tensors:
        if self.carry is not None:
            x = from_carry(x, self.carry)
        tree = self.draft_phase(x)
        acc = verify(dict(x, **tree), True)
        # What needs only the verdict runs before draft_extend, not after its LM head: the small
        # plain kernels at a graph's tail slow every plain launch of the replay (RESULTS "Session
        # 13", the decode graph); here they sit between two large phases instead.
        emitted = emitted_rows(acc)
        if self.carry is not None:  # seq + accepted, the bonus (next root), offset + emitted
            a = acc["accept_len"]
            offsets = "offsets" in x
            to_carry(self.carry, {"seq": x["seq"], "root": acc["bonus"]}
                     | ({"offsets": x["offsets"]} if offsets else {}),
                     plus={"seq": a} | ({"offsets": a} if offsets else {}))
        ext = self.draft_extend_phase({"seq": x["seq"], "tables": x["tables"], **acc})
        return {"emitted": emitted, "topk_logp": ext["topk_logp"],
                "topk_ids": ext["topk_ids"], "feature": ext["feature"]}

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

    def _example_step(self, bs: int) -> Tensors:
        x = self._example_draft(bs)
        if self.carry is not None:  # padding rows read the host's values
            x["src"] = torch.full((bs,), -1, dtype=torch.long, device=self.device)
        return x

    def _example_step_sample(self, bs: int) -> Tensors:
        return dict(self._example_step(bs), **example_sampling(bs, self.device))

    def _example_verify(self, bs: int) -> Tensors:
        n, dev = self.num_draft_tokens, self.device
        eye = torch.eye(n, dtype=torch.bool, device=dev)
        return dict(self._example_base(bs), tokens=torch.zeros(bs, n, dtype=torch.long, device=dev),
                    parents=torch.zeros(bs, n, dtype=torch.long, device=dev),
                    depth=torch.zeros(bs, n, dtype=torch.long, device=dev),
                    mask=eye.expand(bs, n, n).contiguous())

    def _example_verify_sample(self, bs: int) -> Tensors:
        return dict(self._example_verify(bs), **example_sampling(bs, self.device))

    def _example_extend(self, bs: int) -> Tensors:
        w, dev = self.width, self.device
        feat = self.draft.target_feature_size
        return dict(self._example_base(bs), acc_tokens=torch.zeros(bs, w, dtype=torch.long, device=dev),
                    accept_len=torch.ones(bs, dtype=torch.long, device=dev),
                    bonus=torch.zeros(bs, dtype=torch.long, device=dev),
                    acc_feature=torch.zeros(bs, w, feat, device=dev, dtype=self.dtype))
