"""runtime/slots_kernel: the one-kernel slot lookup gives batch_builder.slots_at's torch answer
(int64 slots through int32 block tables) for every index layout the engine passes: a column
view of the sequence lengths, a [B, n] span, an expanded row, int32 and int64 indices. On the
CPU the kernel runs in Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from hotspec.runtime import batch_builder  # noqa: E402
from hotspec.runtime.slots_kernel import slots_rows  # noqa: E402

PAGE = 16


def _torch_slots(tables: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return batch_builder.slots_torch(tables, index, PAGE)


def _tables(b: int, width: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(b * width + 7, generator=g)[: b * width].view(b, width).to(torch.int32)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=["i64", "i32"])
def test_slots_rows_match_torch(dtype) -> None:
    tables = _tables(5, 9, seed=1)
    g = torch.Generator().manual_seed(2)
    seq = torch.randint(0, 9 * PAGE - 20, (5,), generator=g).to(dtype)
    span = torch.arange(17, dtype=dtype)
    cases = {
        "column view of seq": seq.unsqueeze(1),
        "span": seq.unsqueeze(1) + span,
        "expanded row": seq[:1].unsqueeze(1).expand(5, 3),
        "transposed": (seq.unsqueeze(0) + span[:3].unsqueeze(1)).t(),
    }
    for name, index in cases.items():
        got = slots_rows(tables, index, PAGE)
        assert got.dtype == torch.int64 and torch.equal(got, _torch_slots(tables, index)), name


def test_slots_at_dispatches_to_the_kernel(monkeypatch) -> None:
    """slots_at takes the kernel where fused kernels apply (forced here, on the CPU) and gives the
    torch path's slots; empty batches and empty spans give empty results."""
    tables = _tables(3, 4, seed=3)
    index = torch.tensor([[0, 1, 15], [16, 17, 40], [63, 62, 0]])
    want = _torch_slots(tables, index)
    monkeypatch.setattr(batch_builder.fused, "enabled", lambda t, *p: True)
    calls = []
    import hotspec.runtime.slots_kernel as sk
    real = sk.slots_rows
    monkeypatch.setattr(sk, "slots_rows", lambda *a: calls.append(1) or real(*a))
    assert torch.equal(batch_builder.slots_at(tables, index, PAGE), want) and calls
    assert slots_rows(tables, index[:0], PAGE).shape == (0, 3)
    assert slots_rows(tables, index[:, :0], PAGE).shape == (3, 0)


@pytest.mark.gpu
def test_gpu_slots_rows_match_torch_in_a_graph() -> None:
    """On the GPU, captured in a CUDA graph and replayed with new lengths: torch's slots."""
    dev = torch.device("cuda")
    tables = _tables(8, 64, seed=4).to(dev)
    seq = torch.zeros(8, dtype=torch.long, device=dev)
    span = torch.arange(16, device=dev)
    slots_rows(tables, seq.unsqueeze(1) + span, PAGE)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        index = seq.unsqueeze(1) + span
        out = slots_rows(tables, index, PAGE)
    g = torch.Generator(device=dev).manual_seed(5)
    for _ in range(10):
        seq.copy_(torch.randint(0, 64 * PAGE - 16, (8,), device=dev, generator=g))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, _torch_slots(tables, index))


@pytest.mark.gpu
@pytest.mark.parametrize("algo", [None, "EAGLE"], ids=["vanilla", "eagle"])
def test_gpu_engine_tokens_same_with_torch_slots(monkeypatch, tmp_path, algo) -> None:
    """The graphed engine (SmolLM2-shaped random weights, a random EAGLE head: decode, draft,
    verify and draft-extend all look slots up) gives the same greedy tokens with the slot kernel
    as with torch's lookup."""
    from engine_utils import greedy_tokens, random_engine

    from hotspec.runtime import slots_kernel
    from hotspec.sampling_params import SamplingParams

    gen = torch.Generator().manual_seed(10)
    prompts = [torch.randint(0, 49152, (n,), generator=gen).tolist() for n in (7, 33, 120)]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)

    def run() -> list[list[int]]:
        engine = random_engine(tmp_path, layers=4, seed=9, algo=algo)
        toks = greedy_tokens(engine, prompts, params)
        engine.graphs.close()
        return toks

    want = run()
    assert all(len(t) == 32 for t in want)
    monkeypatch.setattr(slots_kernel, "slots_rows", lambda bt, idx, page: _torch_slots(bt, idx))
    assert run() == want
