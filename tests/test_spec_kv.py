"""KV bookkeeping of speculative decoding.

(a) Under a random load (ragged prompts, mixed greedy / sampled requests, stop tokens, EOS, aborts,
    preemption from a deliberately small cache) no KV block leaks or is shared, and greedy requests
    still produce exactly vanilla greedy's tokens.
(b) After speculative steps, a request's committed KV (target and draft pools), its draft feature
    and its draft top-k equal those of a from-scratch prefill over the same committed tokens: the
    verify -> commit_target_kv -> draft_extend path leaves the caches as a prefill would.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import hotspec.runtime.prefill as worker_base
import hotspec.speculative.worker as eagle_worker
from hotspec import LLM, SamplingParams
from hotspec.core.request import Request, Status
from hotspec.engine.engine import Engine
from hotspec.models.draft_checkpoint import random_draft_checkpoint
from hotspec.models.loader import load_checkpoint

VOCAB = 32
BLOCK = 4
SHAPES = {"chain": (3, 1, 4), "tree": (3, 4, 8)}  # (num_steps, topk, num_draft_tokens)
REL_TOL = 1e-4  # float32


@dataclass
class Models:
    target: Path
    heads: dict[str, Path]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    from transformers import AutoModelForCausalLM, LlamaConfig

    root = tmp_path_factory.mktemp("spec_kv")
    # 3 layers: EAGLE-3's default aux layers [2, L//2, L-3] = [2, 1, 0] are distinct.
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False, eos_token_id=2)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():  # non-degenerate greedy paths and sampled distributions
        for p in hf.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    hf.save_pretrained(root / "target")
    target_cfg, _ = load_checkpoint(root / "target", torch.float32)
    # Scale 0.1: decisive draft top-k, yet activations small enough that float32 rounding stays
    # far below the tolerances of (b) (at 0.3 the EAGLE feature norm reaches ~200).
    heads = {algo: random_draft_checkpoint(root / algo.lower(), target_cfg, algo, seed=i, scale=0.1)
             for i, algo in enumerate(["EAGLE", "EAGLE3"], start=1)}
    return Models(root / "target", heads)


def make_llm(models: Models, head: str | None, shape: str = "tree", **kwargs: Any) -> LLM:
    spec: dict[str, Any] = {}
    if head is not None:
        steps, topk, ntok = SHAPES[shape]
        spec = dict(speculative_algorithm=head, speculative_draft_model_path=str(models.heads[head]),
                    speculative_num_steps=steps, speculative_eagle_topk=topk,
                    speculative_num_draft_tokens=ntok)
    return LLM(model=str(models.target), dtype="float32", device="cpu", skip_tokenizer_init=True,
               block_size=BLOCK, **spec, **kwargs)


# -- (a) no leak under a random load ------------------------------------------------------------
def random_workload(n: int, seed: int) -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(seed)
    work = []
    for i in range(n):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 20))]
        greedy = rng.random() < 0.5
        params = SamplingParams(
            temperature=0.0 if greedy else rng.choice([0.7, 1.0]),
            top_p=1.0 if greedy else rng.choice([1.0, 0.9]),
            seed=i, max_tokens=rng.randint(1, 24),
            stop_token_ids=[rng.randrange(VOCAB)] if rng.random() < 0.3 else None,
            ignore_eos=rng.random() < 0.5)
        work.append((prompt, params))
    return work


def check_blocks(engine: Engine) -> None:
    """Running and prefilling (admitted, prompt not all in the KV yet) requests own disjoint blocks
    with refcount 1 that cover their committed KV; every other block is free; waiting and finished
    requests own nothing."""
    alloc = engine.allocator
    owned = [b for r in (*engine.running, *engine.prefilling) for b in r.blocks]
    assert len(owned) == len(set(owned)), "a block is owned by two requests"
    assert alloc.num_free + len(owned) == alloc.num_blocks, "leaked or double-freed block"
    assert all(alloc.refcount(b) == 1 for b in owned)
    assert all(not r.blocks for r in engine.waiting)
    for r in engine.running:
        assert len(r.blocks) * engine.block_size >= r.seq_len


@pytest.mark.parametrize("head,shape", [("EAGLE", "tree"), ("EAGLE3", "chain")])
def test_no_block_leaks_under_random_load(models: Models, head: str, shape: str) -> None:
    num_blocks = 40  # 160 slots: a few requests at a time, so growth forces preemption
    llm = make_llm(models, head, shape, num_kv_blocks=num_blocks, max_num_seqs=12)
    engine = llm.engine
    preempted: list[Request] = []
    preempt = engine._preempt

    def counting_preempt(req: Request) -> None:
        preempted.append(req)
        preempt(req)

    engine._preempt = counting_preempt  # type: ignore[method-assign]

    work = random_workload(500, seed=0)
    rng = random.Random(1)
    pending = list(reversed(work))
    reqs: list[Request] = []
    aborted: dict[int, Status] = {}  # rid -> status when aborted

    def add(k: int) -> None:
        for _ in range(min(k, len(pending))):
            reqs.append(engine.add_request(*pending.pop()))

    add(30)
    steps = 0
    while pending or engine.has_unfinished():
        add(rng.randint(0, 3))
        if len(aborted) < 25 and rng.random() < 0.05:
            pool = engine.running if engine.running and rng.random() < 0.8 else list(engine.waiting)
            if pool:
                victim = rng.choice(pool)
                aborted[victim.rid] = victim.status
                engine.abort(victim)
                assert victim.status is Status.FINISHED and victim.finish_reason == "abort"
        engine.step()
        check_blocks(engine)
        steps += 1
        assert steps < 20_000, "the engine stopped making progress"

    assert len(reqs) == 500
    assert all(r.status is Status.FINISHED and not r.blocks for r in reqs)
    alloc = engine.allocator
    assert alloc.num_free == num_blocks
    assert all(alloc.refcount(b) == 0 for b in range(num_blocks))
    # The scenario really happened: preemption, aborts of running and waiting requests, acceptance.
    assert len(preempted) >= 10
    assert Status.RUNNING in aborted.values() and Status.WAITING in aborted.values()
    hist = engine.worker.stats.accept_hist
    assert sum(n for a, n in hist.items() if a > 1) > 50

    for r in reqs:  # every request honoured its own limits
        out, p = r.output_token_ids, r.params
        assert len(out) <= p.max_tokens
        if r.rid in aborted:
            continue
        stops = set(p.stop_token_ids) | (set() if p.ignore_eos else engine.eos_token_ids)
        assert not stops & set(out[:-1])
        assert r.finish_reason == ("stop" if out[-1] in stops else "length")
        assert r.finish_reason == "stop" or len(out) == p.max_tokens

    greedy = [r for r in reqs if r.params.temperature == 0]
    vanilla = make_llm(models, None, num_kv_blocks=2048, max_num_seqs=256)
    ref = vanilla.generate(prompt_token_ids=[r.prompt_token_ids for r in greedy],
                           sampling_params=[r.params for r in greedy])
    recomputed = 0
    for r, v in zip(greedy, ref):
        if r.rid in aborted:
            assert v.token_ids[: len(r.output_token_ids)] == r.output_token_ids
        else:
            assert (r.output_token_ids, r.finish_reason) == (v.token_ids, v.finish_reason), r.rid
            recomputed += any(p is r for p in preempted)
    assert recomputed > 0  # greedy requests that were preempted and recomputed still match
    print(f"{steps} steps, {len(preempted)} preemptions, {len(aborted)} aborts, "
          f"accept_hist {dict(sorted(hist.items()))}")


# -- (b) the caches equal a fresh prefill ------------------------------------------------------
def max_rel_err(got: torch.Tensor, ref: torch.Tensor, dim: int) -> float:
    """Largest relative L2 error over the slices along `dim` (e.g. one per kv position)."""
    got, ref = got.double().movedim(dim, 0), ref.double().movedim(dim, 0)
    diff = (got - ref).flatten(1).norm(dim=1)
    return float((diff / ref.flatten(1).norm(dim=1).clamp_min(1e-30)).max())


def check_against_fresh_prefill(engine: Engine, req: Request, monkeypatch: pytest.MonkeyPatch) -> None:
    worker = engine.worker
    assert isinstance(worker, eagle_worker.EagleWorker)
    committed = req.prompt_token_ids + req.output_token_ids[:-1]
    n = len(committed)
    assert req.seq_len == n
    fresh = Request(-1, list(committed), SamplingParams(), seed=0)
    fresh.blocks = engine.allocator.allocate(-(-n // engine.block_size))
    try:
        # EagleWorker.prefill as is, except that its sampled token is the request's real root.
        with monkeypatch.context() as m:
            m.setattr(worker_base, "sample_for",
                      lambda reqs, logits, state=None: torch.tensor([req.last_token], device=logits.device))
            assert worker.prefill([fresh]) == [[req.last_token]]
        got, ref = req.spec.draft, fresh.spec.draft  # (each a row of its batch's tensors)
        assert got is not None and ref is not None
        assert max_rel_err(got.row("feature").unsqueeze(0), ref.row("feature").unsqueeze(0), 0) < REL_TOL
        assert torch.equal(got.row("topk_ids"), ref.row("topk_ids"))
        # Absolute on log-probabilities = relative on probabilities (relative on a log-probability
        # near 0 is ill-conditioned).
        assert float((got.row("topk_logp") - ref.row("topk_logp")).abs().max()) < REL_TOL
        bs = engine.block_size
        running = torch.tensor(req.slots(0, n, bs))
        scratch = torch.tensor(fresh.slots(0, n, bs))
        phases = worker.phases
        for name, kv in (("target", phases.target_runner.kv), ("draft", phases.draft_runner.kv)):
            for cache in (kv.k, kv.v):  # [layers, slots, kv heads, head dim]
                err = max_rel_err(cache[:, running], cache[:, scratch], dim=1)
                assert err < REL_TOL, f"{name} KV differs from a fresh prefill: {err:.2e}"
    finally:
        engine.allocator.free(fresh.blocks)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("head", ["EAGLE", "EAGLE3"])
def test_caches_match_fresh_prefill(models: Models, head: str, shape: str,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    llm = make_llm(models, head, shape, num_kv_blocks=128, max_num_seqs=8)
    engine = llm.engine
    rng = random.Random(2)
    params = [SamplingParams(temperature=1.0, seed=11, max_tokens=250, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=250, ignore_eos=True),
              SamplingParams(temperature=0.7, top_p=0.9, seed=12, max_tokens=250, ignore_eos=True),
              SamplingParams(temperature=1.0, seed=13, max_tokens=250, ignore_eos=True)]
    reqs = [engine.add_request([rng.randrange(VOCAB) for _ in range(length)], p)
            for length, p in zip((5, 11, 1, 8), params)]
    engine.step()  # prefill
    for r in reqs:
        check_against_fresh_prefill(engine, r, monkeypatch)
    hist = engine.worker.stats.accept_hist
    for _ in range(50):
        engine.step()
        assert all(r.status is Status.RUNNING for r in reqs)
        for r in reqs:
            check_against_fresh_prefill(engine, r, monkeypatch)
    assert sum(n for a, n in hist.items() if a > 1) >= 5, dict(hist)  # multi-token commits
    assert engine.allocator.num_free + sum(len(r.blocks) for r in reqs) == 128
