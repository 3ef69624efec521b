"""Prompt KV shared between live requests (engine/prefix_share.py): the n answers of one prompt
and requests that open alike reuse the first one's computed prompt blocks, answer exactly as they
would alone (vanilla and speculative), and every block is free again at the end."""

from __future__ import annotations

import pytest

from hotspec import LLM, SamplingParams
from hotspec.engine.engine import Engine

BASE = [1, *range(100, 160)]  # 61 tokens: 3 full blocks of 16 shareable (60 positions + 1)
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def run(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> tuple[list[list[int]], list]:
    """Each prompt's tokens, and each request's blocks right after the first step with all
    of them prefilled."""
    reqs = [engine.add_request(p, params) for p in prompts]
    toks: dict[int, list[int]] = {r.rid: [] for r in reqs}
    seen: list = []
    while engine.has_unfinished():
        for o in engine.step():
            toks[o.request.rid] += o.new_token_ids
        if not seen and not engine.waiting and not engine.prefilling:
            seen = [list(r.blocks) for r in reqs]
    return [toks[r.rid] for r in reqs], seen


@pytest.mark.parametrize("spec", [False, True], ids=["vanilla", "speculative-3-1-4"])
def test_n_answers_of_one_prompt_share_its_blocks(spec: bool, smol_llm: LLM) -> None:
    llm = smol_llm if not spec else LLM(
        dtype="float32", device="cpu", kv_cache_memory_gb=0.05, speculative_algorithm="EAGLE3",
        speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    engine = llm.engine
    alone = run(engine, [BASE], GREEDY)[0][0]
    shared_before = engine.prefixes.shared_blocks
    outs, blocks = run(engine, [BASE] * 4, GREEDY)
    assert outs == [alone] * 4
    assert engine.prefixes.shared_blocks - shared_before == 3 * 3  # 3 siblings x 3 blocks
    assert all(b[:3] == blocks[0][:3] for b in blocks)
    assert len({b[3] for b in blocks}) == 4  # the last prompt block: each its own
    assert engine.allocator.num_free == engine.allocator.num_blocks
    assert not engine.prefixes._block and not engine.prefixes._first


def test_sampled_answers_with_shared_blocks_equal_unshared(smol_llm: LLM) -> None:
    engine = smol_llm.engine
    params = [SamplingParams(temperature=0.9, seed=s, max_tokens=8, ignore_eos=True) for s in range(3)]
    alone = [run(engine, [BASE], p)[0][0] for p in params]
    reqs = [engine.add_request(BASE, p) for p in params]
    got: dict[int, list[int]] = {r.rid: [] for r in reqs}
    while engine.has_unfinished():
        for o in engine.step():
            got[o.request.rid] += o.new_token_ids
    assert [got[r.rid] for r in reqs] == alone
    assert len(set(map(tuple, alone))) > 1  # the seeds give different answers


def test_only_the_common_opening_is_shared(smol_llm: LLM) -> None:
    engine = smol_llm.engine
    other = BASE[:33] + [7, 8, 9] + BASE[36:]  # differs at position 33: block 2, and the token
    # after block 1 (position 32) is still common, so blocks 0 and 1 are shared
    first = engine.prefixes.shared_blocks
    outs, blocks = run(engine, [BASE, other], GREEDY)
    assert engine.prefixes.shared_blocks - first == 2
    assert blocks[0][:2] == blocks[1][:2] and blocks[0][2] != blocks[1][2]
    assert outs[1] == run(engine, [other], GREEDY)[0][0]
    boundary = BASE[:32] + [5] + BASE[33:]  # differs at position 32, the token after block 1
    first = engine.prefixes.shared_blocks
    run(engine, [BASE, boundary], GREEDY)
    assert engine.prefixes.shared_blocks - first == 1  # block 1's draft KV read token 32
