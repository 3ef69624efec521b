"""Chunked prefill: prompts longer than max_prefill_tokens are prefilled over several steps, and
nothing observable changes: the same tokens (greedy and seeded sampling, vanilla and EAGLE), the
same target and draft KV and draft state as a one-shot prefill, no block leaks under preemption."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from hotspec import LLM, SamplingParams
from hotspec.config import ConfigError, EngineConfig
from hotspec.core.request import Request
from hotspec.models.draft_checkpoint import random_draft_checkpoint
from hotspec.models.loader import load_checkpoint

VOCAB = 64
BLOCK = 4
SPECS = {"vanilla": None, "chain": ("EAGLE3", 3, 1, 4), "tree": ("EAGLE", 3, 3, 6)}


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("chunked")
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False, eos_token_id=2)
    torch.manual_seed(0)
    hf = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    hf.save_pretrained(root / "target")
    mcfg = load_checkpoint(root / "target", torch.float32)[0]
    out = {"target": root / "target"}
    for i, algo in enumerate(("EAGLE", "EAGLE3"), start=1):
        out[algo] = random_draft_checkpoint(root / algo.lower(), mcfg, algo, seed=i, scale=0.1)
    return out


def make_llm(models: dict[str, Path], spec: str, **kwargs: Any) -> LLM:
    options: dict[str, Any] = {"num_kv_blocks": 256, "block_size": BLOCK, **kwargs}
    if SPECS[spec] is not None:
        algo, steps, topk, ntok = SPECS[spec]
        options.update(speculative_algorithm=algo, speculative_draft_model_path=str(models[algo]),
                       speculative_num_steps=steps, speculative_eagle_topk=topk,
                       speculative_num_draft_tokens=ntok)
    return LLM(model=str(models["target"]), dtype="float32", device="cpu", skip_tokenizer_init=True,
               **options)


def prompts(n: int, seed: int, longest: int = 70) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, VOCAB) for _ in range(rng.randint(1, longest))] for _ in range(n)]


def test_max_prefill_tokens_is_validated() -> None:
    with pytest.raises(ConfigError, match="max_prefill_tokens must be >= 1"):
        EngineConfig(max_prefill_tokens=0)


@pytest.mark.parametrize("spec", list(SPECS))
def test_chunked_prefill_generates_what_one_shot_prefill_does(models: dict[str, Path], spec: str) -> None:
    work = prompts(6, seed=1)
    params = [SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
              SamplingParams(temperature=0.9, top_p=0.9, seed=3, max_tokens=10, ignore_eos=True)]
    whole = make_llm(models, spec, max_prefill_tokens=None)
    chunked = make_llm(models, spec, max_prefill_tokens=7)
    chunk_sizes: list[list[int]] = []
    prefill = chunked.engine.worker.prefill

    def spy(reqs: list, chunks: list[int] | None = None, **kw: object) -> list[list[int]]:
        chunk_sizes.append(list(chunks or []))
        return prefill(reqs, chunks, **kw)

    chunked.engine.worker.prefill = spy  # type: ignore[method-assign]
    for p in params:
        ref = whole.generate(prompt_token_ids=work, sampling_params=p)
        got = chunked.generate(prompt_token_ids=work, sampling_params=p)
        assert [o.token_ids for o in got] == [o.token_ids for o in ref]
        assert [o.finish_reason for o in got] == [o.finish_reason for o in ref]
    # Chunking really happened: every prefill step stayed within the budget, and prompts longer
    # than it were split (sum(work) tokens > 7 per step).
    assert all(sum(c) <= 7 for c in chunk_sizes)
    assert len(chunk_sizes) >= 2 * sum(len(p) for p in work) // 7
    assert chunked.engine.allocator.num_free == chunked.engine.allocator.num_blocks


@pytest.mark.parametrize("spec", ["chain", "tree"])
def test_chunked_draft_prefill_writes_the_same_caches(models: dict[str, Path], spec: str) -> None:
    """The EAGLE draft prefill of a chunk reads the target features of the whole chunk and the
    token after it; its KV and the draft state of the final chunk equal a one-shot prefill's."""
    prompt = prompts(1, seed=5, longest=60)[0] + [7] * 30
    sp = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    states = []
    for budget in (None, 9):
        llm = make_llm(models, spec, max_prefill_tokens=budget)
        engine = llm.engine
        req = engine.add_request(prompt, sp)
        steps = 0
        while req not in engine.running:
            engine.step()
            steps += 1
        assert steps == (1 if budget is None else -(-len(prompt) // budget))
        slots = torch.tensor(req.slots(0, len(prompt), BLOCK))
        phases = engine.worker.phases
        kv = [c[:, slots].clone() for runner in (phases.target_runner, phases.draft_runner)
              for c in (runner.kv.k, runner.kv.v)]
        states.append((req.output_token_ids, req.spec.draft, kv))
        engine.abort(req)
        assert engine.allocator.num_free == engine.allocator.num_blocks
    (tok_a, st_a, kv_a), (tok_b, st_b, kv_b) = states
    assert tok_a == tok_b
    assert torch.equal(st_a.topk_ids, st_b.topk_ids)
    torch.testing.assert_close(st_a.topk_logp, st_b.topk_logp, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(st_a.feature, st_b.feature, rtol=1e-4, atol=1e-4)
    for a, b in zip(kv_a, kv_b):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_chunked_prefill_under_preemption_and_aborts(models: dict[str, Path]) -> None:
    """A small cache forces preemption (recompute: prompt + generated tokens, chunked again);
    aborting a request that is halfway through its chunks frees its blocks; greedy requests still
    produce one-shot greedy's tokens."""
    work = prompts(24, seed=3, longest=40)
    params = [SamplingParams(temperature=0.0, max_tokens=random.Random(i).randint(4, 20),
                             ignore_eos=True) for i in range(len(work))]
    ref = make_llm(models, "tree", max_prefill_tokens=None).generate(prompt_token_ids=work,
                                                                     sampling_params=params)
    llm = make_llm(models, "tree", num_kv_blocks=48, max_prefill_tokens=6)
    engine = llm.engine
    preempted: list[int] = []  # generated tokens of each preempted request (to recompute)
    preempt = engine._preempt

    def counting_preempt(req: Request) -> None:
        preempted.append(len(req.output_token_ids))
        preempt(req)

    engine._preempt = counting_preempt  # type: ignore[method-assign]
    reqs = [engine.add_request(p, sp) for p, sp in zip(work, params)]
    victim = engine.add_request(list(range(3, 40)), params[0])
    aborted_mid_prefill = False
    steps = 0
    while engine.has_unfinished():
        if victim in engine.prefilling and victim.seq_len > 0:
            engine.abort(victim)
            aborted_mid_prefill = True
        engine.step()
        owned = [b for q in (engine.prefilling, engine.running) for r in q for b in r.blocks]
        assert len(owned) == len(set(owned)), "a block is owned by two requests"
        assert engine.allocator.num_free + len(owned) == engine.allocator.num_blocks
        steps += 1
        assert steps < 5000, "the engine stopped making progress"
    assert aborted_mid_prefill and not victim.blocks
    assert max(preempted) > 0  # a recompute prefilled generated tokens too, in chunks
    assert [r.output_token_ids for r in reqs] == [o.token_ids for o in ref]
    assert engine.allocator.num_free == engine.allocator.num_blocks


@pytest.mark.parametrize("spec", ["vanilla", "chain"])
@pytest.mark.parametrize("interleave", [True, False])
def test_running_requests_keep_decoding_while_a_long_prompt_prefills(
        models: dict[str, Path], spec: str, interleave: bool) -> None:
    """decode_during_prefill (the default): a long prompt's chunks alternate with decode steps, so
    a running request gets tokens every other step; without it, it waits for the whole prefill.
    The tokens themselves are the same either way."""
    llm = make_llm(models, spec, max_prefill_tokens=8, decode_during_prefill=interleave)
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    short = engine.add_request([5, 6, 7], params)
    engine.step()  # prefills the short prompt: it is running
    long = engine.add_request(prompts(1, 7, longest=70)[0] * 2 + [9] * 40, params)
    tokens_during_prefill, steps = 0, 0
    while not long.output_token_ids:  # its first token comes with its last prefill chunk
        before = len(short.output_token_ids)
        engine.step()
        steps += 1
        tokens_during_prefill += len(short.output_token_ids) > before
    assert steps >= 6  # the long prompt took many chunks
    if interleave:
        assert tokens_during_prefill >= (steps - 1) // 2
    else:
        assert tokens_during_prefill == 0
    while engine.has_unfinished():
        engine.step()
    alone = make_llm(models, spec).generate(
        prompt_token_ids=[short.prompt_token_ids, long.prompt_token_ids], sampling_params=params)
    assert [short.output_token_ids, long.output_token_ids] == [o.token_ids for o in alone]


@pytest.mark.parametrize("spec", ["vanilla", "chain"])
def test_num_continuous_decode_steps_admit_arrivals_together_and_change_no_token(
        models: dict[str, Path], spec: str) -> None:
    """With N continuous decode steps, requests arriving while others decode wait for N decode
    steps and are then prefilled in one step together; every output is the one N = 1 gives."""
    llm = make_llm(models, spec, num_continuous_decode_steps=4)
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    first = engine.add_request([5, 6, 7], params)
    engine.step()  # nothing was running: admitted and prefilled at once
    assert first.output_token_ids
    late = [engine.add_request(p, params) for p in prompts(3, 5, longest=12)]
    steps = 0
    while not any(r.output_token_ids for r in late):
        engine.step()
        steps += 1
    assert steps == 5  # four decode steps of `first`, then one prefill of all three
    assert all(r.output_token_ids for r in late)
    while engine.has_unfinished():
        engine.step()
    reqs = [first, *late]
    alone = make_llm(models, spec).generate(
        prompt_token_ids=[r.prompt_token_ids for r in reqs], sampling_params=params)
    assert [r.output_token_ids for r in reqs] == [o.token_ids for o in alone]
    assert engine.allocator.num_free == engine.allocator.num_blocks


def test_num_continuous_decode_steps_is_validated() -> None:
    with pytest.raises(ConfigError, match="num_continuous_decode_steps must be >= 1"):
        EngineConfig(num_continuous_decode_steps=0)
