"""The trainer's batches and losses, planned on the host (no GPU sync): every counted (index j,
step k) pair and its label, checked against a direct loop over records, positions and steps."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hotspec.training.features import FeatureBlock
from hotspec.training.losses import STEP_DECAY, eagle3_loss
from hotspec.training.trainer import epoch_batches, make_batch

pytestmark = pytest.mark.usefixtures("one_thread")

H, V, D = 8, 20, 12  # hidden, target vocabulary, draft vocabulary (ids 0..11)


class StubHead(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lm = torch.nn.Linear(H, D, bias=False, dtype=torch.float64)

    def compute_logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm(h)


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
