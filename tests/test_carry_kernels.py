"""runtime/carry_kernels through engine/carrying.from_carry and to_carry: the one-kernel pick
gives the torch spelling's values for every carried input (int64 vectors in groups of up to four;
anything else through torch), rows with `src` -1 keep the host's value; the one-kernel put
stores values (plus their addends) into the carry's first rows, the rest untouched. On the CPU
the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import hotspec.runtime.carry as carrying  # noqa: E402
from hotspec.runtime import carry_kernels as cp  # noqa: E402


def _torch_from_carry(x: dict[str, torch.Tensor], carry: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    take = x["src"] >= 0
    row = x["src"].clamp(min=0)
    return dict(x, **{k: torch.where(take, buf[row], x[k]) for k, buf in carry.items() if k in x})


def _case(b: int, keys: int, seed: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    rows = b + 11  # the carry is longer than one step's rows
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
    real = cp.carry_pick
    monkeypatch.setattr(carrying.fused, "enabled", lambda *t: True)
    monkeypatch.setattr(cp, "carry_pick", lambda *a: calls.append(len(a[1])) or real(*a))
    got = carrying.from_carry(x, carry)
    want = _torch_from_carry(x, carry)
    assert got.keys() == want.keys() and "unused" not in got
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert calls == ([4, keys - 4] if keys > 4 else [keys])  # groups of at most four


def test_from_carry_without_fused_kernels_is_torch(monkeypatch) -> None:
    x, carry = _case(5, 2, seed=1)
    monkeypatch.setattr(carrying.fused, "enabled", lambda *t: False)
    monkeypatch.setattr(cp, "carry_pick", lambda *a: pytest.fail("kernel used"))
    got, want = carrying.from_carry(x, carry), _torch_from_carry(x, carry)
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


def _put_case(b: int, seed: int) -> tuple[dict, dict, dict]:
    g = torch.Generator().manual_seed(seed)
    rows = b + 11  # the carry is longer than one step's rows
    carry = {k: torch.full((rows,), -9, dtype=torch.int64) for k in ("seq", "root", "offsets", "e", "f")}
    carry["feat"] = torch.zeros(rows)
    values = {k: torch.randint(0, 100, (b,), generator=g) for k in ("seq", "root", "offsets", "e", "f")}
    values["feat"] = torch.randn(b, generator=g)  # not int64: torch's path
    a = torch.randint(1, 5, (b,), generator=g)
    return carry, values, {"seq": a, "offsets": a, "feat": torch.ones(b)}


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "torch"])
def test_to_carry_stores_values_plus_addends(kernel, monkeypatch) -> None:
    carry, values, plus = _put_case(5, seed=3)
    calls = []
    real = cp.carry_put
    monkeypatch.setattr(carrying.fused, "enabled", lambda *t: kernel)
    monkeypatch.setattr(cp, "carry_put", lambda items: calls.append(len(items)) or real(items))
    carrying.to_carry(carry, values, plus=plus)
    for k, v in values.items():
        want = v + plus[k] if k in plus else v
        assert torch.equal(carry[k][:5], want.to(carry[k].dtype)), k
        assert (carry[k][5:] == (-9 if carry[k].dtype == torch.int64 else 0)).all(), k
    assert calls == ([4, 1] if kernel else [])  # five int64 vectors: groups of four


def test_to_carry_rejects_addends_without_values() -> None:
    carry, values, _ = _put_case(2, seed=4)
    with pytest.raises(ValueError, match=r"addends without values: \['x'\]"):
        carrying.to_carry(carry, values, plus={"x": torch.zeros(2, dtype=torch.int64)})


def test_to_carry_rejects_a_carry_shorter_than_its_values() -> None:
    carry, values, _ = _put_case(4, seed=6)
    carry["e"] = carry["e"][:3]
    with pytest.raises(ValueError, match=r"carry\['e'\] holds 3 rows, the values 4"):
        carrying.to_carry(carry, values)


def test_carry_put_rejects_what_it_cannot_take() -> None:
    v, buf = torch.zeros(3, dtype=torch.int64), torch.zeros(8, dtype=torch.int64)
    with pytest.raises(ValueError, match="1 to 4 items"):
        cp.carry_put([])
    with pytest.raises(ValueError, match="unit-stride int64 vectors of one length"):
        cp.carry_put([(v, None, buf[:2])])  # the buffer shorter than the values
    with pytest.raises(ValueError, match="unit-stride int64 vectors of one length"):
        cp.carry_put([(v, None, buf), (v[:2], None, buf)])


@pytest.mark.gpu
def test_gpu_carry_put_matches_torch() -> None:
    carry, values, plus = _put_case(200, seed=5)
    carry = {k: t.cuda() for k, t in carry.items()}
    ref = {k: t.clone() for k, t in carry.items()}
    values = {k: t.cuda() for k, t in values.items()}
    plus = {k: t.cuda() for k, t in plus.items()}
    carrying.to_carry(carry, values, plus=plus)
    for k, v in values.items():
        ref[k][:200].copy_(v + plus[k] if k in plus else v)
        assert torch.equal(carry[k], ref[k]), k


@pytest.mark.gpu
def test_gpu_carry_pick_matches_torch() -> None:
    x, carry = _case(200, 3, seed=2)
    x = {k: v.cuda() for k, v in x.items()}
    carry = {k: v.cuda() for k, v in carry.items()}
    got, want = carrying.from_carry(x, carry), _torch_from_carry(x, carry)
    assert all(torch.equal(got[k], want[k]) for k in want)
