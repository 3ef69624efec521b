"""runtime/host_io's kernels: `fetch` copies the slot the device counter chooses, `publish` writes
its output into that slot and counts the step, `bump` counts a step that publishes nothing. On
the CPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py), host
and "device" buffers both in host memory; tests/test_graph_runner.py runs them in CUDA graphs."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from hotspec.runtime import host_io  # noqa: E402


def _slots(nbytes: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (2, nbytes), generator=g, dtype=torch.uint8)


@pytest.mark.parametrize("count", [0, 1, 2, 7])
def test_fetch_copies_the_counters_slot_over_several_programs(count):
    slot_bytes = host_io.FETCH_BLOCK * 4 * 2 + 48  # three programs, the last one partial
    src = _slots(slot_bytes, count)
    dst = torch.zeros(slot_bytes + 64, dtype=torch.uint8)
    counter = torch.tensor([count])
    n = slot_bytes - 16  # a prefix: the graph of a smaller batch
    host_io.fetch(src, dst, counter, n)
    assert torch.equal(dst[:n], src[count % 2, :n])
    assert not dst[n:].any()  # nothing past the prefix
    assert counter.item() == count  # the publish at the graph's end counts the step


@pytest.mark.parametrize("bump", [True, False])
def test_publish_writes_the_counters_slot_and_counts_the_step(bump):
    out = torch.arange(host_io.PUBLISH_BLOCK + 5, dtype=torch.int64)  # more than one block of words
    nbytes = out.numel() * 8
    dst = torch.zeros(2, nbytes + 16, dtype=torch.uint8)
    counter = torch.tensor([3])
    host_io.publish(out, dst, counter, bump=bump)
    assert torch.equal(dst[1, :nbytes].view(torch.int64), out)
    assert not dst[0].any() and not dst[1, nbytes:].any()
    assert counter.item() == (4 if bump else 3)
    host_io.bump(counter)
    assert counter.item() == (5 if bump else 4)


def test_moved_tensors_must_be_whole_words_and_slots_large_enough():
    with pytest.raises(ValueError, match="whole 4-byte words"):
        host_io.words(torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="contiguous"):
        host_io.words(torch.zeros(4, 4)[:, 0])
    with pytest.raises(ValueError, match="as large as the output"):
        host_io.publish(torch.zeros(8, dtype=torch.int64), torch.zeros(2, 32, dtype=torch.uint8),
                        torch.zeros(1, dtype=torch.long), bump=True)
    with pytest.raises(ValueError, match="at most a slot"):
        host_io.fetch(_slots(32, 0), torch.zeros(64, dtype=torch.uint8), torch.zeros(1, dtype=torch.long), 48)
