"""runtime/carry_pick through engine/launches.from_carry: the one-kernel pick gives the torch
spelling's values for every carried input (int64 vectors in groups of up to four; anything else
through torch), rows with `src` -1 keep the host's value. On the CPU the kernel runs in Triton's
interpreter (TRITON_INTERPRET=1, set by conftest.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from hotspec.engine import launches  # noqa: E402
from hotspec.runtime import carry_pick as cp  # noqa: E402


def _torch_from_carry(x: dict[str, torch.Tensor], carry: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    take = x["src"] >= 0
    row = x["src"].clamp(min=0)
    return dict(x, **{k: torch.where(take, buf[row], x[k]) for k, buf in carry.items() if k in x})


def _case(b: int, keys: int, seed: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    rows = 16
    x = {"src": torch.where(torch.rand(b, generator=g) < 0.5, -1, torch.randint(0, rows, (b,), generator=g)),
         "tables": torch.zeros(b, 3, dtype=torch.int32)}  # not carried: passes through
    carry = {}
    for i in range(keys):
        x[f"k{i}"] = torch.randint(0, 100, (b,), generator=g)
        carry[f"k{i}"] = torch.randint(100, 200, (rows,), generator=g)
    # a carried input the kernel does not take (float): torch's path
    x["feat"] = torch.randn(b, generator=g)
    carry["feat"] = torch.randn(rows, generator=g)
    carry["unused"] = torch.zeros(rows, dtype=torch.int64)  # carried but not an input here
    return x, carry


@pytest.mark.parametrize("keys", [1, 3, 4, 5])
@pytest.mark.parametrize("b", [1, 6, 37])
def test_from_carry_kernel_matches_torch(b, keys, monkeypatch) -> None:
    x, carry = _case(b, keys, seed=b * 10 + keys)
    assert (x["src"] >= 0).any() or b == 1
    calls = []
    real = launches.carry_pick
    monkeypatch.setattr(launches.fused, "enabled", lambda *t: True)
    monkeypatch.setattr(launches, "carry_pick", lambda *a: calls.append(len(a[1])) or real(*a))
    got = launches.from_carry(x, carry)
    want = _torch_from_carry(x, carry)
    assert got.keys() == want.keys() and "unused" not in got
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert calls == ([4, keys - 4] if keys > 4 else [keys])  # groups of at most four


def test_from_carry_without_fused_kernels_is_torch(monkeypatch) -> None:
    x, carry = _case(5, 2, seed=1)
    monkeypatch.setattr(launches.fused, "enabled", lambda *t: False)
    monkeypatch.setattr(launches, "carry_pick", lambda *a: pytest.fail("kernel used"))
    got, want = launches.from_carry(x, carry), _torch_from_carry(x, carry)
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_carry_pick_rejects_what_it_cannot_take() -> None:
    src = torch.tensor([0, -1])
    ok = (torch.zeros(2, dtype=torch.int64), torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="1 to 4 pairs"):
        cp.carry_pick(src, [ok] * 5)
    with pytest.raises(ValueError, match="src must be a unit-stride int64 vector"):
        cp.carry_pick(src.int(), [ok])
    with pytest.raises(ValueError, match="every pair must be unit-stride int64 vectors"):
        cp.carry_pick(src, [(torch.zeros(3, dtype=torch.int64), ok[1])])
    assert cp.carry_pick(src[:0], [(ok[0][:0], ok[1])])[0].shape == (0,)


@pytest.mark.gpu
def test_gpu_carry_pick_matches_torch() -> None:
    x, carry = _case(200, 3, seed=2)
    x = {k: v.cuda() for k, v in x.items()}
    carry = {k: v.cuda() for k, v in carry.items()}
    got, want = launches.from_carry(x, carry), _torch_from_carry(x, carry)
    assert all(torch.equal(got[k], want[k]) for k in want)
