"""runtime/decode_inputs: the one-kernel head of a vanilla decode step gives the torch answer
(the carry pick of runtime/carry.from_carry, batch_builder's slots, q_lens 1, kv_lens seq + 1)
with and without the overlap schedule's carry. On the CPU the kernel runs in Triton's
interpreter (TRITON_INTERPRET=1, set by conftest.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from hotspec.runtime import batch_builder  # noqa: E402
from hotspec.runtime import decode_inputs as di
from hotspec.runtime.carry import from_carry  # noqa: E402

PAGE = 16


def _case(b: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    width = 6
    tables = torch.randperm(b * width + 5, generator=g)[: b * width].view(b, width).to(torch.int32)
    return {"ids": torch.randint(0, 1000, (b,), generator=g),
            "seq": torch.randint(0, width * PAGE, (b,), generator=g),
            "tables": tables,
            # the overlap schedule: -1 where the host has the token, else a carry row
            "src": torch.where(torch.rand(b, generator=g) < 0.5, -1,
                               torch.randint(0, 64, (b,), generator=g)),
            "carry": torch.randint(1000, 2000, (64,), generator=g)}


def _kernel(x: dict[str, torch.Tensor], carried: bool, monkeypatch) -> di.DecodeInputs:
    monkeypatch.setattr(di.fused, "enabled", lambda *t: True)
    extra = (x["src"], x["carry"]) if carried else ()
    return di.decode_inputs(x["ids"], x["seq"], x["tables"], PAGE, *extra)


@pytest.mark.parametrize("carried", [False, True], ids=["host", "carry"])
@pytest.mark.parametrize("b", [1, 5, 40])
def test_kernel_matches_torch(b, carried, monkeypatch) -> None:
    x = _case(b, seed=b)
    extra = (x["src"], x["carry"]) if carried else ()
    want = di.decode_inputs_torch(x["ids"], x["seq"], x["tables"], PAGE, *extra)
    got = _kernel(x, carried, monkeypatch)
    for name, g, w in zip(("ids", "out_cache_loc", "q_lens", "kv_lens"), got, want):
        assert g.dtype == torch.int64 and torch.equal(g, w), name


def test_torch_path_is_the_engines_old_spelling() -> None:
    """The reference itself: from_carry's pick, slots_at, ones, seq + 1."""
    x = _case(7, seed=3)
    ids, loc, q_lens, kv_lens = di.decode_inputs_torch(x["ids"], x["seq"], x["tables"], PAGE,
                                                       x["src"], x["carry"])
    picked = from_carry({"ids": x["ids"], "src": x["src"]}, {"ids": x["carry"]})["ids"]
    assert torch.equal(ids, picked) and (x["src"] >= 0).any() and (x["src"] < 0).any()
    assert torch.equal(loc, batch_builder.slots_torch(x["tables"], x["seq"].unsqueeze(1), PAGE).view(-1))
    assert torch.equal(q_lens, torch.ones(7, dtype=torch.long)) and torch.equal(kv_lens, x["seq"] + 1)


def test_position_past_the_table_reads_block_zero(monkeypatch) -> None:
    """A padded graph row may sit past its (zero) table: the kernel reads block 0 there, where
    torch.gather would raise, and so writes the same slot the padding's zero table names."""
    x = _case(2, seed=4)
    x["seq"] = torch.tensor([6 * PAGE + 3, 5])
    _, loc, _, kv_lens = _kernel(x, False, monkeypatch)
    assert loc.tolist() == [3, int(x["tables"][1, 0]) * PAGE + 5] and kv_lens.tolist() == [6 * PAGE + 4, 6]


def test_src_and_carry_go_together() -> None:
    x = _case(2, seed=5)
    with pytest.raises(ValueError, match="src and carry go together"):
        di.decode_inputs(x["ids"], x["seq"], x["tables"], PAGE, x["src"])


@pytest.mark.gpu
@pytest.mark.parametrize("b", [1, 5, 200])
def test_gpu_kernel_matches_torch(b) -> None:
    x = {k: v.cuda() for k, v in _case(b, seed=10 + b).items()}
    for extra in ((), (x["src"], x["carry"])):
        got = di.decode_inputs(x["ids"], x["seq"], x["tables"], PAGE, *extra)
        want = di.decode_inputs_torch(x["ids"], x["seq"], x["tables"], PAGE, *extra)
        assert all(torch.equal(g, w) for g, w in zip(got, want))


@pytest.mark.gpu
def test_gpu_engine_tokens_equal_with_the_torch_head(monkeypatch) -> None:
    """The graphed engine (overlap schedule on, so tokens come through the carry; SmolLM2-shaped
    random weights; three requests in a graph of four, one padded row): the same greedy tokens
    with the kernel as with the torch spelling of the step's head."""
    from engine_utils import greedy_tokens, random_engine

    from hotspec.runtime import decode
    from hotspec.sampling_params import SamplingParams

    gen = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, 49152, (n,), generator=gen).tolist() for n in (7, 60, 250)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)

    def run() -> list[list[int]]:
        engine = random_engine(layers=4)
        assert engine.worker.overlapping
        toks = greedy_tokens(engine, prompts, params)
        engine.graphs.close()
        return toks

    want = run()
    assert all(len(t) == 40 for t in want)
    monkeypatch.setattr(decode, "decode_inputs", di.decode_inputs_torch)
    assert run() == want
