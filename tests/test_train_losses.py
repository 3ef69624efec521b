"""The trainer's batches and losses, planned on the host (no GPU sync): every counted (index j,
step k) pair and its label, checked against a direct loop over records, positions and steps; and
the EAGLE-3 cross-entropy in row chunks (chunked_ce), checked against the dense formula in value
and gradient, with its [rows, draft vocabulary] tensors bounded by the chunk size."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from hotspec.training import chunked_ce
from hotspec.training.features import FeatureBlock
from hotspec.training.head_forward import unroll
from hotspec.training.losses import STEP_DECAY, LossOut, eagle3_loss
from hotspec.training.trainer import epoch_batches, make_batch

pytestmark = pytest.mark.usefixtures("one_thread")

H, V, D = 8, 20, 12  # hidden, target vocabulary, draft vocabulary (ids 0..11)


class StubHead(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lm_head = torch.nn.Linear(H, D, bias=False, dtype=torch.float64)

    def compute_logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(h)


def block(lengths: list[int], prompts: list[int], seed: int = 0) -> FeatureBlock:
    g = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    return FeatureBlock(
        tokens=torch.randint(0, V, (n,), generator=g),
        offsets=torch.tensor([0] + lengths).cumsum(0),
        n_prompt=torch.tensor(prompts),
        feature=torch.randn(n, 3 * H, generator=g, dtype=torch.float64),
        final=torch.randn(n, H, generator=g, dtype=torch.float64),
        argmax=torch.randint(0, V, (n,), generator=g))


def test_eagle3_loss_counts_exactly_the_labelled_positions() -> None:
    data = block([9, 4, 13], [3, 3, 5])
    steps, records = 3, [2, 0, 1]
    batch = make_batch(data, records, torch.device("cpu"), steps)
    head = StubHead()
    g = torch.Generator().manual_seed(1)
    t = batch.tokens.shape[1]
    outs = [(torch.randn(3, t, H, generator=g, dtype=torch.float64), None) for _ in range(steps)]
    target_rows = torch.randn(D, H, generator=g, dtype=torch.float64)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[:D] = True
    got = eagle3_loss(head, batch, outs, target_rows, t2d)  # type: ignore[arg-type]

    total = torch.zeros((), dtype=torch.float64)
    for k in range(steps):
        terms = []
        counted = 0
        for b, r in enumerate(records):
            s, n_prompt = int(data.offsets[r]), int(data.n_prompt[r])
            length = int(data.offsets[r + 1]) - s
            for j in range(t):
                q = j + k + 1  # label position: the target's distribution at q
                if not (n_prompt - 1 <= q < length):
                    continue
                counted += 1
                if not t2d[data.argmax[s + q]]:
                    continue
                p = torch.softmax(F.linear(data.final[s + q], target_rows), -1)
                logp = torch.log_softmax(head.compute_logits(outs[k][0][b, j]), -1)
                terms.append(-(p * logp).sum())
        mean = torch.stack(terms).mean()
        assert got.counted[k] == counted
        torch.testing.assert_close(got.step_loss[k], mean.detach())
        total = total + STEP_DECAY ** k * mean
    torch.testing.assert_close(got.loss, total)


def test_batch_is_the_records_zero_padded() -> None:
    data = block([5, 2, 7], [1, 1, 2])
    batch = make_batch(data, [1, 2], torch.device("cpu"), 1)
    assert batch.tokens.shape == (2, 7)
    assert batch.tokens[0, :2].tolist() == data.tokens[5:7].tolist() and batch.tokens[0, 2:].eq(0).all()
    torch.testing.assert_close(batch.feature[1], data.feature[7:14])
    assert batch.lengths.tolist() == [2, 7]


def test_epoch_batches_group_lengths_and_cover_every_record_once() -> None:
    lengths = torch.randint(2, 50, (203,), generator=torch.Generator().manual_seed(0)).tolist()
    data = block(lengths, [1] * len(lengths))
    batches = epoch_batches(data, 4, seed=7)
    assert sorted(r for b in batches for r in b) == list(range(203))
    assert all(len(b) == 4 for b in batches[:-1]) and len(batches[-1]) == 3
    assert batches == epoch_batches(data, 4, seed=7) and batches != epoch_batches(data, 4, seed=8)
    spread = sum(max(lengths[r] for r in b) - min(lengths[r] for r in b) for b in batches) / len(batches)
    assert spread < 5  # grouped: records of a batch have similar lengths (random: about 24)


# --- the EAGLE-3 cross-entropy in row chunks -------------------------------------------------------


def dense_soft_ce(h: torch.Tensor, w: torch.Tensor, final: torch.Tensor,
                  target_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The formula chunked_ce computes, written densely (losses.eagle3_loss before chunking)."""
    soft = torch.promote_types(h.dtype, torch.float32)
    logp = torch.log_softmax(F.linear(h, w).to(soft), dim=-1)
    target_p = torch.softmax(F.linear(final, target_rows.to(final.dtype)).to(soft), dim=-1)
    return -(target_p * logp).sum(-1), logp.argmax(-1) == target_p.argmax(-1)


