"""KV block allocator: allocation, reuse, reference counts, running out, and no leaks (unit and engine)."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
from engine_utils import save_tiny_llama

from hotspec import LLM, SamplingParams
from hotspec.core.request import Request
from hotspec.engine.block_allocator import BlockAllocator, OutOfBlocks
from hotspec.engine.engine import Engine
from hotspec.errors import HotspecError


def _ids(a: BlockAllocator) -> range:
    """Every block id the allocator hands out (an engine's may start above 0)."""
    first = getattr(a, "first_block", 0)
    return range(first, first + a.num_blocks)


def _state(a: BlockAllocator) -> tuple[int, list[int]]:
    return a.num_free, [a.refcount(b) for b in _ids(a)]


def assert_all_free(a: BlockAllocator) -> None:
    assert a.num_free == a.num_blocks
    assert all(a.refcount(b) == 0 for b in _ids(a))


# ---------------------------------------------------------------- allocate / free / reuse


def test_allocate_hands_out_distinct_blocks_with_one_reference() -> None:
    a = BlockAllocator(8)
    first, second = a.allocate(3), a.allocate(5)
    blocks = first + second
    assert len(first) == 3 and len(second) == 5
    assert sorted(blocks) == list(range(8))  # distinct, all in range
    assert all(a.refcount(b) == 1 for b in blocks)
    assert a.num_free == 0
    assert a.allocate(0) == []


def test_free_returns_blocks_and_they_are_handed_out_again() -> None:
    a = BlockAllocator(4)
    held = a.allocate(4)
    a.free(held[1:3])
    assert a.num_free == 2
    assert [a.refcount(b) for b in held] == [1, 0, 0, 1]
    again = a.allocate(2)
    assert sorted(again) == sorted(held[1:3])  # the freed blocks, nothing else was free
    assert all(a.refcount(b) == 1 for b in again)
    a.free(held[:1] + again + held[3:])
    assert_all_free(a)


def test_allocator_needs_at_least_one_block() -> None:
    with pytest.raises(ValueError, match="num_blocks must be >= 1, got 0"):
        BlockAllocator(0)


# ---------------------------------------------------------------- reference counts


def test_shared_block_is_free_only_after_last_owner_frees_it() -> None:
    a = BlockAllocator(4)
    blocks = a.allocate(2)
    a.incref(blocks)  # a second owner (prefix sharing / fork)
    assert [a.refcount(b) for b in blocks] == [2, 2]
    assert a.num_free == 2
    a.free(blocks)
    assert [a.refcount(b) for b in blocks] == [1, 1]
    assert a.num_free == 2  # still owned by the first owner: not reusable yet
    assert set(a.allocate(2)).isdisjoint(blocks)
    a.free(blocks)
    assert [a.refcount(b) for b in blocks] == [0, 0]


def test_double_free_raises_naming_the_block_and_changes_nothing() -> None:
    a = BlockAllocator(4)
    x, y = a.allocate(2)
    a.free([x])
    before = _state(a)
    with pytest.raises(ValueError, match=f"double free of block {x}"):
        a.free([y, x])  # y is valid: it must not be freed by a call that fails
    assert _state(a) == before
    assert a.refcount(y) == 1


def test_freeing_one_block_twice_in_one_call_is_a_double_free() -> None:
    a = BlockAllocator(2)
    (x,) = a.allocate(1)
    with pytest.raises(ValueError, match=f"double free of block {x}"):
        a.free([x, x])
    assert a.refcount(x) == 1 and a.num_free == 1


def test_incref_of_a_free_block_raises_and_changes_nothing() -> None:
    a = BlockAllocator(4)
    (x,) = a.allocate(1)
    free_block = next(b for b in range(4) if b != x)
    before = _state(a)
    with pytest.raises(ValueError, match=f"block {free_block} is free; cannot share it"):
        a.incref([x, free_block])
    assert _state(a) == before


@pytest.mark.parametrize("block", [-1, 4])
def test_block_ids_outside_the_pool_are_refused(block: int) -> None:
    a = BlockAllocator(4)
    a.allocate(4)
    before = _state(a)
    for call in (a.free, a.incref):
        with pytest.raises(ValueError, match=rf"block {block} is not in this pool \(0\.\.3\)"):
            call([block])
    assert _state(a) == before


# ---------------------------------------------------------------- running out


def test_out_of_blocks_is_clear_and_leaves_the_allocator_unchanged() -> None:
    a = BlockAllocator(6)
    held = a.allocate(4)
    before = _state(a)
    with pytest.raises(OutOfBlocks, match=r"asked for 3, 2 of 6 free\..*give the KV cache more memory"):
        a.allocate(3)
    assert _state(a) == before
    assert isinstance(OutOfBlocks("x"), HotspecError)
    rest = a.allocate(2)  # exactly what is free still works
    assert set(rest).isdisjoint(held) and a.num_free == 0
    with pytest.raises(OutOfBlocks):
        a.allocate(1)


# ---------------------------------------------------------------- no leaks


def test_no_leak_after_1000_random_request_lifecycles() -> None:
    """Requests start, grow, fork (share a prefix) and finish in random order; a model of the
    expected reference counts is checked against the allocator after every operation."""
    rng = random.Random(1234)
    a = BlockAllocator(64)
    expected: Counter[int] = Counter()
    live: list[list[int]] = []  # each live request's blocks (one reference each)
    started = finished = out_of_blocks = 0

    def check() -> None:
        assert a.num_free == sum(1 for b in _ids(a) if expected[b] == 0)
        assert all(a.refcount(b) == expected[b] for b in _ids(a))

    def take(n: int) -> list[int] | None:
        nonlocal out_of_blocks
        before = _state(a)
        try:
            got = a.allocate(n)
        except OutOfBlocks:
            out_of_blocks += 1
            assert _state(a) == before
            return None
        assert len(set(got)) == n and all(expected[b] == 0 for b in got)  # never a block in use
        expected.update(got)
        return got

    def finish(i: int) -> None:
        nonlocal finished
        blocks = live.pop(i)
        a.free(blocks)
        expected.subtract(blocks)
        finished += 1

    while started < 1000 or live:
        op = rng.random()
        if started < 1000 and (op < 0.35 or not live):
            got = take(rng.randint(1, 6))
            if got is not None:
                live.append(got)
                started += 1
            elif live:
                finish(rng.randrange(len(live)))  # like preemption: make room by finishing one
        elif op < 0.6:
            req = rng.choice(live)
            got = take(rng.randint(1, 3))
            if got is not None:
                req += got
        elif op < 0.75 and started < 1000:
            parent = rng.choice(live)
            prefix = parent[: rng.randint(1, len(parent))]
            a.incref(prefix)
            expected.update(prefix)
            live.append(list(prefix))
            started += 1
        else:
            finish(rng.randrange(len(live)))
        check()

    assert (started, finished) == (1000, 1000)
    assert out_of_blocks > 0  # the pool really ran dry along the way
    assert_all_free(a)


# ---------------------------------------------------------------- engine level


def test_engine_frees_every_block_after_a_batch(smol_llm: LLM) -> None:
    engine = smol_llm.engine
    assert_all_free(engine.allocator)
    prompts = ["The capital of France is", "def add(a, b):", "Hi", "List three colours:"]
    for p in prompts:
        engine.add_request(smol_llm.tokenizer.encode(p),
                           SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    engine.step()  # prefill of the whole batch
    assert len(engine.running) == len(prompts)
    held = engine.allocator.num_blocks - engine.allocator.num_free
    assert held >= len(prompts)
    for _ in smol_llm.stream_steps():
        pass
    assert not engine.has_unfinished()
    assert_all_free(engine.allocator)


def _tiny_hf_folder(path: Path) -> Path:
    return save_tiny_llama(path, vocab=128, hidden=32, layers=2, std=0.15)


def test_preemption_under_block_pressure_frees_everything_and_keeps_outputs(tmp_path: Path) -> None:
    """A KV cache too small for the batch forces preemption (free, recompute later); outputs
    equal each request's run alone and no block is left behind."""
    folder = _tiny_hf_folder(tmp_path)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    prompts = [[5, 9, 17, 3], [40, 2, 2, 8, 61, 7], [100, 1], [33, 34, 35, 36, 37]]
    roomy = LLM(model=str(folder), dtype="float32", device="cpu", skip_tokenizer_init=True,
                num_kv_blocks=64, block_size=4)
    alone = [roomy.generate(prompt_token_ids=[p], sampling_params=params)[0].token_ids for p in prompts]

    tight = LLM(model=str(folder), dtype="float32", device="cpu", skip_tokenizer_init=True,
                num_kv_blocks=12, block_size=4)  # 48 slots; the batch needs 85
    engine: Engine = tight.engine
    preempted = 0
    original = engine._preempt

    def counting_preempt(req: Request) -> None:
        nonlocal preempted
        preempted += 1
        original(req)

    engine._preempt = counting_preempt  # type: ignore[method-assign]
    outs = tight.generate(prompt_token_ids=prompts, sampling_params=params)
    assert preempted > 0
    assert [o.token_ids for o in outs] == alone
    assert all(o.finish_reason == "length" for o in outs)
    assert_all_free(engine.allocator)


def test_request_that_outgrows_the_whole_cache_does_not_hang(tmp_path: Path) -> None:
    """One request alone whose generation needs more KV than the cache holds: it must end (with a
    clear outcome) and give its blocks back, not preempt itself forever or crash the engine."""
    folder = _tiny_hf_folder(tmp_path)
    llm = LLM(model=str(folder), dtype="float32", device="cpu", skip_tokenizer_init=True,
              num_kv_blocks=3, block_size=4)  # 12 slots
    assert llm.engine.max_model_len == 12  # the context a request gets is what the cache holds
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    (out,) = llm.generate(prompt_token_ids=[[1, 2, 3]], sampling_params=params)
    assert out.finish_reason == "length"
    assert 3 + len(out.token_ids) <= 12
    assert len(out.token_ids) >= 12 - 3 - 4  # it used the cache, not stopped early
    assert_all_free(llm.engine.allocator)
