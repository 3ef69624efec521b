"""The overlap schedule (`overlap_schedule=True`, vanilla decoding): step N+1 is launched before
step N's tokens are read, its input tokens taken on the device from step N's output. Users rely on
it changing nothing but timing: the same tokens, greedy and sampled, as the plain schedule, through
EOS and stop-token finishes (one wasted row each), max_tokens and the context limit (foreseen: no
step launched in vain), preemption, aborts, requests joining mid-stream, and the CUDA-graph path
(static buffers, padded batches) on the CPU."""

from __future__ import annotations

import pytest
import torch
from engine_utils import save_tiny_llama

from hotspec import LLM, SamplingParams
from hotspec.config import ConfigError, EngineConfig
from hotspec.engine.engine import Engine
from hotspec.runtime.graph_runner import GraphRunner

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = 96


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("ovl") / "target", vocab=VOCAB, hidden=64, layers=3,
                           std=0.2)


def _kw(target, **over):
    kw = dict(model=str(target), dtype="float32", device="cpu", skip_tokenizer_init=True,
              num_kv_blocks=128, block_size=4, max_model_len=128)
    kw.update(over)
    return kw


def _prompts(n: int = 5, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (int(k),), generator=g).tolist() for k in (3, 11, 6, 20, 9, 4, 7)[:n]]


def _static(monkeypatch):
    monkeypatch.setattr(Engine, "_graph_runner",
                        lambda self: GraphRunner(self.device, "static", [1, 2, 4, 8]))


def _run(llm: LLM, prompts, params):
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    return [(o.token_ids, o.finish_reason) for o in outs]


PARAMS = {
    "greedy": SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
    "sampled": SamplingParams(temperature=0.8, top_p=0.9, seed=5, max_tokens=12, ignore_eos=True),
    # stop tokens end requests at different steps: the overlap launched one more step for them
    "stops": SamplingParams(temperature=0, max_tokens=40, stop_token_ids=list(range(0, VOCAB, 5))),
    "mixed-lengths": [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (1, 2, 5, 9, 30)],
}


@pytest.mark.parametrize("mode", ["eager", "static"])
@pytest.mark.parametrize("name", list(PARAMS))
def test_same_tokens_as_the_plain_schedule(target, monkeypatch, mode, name):
    if mode == "static":
        _static(monkeypatch)
    prompts, params = _prompts(), PARAMS[name]
    ref = _run(LLM(**_kw(target)), prompts, params)
    llm = LLM(**_kw(target, overlap_schedule=True))
    assert _run(llm, prompts, params) == ref
    if name == "stops":  # the test means something: stop tokens did end requests early
        assert any(reason == "stop" for _, reason in ref)
    engine = llm.engine
    assert engine.allocator.num_free == engine.allocator.num_blocks
    assert not engine.has_unfinished()


def test_steps_overlap_and_foreseen_finishes_launch_nothing(target):
    """After the first decode step, every engine step has launched the next one before returning
    the previous tokens; requests that finish by max_tokens get no extra launch."""
    llm = LLM(**_kw(target, overlap_schedule=True))
    engine, worker = llm.engine, llm.engine.worker
    launched = []
    real = worker.launch
    worker.launch = lambda reqs: (launched.append(len(reqs)), real(reqs))[1]
    for i, p in enumerate(_prompts(3)):
        engine.add_request(p, SamplingParams(temperature=0, max_tokens=4 + 2 * i, ignore_eos=True))
    counts = []
    while engine.has_unfinished():
        outs = engine.step()
        counts.append(sum(len(o.new_token_ids) for o in outs))
        assert worker.launched <= 1
    # prefill gives one token each; then 3 + 5 + 7 tokens come from exactly that many launched rows
    assert counts[0] == 3 and sum(counts) == 4 + 6 + 8
    assert sum(launched) == 3 + 5 + 7
    assert counts[1] == 0  # the first decode step only launches


def test_context_limit_is_foreseen(target):
    """A request stopped by the context limit ends at the same token as with the plain schedule,
    and no step is launched past the limit (its block table would overflow)."""
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    ref = _run(LLM(**_kw(target, max_model_len=24)), prompts, params)
    assert ref[0][1] == "length" and len(ref[0][0]) < 200
    assert _run(LLM(**_kw(target, max_model_len=24, overlap_schedule=True)), prompts, params) == ref


def test_preemption_and_late_joiners(target):
    """A cache too small for every request forces preemption (recompute) and admits requests as
    others finish; outputs still equal the plain schedule's."""
    prompts = _prompts(7, seed=3)
    params = [SamplingParams(temperature=0.7, seed=i, max_tokens=16 + 4 * i, ignore_eos=True)
              for i in range(7)]
    small = dict(num_kv_blocks=16, max_num_seqs=4)
    ref = _run(LLM(**_kw(target, **small)), prompts, params)
    llm = LLM(**_kw(target, overlap_schedule=True, **small))
    preempted = []
    real = llm.engine._preempt
    llm.engine._preempt = lambda r: (preempted.append(r.rid), real(r))[1]
    assert _run(llm, prompts, params) == ref
    assert preempted, "the cache was meant to be too small"
    assert llm.engine.allocator.num_free == llm.engine.allocator.num_blocks


def test_abort_with_a_step_in_flight(target):
    llm = LLM(**_kw(target, overlap_schedule=True))
    engine = llm.engine
    a = engine.add_request(_prompts(1)[0], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    b = engine.add_request(_prompts(2)[1], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    engine.step()  # prefill
    engine.step()  # launch step 1
    engine.step()  # launch step 2, emit step 1
    assert engine.worker.ahead(a) == 1
    n = len(a.output_token_ids)
    engine.abort(a)
    while engine.has_unfinished():
        for o in engine.step():
            assert o.request is not a  # the aborted request's launched row is dropped
    assert len(a.output_token_ids) == n and a.finish_reason == "abort"
    ref = LLM(**_kw(target)).generate(
        prompt_token_ids=[_prompts(2)[1]],
        sampling_params=SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert b.output_token_ids == ref[0].token_ids
    assert engine.allocator.num_free == engine.allocator.num_blocks


def test_a_failed_step_fails_its_requests_and_the_rest_go_on(target):
    llm = LLM(**_kw(target, overlap_schedule=True))
    engine = llm.engine
    p = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    first = [engine.add_request(q, p) for q in _prompts(2)]
    engine.step()
    engine.step()
    real = engine.worker.launch

    def broken(reqs):
        raise RuntimeError("device fault")
    engine.worker.launch = broken
    with pytest.raises(RuntimeError, match="device fault"):
        engine.step()
    failed = engine.fail_in_flight("device fault")
    assert set(failed) == set(first) and all(r.finish_reason == "error" for r in first)
    engine.worker.launch = real
    late = engine.add_request(_prompts(3)[2], p)
    while engine.has_unfinished():
        engine.step()
    assert len(late.output_token_ids) == 6 and late.finish_reason == "length"
    assert engine.allocator.num_free == engine.allocator.num_blocks


def test_overlap_is_refused_with_speculation():
    with pytest.raises(ConfigError, match="vanilla decoding only"):
        EngineConfig(overlap_schedule=True, speculative_algorithm="EAGLE3")