def ce_inputs(n: int, d: int, dtype: torch.dtype, hidden: int = H, seed: int = 0
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Head rows near the target's, so that argmaxes agree on some rows and not on others."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(d, hidden, generator=g, dtype=dtype)
    h = torch.randn(n, hidden, generator=g, dtype=dtype)
    target_rows = w + 0.5 * torch.randn(d, hidden, generator=g, dtype=dtype)
    final = h + 0.5 * torch.randn(n, hidden, generator=g, dtype=dtype)
    return h.requires_grad_(), w.requires_grad_(), final, target_rows


def ce_grads(fn: Any, h: torch.Tensor, w: torch.Tensor, final: torch.Tensor, target_rows: torch.Tensor,
             seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, hit, dh, dw) of fn with a random weight per row on the backward pass."""
    h, w = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    loss, hit = fn(h, w, final, target_rows)
    g = torch.rand(loss.shape, generator=torch.Generator().manual_seed(seed)).to(loss.dtype)
    (loss * g).sum().backward()
    assert h.grad is not None and w.grad is not None
    return loss.detach(), hit, h.grad, w.grad


def test_chunk_rows() -> None:
    assert chunked_ce.chunk_rows(8192) == 8192
    assert chunked_ce.chunk_rows(151936) == 441
    assert chunked_ce.chunk_rows(2 ** 30) == 1


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("n", [0, 1, 5, 23])
def test_soft_cross_entropy_equals_dense(dtype: torch.dtype, n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    d = 11
    monkeypatch.setattr(chunked_ce, "CHUNK_ELEMENTS", 5 * d)  # 5 rows a chunk: 23 = 4 * 5 + 3
    h, w, final, target_rows = ce_inputs(n, d, dtype)
    loss, hit, dh, dw = ce_grads(chunked_ce.soft_cross_entropy, h, w, final, target_rows)
    ref_loss, ref_hit, ref_dh, ref_dw = ce_grads(dense_soft_ce, h, w, final, target_rows)
    assert loss.dtype == ref_loss.dtype and dh.dtype == dw.dtype == dtype
    torch.testing.assert_close(loss, ref_loss)
    assert torch.equal(hit, ref_hit)
    torch.testing.assert_close(dh, ref_dh)
    torch.testing.assert_close(dw, ref_dw)
    if n == 0:
        assert loss.shape == (0,) and dh.shape == (0, H) and not dw.any()
    if n == 23:
        assert 0 < int(hit.sum()) < n  # both outcomes occur


def test_soft_cross_entropy_under_bf16_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 autocast (the trainer's on CUDA): the matmuls in bf16 as autocast's linear, softmax in
    float32, gradients in the (float32) dtypes of the head's rows and weight."""
    d, n = 37, 29
    monkeypatch.setattr(chunked_ce, "CHUNK_ELEMENTS", 8 * d)
    h, w, final, target_rows = ce_inputs(n, d, torch.float32, hidden=64)

    def under_autocast(fn: Any) -> Any:
        def run(*args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return fn(*args)  # type: ignore[no-any-return]
        return run

    loss, hit, dh, dw = ce_grads(under_autocast(chunked_ce.soft_cross_entropy), h, w, final, target_rows)
    ref_loss, ref_hit, ref_dh, ref_dw = ce_grads(under_autocast(dense_soft_ce), h, w, final, target_rows)
    assert loss.dtype == dh.dtype == dw.dtype == torch.float32
    torch.testing.assert_close(loss, ref_loss)  # the same bf16 logits, float32 from there
    assert torch.equal(hit, ref_hit)
    # dh adds the vocabulary blocks' bf16 products in float32 (the dense path rounds the whole sum
    # to bf16 once): equal up to bf16 rounding of the largest entries; dw is one product a block
    torch.testing.assert_close(dh, ref_dh, rtol=0, atol=2 ** -7 * float(ref_dh.abs().max()))
    torch.testing.assert_close(dw, ref_dw, rtol=0, atol=2 ** -7 * float(ref_dw.abs().max()))
    _, _, f32_dh, _ = ce_grads(dense_soft_ce, h, w, final, target_rows)
    assert not torch.allclose(dh, f32_dh, rtol=1e-4, atol=1e-6)  # autocast did change the matmuls


def test_soft_cross_entropy_keeps_no_rows_by_vocabulary(monkeypatch: pytest.MonkeyPatch) -> None:
    """A large draft vocabulary: forward saves only its inputs and two numbers a row (no [N, D]
    tensor), and no tensor made in forward or backward holds more than a chunk of logits (forward:
    rows of D columns; backward: blocks of the vocabulary over all rows)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    d, n, hidden = 50_000, 3000, 16
    monkeypatch.setattr(chunked_ce, "CHUNK_ELEMENTS", 2 ** 22)  # 83 rows a chunk
    rows = chunked_ce.chunk_rows(d)
    h, w, final, target_rows = ce_inputs(n, d, torch.float32, hidden=hidden)
    shapes: set[tuple[int, ...]] = set()

    class Shapes(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    shapes.add(tuple(t.shape))
            return out

    with Shapes():
        loss, _ = chunked_ce.soft_cross_entropy(h, w, final, target_rows)
        saved = [tuple(t.shape) for t in loss.grad_fn.saved_tensors]  # type: ignore[union-attr]
        loss.sum().backward()
    assert sorted(saved) == sorted([(n, hidden), (d, hidden), (n, hidden), (d, hidden), (2, n)])
    by_vocab = {s for s in shapes if d in s and s != (d, hidden)}
    assert by_vocab and max(s[0] if s[-1] == d else s[-1] for s in by_vocab) <= rows, by_vocab
    blocks = {s for s in shapes if n in s and s != (n, hidden) and s != (2, n)}
    assert blocks and max(s[0] if s[-1] == n else s[-1] for s in blocks) < d  # backward's blocks
    assert max(torch.Size(s).numel() for s in shapes) <= chunked_ce.CHUNK_ELEMENTS


def tiny_eagle3(d: int) -> tuple[Any, torch.Tensor, torch.Tensor, FeatureBlock]:
    """A float32 EAGLE-3 head of a random 4-layer target, its loss vocabulary (target rows, t2d)
    and records whose target argmax is in the draft vocabulary about half the time."""
    from hotspec.benchmark.random_models import random_state
    from hotspec.models.build import build_target
    from hotspec.models.config import ModelConfig
    from hotspec.training.head_init import aux_layers, build_head, head_config

    cfg = ModelConfig(architecture="llama", vocab_size=2 * d, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                      rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None,
                      max_position_embeddings=256, tie_word_embeddings=True, bos_token_id=1,
                      eos_token_ids=(2,))
    cpu = torch.device("cpu")
    target = build_target(cfg, random_state(cfg, cpu, torch.float32), torch.float32, cpu)
    config = head_config(cfg, "EAGLE3", d)
    d2t = torch.arange(0, 2 * d, 2)
    t2d = torch.zeros(2 * d, dtype=torch.bool)
    t2d[d2t] = True
    head = build_head(target, config, "EAGLE3", d2t, cpu, seed=0)
    lengths = [11, 7, 16, 9]
    g = torch.Generator().manual_seed(3)
    n, n_aux = sum(lengths), len(aux_layers(config, cfg, "EAGLE3"))
    data = FeatureBlock(
        tokens=torch.randint(0, 2 * d, (n,), generator=g),
        offsets=torch.tensor([0] + lengths).cumsum(0),
        n_prompt=torch.tensor([2, 3, 1, 4]),
        feature=torch.randn(n, n_aux * 32, generator=g),
        final=torch.randn(n, 32, generator=g),
        argmax=torch.randint(0, 2 * d, (n,), generator=g))
    return head, target.lm_head.weight[d2t].detach(), t2d, data


def dense_eagle3_loss(head: Any, batch: Any, outs: list[tuple[torch.Tensor, torch.Tensor]],
                      target_rows: torch.Tensor, t2d: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """eagle3_loss as it was written with whole [N, D] tensors: (loss, step_loss, step_acc)."""
    finals, argmax = batch.final.flatten(0, 1), batch.argmax.flatten()
    terms, losses, accs = [], [], []
    for k, (hidden, _) in enumerate(outs):
        rows = batch.rows[k]
        nxt = rows + k + 1
        with torch.no_grad():
            final = finals[nxt]
            target_p = torch.softmax(F.linear(final, target_rows.to(final.dtype)).float(), dim=-1)
            in_vocab = t2d[argmax[nxt]].float()
        logp = torch.log_softmax(head.compute_logits(hidden.flatten(0, 1)[rows]), dim=-1)
        n = in_vocab.sum().clamp_min(1.0)
        loss = (-(target_p * logp).sum(-1) * in_vocab).sum() / n
        terms.append(STEP_DECAY ** k * loss)
        losses.append(loss.detach())
        accs.append(((logp.argmax(-1) == target_p.argmax(-1)).float() * in_vocab).sum() / n)
    return sum(terms), torch.stack(losses), torch.stack(accs)  # type: ignore[return-value]


def test_eagle3_loss_equals_the_dense_loss_on_a_real_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """Value, per-step loss and accuracy, and the gradient of every trainable parameter (the LM
    head's included), over several chunks per step; the last step counts no position."""
    d, steps = 24, 4
    monkeypatch.setattr(chunked_ce, "CHUNK_ELEMENTS", 7 * d)  # 7 rows a chunk
    head, target_rows, t2d, data = tiny_eagle3(d)
    batch = make_batch(data, [0, 1, 2, 3], torch.device("cpu"), steps)
    batch.rows[-1] = batch.rows[-1][:0]  # an empty step: a zero that still reaches the graph
    params = {k: p for k, p in head.named_parameters() if p.requires_grad}
    assert "lm_head.weight" in params

    def run(loss_fn: Any) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
        head.zero_grad(set_to_none=True)
        outs = unroll(head, batch.tokens, batch.feature, steps)
        got = loss_fn(head, batch, outs, target_rows, t2d)
        values = (got.loss, got.step_loss, got.step_acc) if isinstance(got, LossOut) else got
        values[0].backward()
        return tuple(v.detach() for v in values), {k: p.grad.clone() for k, p in params.items()
                                                  if p.grad is not None}

    (loss, step_loss, step_acc), grads = run(eagle3_loss)
    (ref_loss, ref_step_loss, ref_step_acc), ref_grads = run(dense_eagle3_loss)
    assert min(r.numel() for r in batch.rows[:-1]) > 7  # several chunks a step
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(step_loss, ref_step_loss)
    torch.testing.assert_close(step_acc, ref_step_acc)
    assert step_loss[-1] == 0 and step_acc[-1] == 0 and step_acc[:-1].sum() > 0
    assert grads.keys() == ref_grads.keys() == params.keys()
    for k in params:
        torch.testing.assert_close(grads[k], ref_grads[k], msg=k)
