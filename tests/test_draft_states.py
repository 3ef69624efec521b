"""The speculative step's draft states: a request keeps a reference to the batch its draft row
was written in and its row there; a batch of requests gathers them back in order."""

from __future__ import annotations

import pytest
import torch

from hotspec.core.request import DraftRow
from hotspec.speculative.programs import STATE, gather_rows


def _batch(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 4, generator=g), torch.randint(0, 999, (n, 4), generator=g),
            torch.randn(n, 12, generator=g).to(torch.bfloat16))


def _stacked(rows: list[DraftRow]) -> dict[str, torch.Tensor]:
    return {f: torch.stack([getattr(r, f)[r.at] for r in rows]) for f in STATE}


def test_rows_from_a_few_batches_gather_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch that changed by a few requests: the last step's rows with two gone, a prefill's
    two rows inside and another's at the end; joined as runs (no row stacked one by one), equal
    to stacking each row."""
    last, pre1, pre2 = _batch(48, 0), _batch(3, 1), _batch(2, 2)
    rows = [DraftRow(*last, i) for i in range(48) if i not in (10, 30)]
    rows[5:5] = [DraftRow(*pre1, 0), DraftRow(*pre1, 1)]
    rows.append(DraftRow(*pre2, 1))
    want = _stacked(rows)
    with monkeypatch.context() as m:
        m.setattr(torch, "stack", None)  # (6 runs of 49 rows: the runs' path)
        got = gather_rows(rows)
    for f in STATE:
        assert torch.equal(getattr(got, f), want[f]), f


def test_rows_from_many_batches_and_small_batches_stack() -> None:
    sources = [_batch(2, s) for s in range(30)]
    rows = [DraftRow(*sources[i], i % 2) for i in range(30)]  # a batch each: stacked
    small = [DraftRow(*sources[0], 1), DraftRow(*sources[1], 0)]
    for case in (rows, small):
        got = gather_rows(case)
        for f, want in _stacked(case).items():
            assert torch.equal(getattr(got, f), want), f


def test_a_whole_batch_in_order_is_its_own_tensors() -> None:
    b = _batch(20, 3)
    got = gather_rows([DraftRow(*b, i) for i in range(20)])
    assert got.topk_logp is b[0] and got.topk_ids is b[1] and got.feature is b[2]
    part = gather_rows([DraftRow(*b, i) for i in range(19)])  # a prefix is gathered, not aliased
    assert part.feature.shape[0] == 19 and torch.equal(part.feature, b[2][:19])
