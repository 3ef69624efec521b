"""The overlap schedule (`overlap_schedule=True`): step N+1 is launched before step N is read, and
takes what it needs of step N on the device (vanilla: the token; EAGLE's fused step: sequence
length, root token, RNG offset and draft state). Users rely on it changing nothing but timing: the
same tokens, greedy and sampled, as the plain schedule, through EOS and stop-token finishes (one
wasted row each), max_tokens (foreseen), the context limit, preemption, aborts, requests joining
mid-stream, and the CUDA-graph path (static buffers, padded batches) on the CPU."""

from __future__ import annotations

import pytest
import torch
from engine_utils import save_tiny_llama

from hotspec import LLM, SamplingParams
from hotspec.config import ConfigError, EngineConfig
from hotspec.engine.builder import EngineBuilder
from hotspec.models.draft_checkpoint import random_draft_checkpoint
from hotspec.models.loader import load_checkpoint
from hotspec.runtime.graph_runner import GraphRunner

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = 96


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("ovl") / "target", vocab=VOCAB, hidden=64, layers=4,
                           std=0.2)


@pytest.fixture(scope="module")
def head(target, tmp_path_factory):
    mcfg = load_checkpoint(target, torch.float32)[0]
    return random_draft_checkpoint(tmp_path_factory.mktemp("ovlh") / "head", mcfg, "EAGLE3", seed=0,
                                   scale=0.3)


SPEC = {"vanilla": None, "chain": (3, 1, 4), "tree": (4, 3, 8)}


def _kw(target, spec=None, head=None, **over):
    kw = dict(model=str(target), dtype="float32", device="cpu", skip_tokenizer_init=True,
              num_kv_blocks=128, block_size=4, max_model_len=128)
    if spec is not None:
        kw.update(speculative_algorithm="EAGLE3", speculative_draft_model_path=str(head),
                  speculative_num_steps=spec[0], speculative_eagle_topk=spec[1],
                  speculative_num_draft_tokens=spec[2])
    kw.update(over)
    return kw


def _prompts(n: int = 5, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (int(k),), generator=g).tolist() for k in (3, 11, 6, 20, 9, 4, 7)[:n]]


def _static(monkeypatch):
    monkeypatch.setattr(EngineBuilder, "_graph_runner",
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


@pytest.mark.parametrize("spec", list(SPEC))
@pytest.mark.parametrize("mode", ["eager", "static"])
@pytest.mark.parametrize("name", list(PARAMS))
def test_same_tokens_as_the_plain_schedule(target, head, monkeypatch, spec, mode, name):
    if mode == "static":
        _static(monkeypatch)
    prompts, params = _prompts(), PARAMS[name]
    kw = _kw(target, SPEC[spec], head)
    ref = _run(LLM(**kw), prompts, params)
    llm = LLM(**dict(kw, overlap_schedule=True))
    assert _run(llm, prompts, params) == ref
    if spec != "vanilla" and name in ("greedy", "sampled"):  # steps advanced by varying lengths
        assert max(llm.engine.worker.stats.accept_hist) > 1
    if name == "stops":  # the test means something: stop tokens did end requests early
        assert any(reason == "stop" for _, reason in ref)
        assert llm.engine.dropped_rows > 0  # the rows launched after a stop, counted
    engine = llm.engine
    assert engine.allocator.num_free == engine.allocator.num_blocks
    assert not engine.has_unfinished()
    assert not engine.worker.unread()  # the steps launched after a stop are read before generate returns


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
        assert worker.unread() <= 1
    # prefill gives one token each; then 3 + 5 + 7 tokens come from exactly that many launched rows
    assert counts[0] == 3 and sum(counts) == 4 + 6 + 8
    assert sum(launched) == 3 + 5 + 7
    assert counts[1] == 0  # the first decode step only launches


@pytest.mark.parametrize("spec", list(SPEC))
def test_context_limit(target, head, spec):
    """A request stopped by the context limit ends at the same token as with the plain schedule,
    and no step is launched past the limit (its block table would overflow)."""
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [5, 6, 7]]
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    kw = _kw(target, SPEC[spec], head, max_model_len=40)
    ref = _run(LLM(**kw), prompts, params)
    assert ref[0][1] == "length" and len(ref[0][0]) < 200
    assert _run(LLM(**dict(kw, overlap_schedule=True)), prompts, params) == ref


@pytest.mark.parametrize("spec", list(SPEC))
def test_preemption_and_late_joiners(target, head, spec):
    """A cache too small for every request forces preemption (recompute) and admits requests as
    others finish; outputs still equal the plain schedule's. (Speculative runs are greedy here:
    sampled ones keep the target's distribution, but which tokens they draw depends on the drafts,
    and a recompute after preemption rebuilds the draft state at another step.)"""
    prompts = _prompts(7, seed=3)
    temperature = 0.7 if spec == "vanilla" else 0.0
    params = [SamplingParams(temperature=temperature, seed=i, max_tokens=16 + 4 * i, ignore_eos=True)
              for i in range(7)]
    small = dict(num_kv_blocks=16 if spec == "vanilla" else 30, max_num_seqs=4)
    kw = _kw(target, SPEC[spec], head, **small)
    ref = _run(LLM(**kw), prompts, params)
    llm = LLM(**dict(kw, overlap_schedule=True))
    preempted = []
    real = llm.engine._preempt
    llm.engine._preempt = lambda r: (preempted.append(r.rid), real(r))[1]
    assert _run(llm, prompts, params) == ref
    assert preempted, "the cache was meant to be too small"
    assert llm.engine.allocator.num_free == llm.engine.allocator.num_blocks


@pytest.mark.parametrize("spec", list(SPEC))
def test_abort_with_a_step_in_flight(target, head, spec):
    kw = _kw(target, SPEC[spec], head)
    llm = LLM(**dict(kw, overlap_schedule=True))
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
    ref = LLM(**kw).generate(
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


def test_overlap_needs_the_fused_speculative_step():
    with pytest.raises(ConfigError, match="fused step"):
        EngineConfig(overlap_schedule=True, speculative_algorithm="EAGLE3", fuse_spec_step=False)


def test_profiling_phases_reads_every_step_first(target, head):
    """The benchmark builds an engine with the phase graphs (profile_phases), times it with
    profiling off (the fused step, overlapped), then switches phase profiling on mid-life
    (`worker.profile`): the engine then reads the launched step before it runs the phases one by
    one, and the tokens do not change. Without the phase graphs that switch is a clear error."""
    kw = _kw(target, SPEC["tree"], head)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    ref = _run(LLM(**kw), _prompts(3), params)
    plain = LLM(**dict(kw, overlap_schedule=True)).engine
    plain.add_request(_prompts(1)[0], params)
    plain.step()
    plain.worker.profile = True
    with pytest.raises(RuntimeError, match="phase graphs were not built"):
        plain.step()
    llm = LLM(**dict(kw, overlap_schedule=True, profile_phases=True))
    engine = llm.engine
    engine.worker.profile = False
    reqs = [engine.add_request(p, params) for p in _prompts(3)]
    for _ in range(3):
        engine.step()
    assert engine.worker.unread() == 1
    engine.worker.profile = True
    while engine.has_unfinished():
        engine.step()
    assert engine.worker.stats.phase_calls["verify"] > 0
    assert [(r.output_token_ids, r.finish_reason) for r in reqs] == ref


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_bench_driver_syncs_prefill_steps_only_and_counts_tokens_right(target, monkeypatch, overlap):
    """`hotspec bench` / spec_sweep time the prefill steps apart; a device sync after every step
    would undo the overlap schedule (the step launched ahead would be waited for each time), so
    only steps that may prefill are synced. Requests joining mid-run (batch 2, 5 prompts) still
    get exactly their first tokens counted as prefill tokens."""
    from hotspec.benchmark import spec_bench

    syncs = []
    monkeypatch.setattr(spec_bench, "sync", lambda dev: syncs.append(1))
    llm = LLM(**_kw(target, max_num_seqs=2, overlap_schedule=overlap))
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    run = spec_bench.drive(llm.engine, _prompts(5), params)
    assert [len(o) for o in run.outputs] == [12] * 5
    assert run.prefill_tokens == 5  # each request's first token, none of the decode steps' tokens
    decode_steps = 11 * 5 // 2  # at least this many steps decode only
    assert len(syncs) < 1 + 2 * 5 + 2, (len(syncs), "syncs: one per decode step?")
    assert len(syncs) < decode_steps
    # the engine's own decode steps, whatever their batch: 55 decode tokens at 1-2 rows a step
    # (the overlap schedule adds at most a read-only step at the end of each admission wave)
    assert 28 <= run.decode_steps <= 55 + 5, run.decode_steps


def test_default_is_on_with_cuda_graphs_and_a_fused_step_only(target):
    """overlap_schedule=None (the default) resolves to on only where it pays: CUDA graphs, and for
    speculative decoding the fused step; an explicit value always wins. On the CPU it is off."""
    from types import SimpleNamespace

    from hotspec.engine.builder import EngineBuilder

    def resolved(mode, **cfg):
        fake = SimpleNamespace(cfg=EngineConfig(**cfg), graphs=SimpleNamespace(mode=mode))
        return EngineBuilder._overlap(fake)

    assert resolved("cuda") and resolved("cuda", speculative_algorithm="EAGLE3")
    assert not resolved("cuda", speculative_algorithm="EAGLE3", fuse_spec_step=False)
    assert not resolved("eager") and not resolved("static")
    assert not resolved("cuda", overlap_schedule=False)
    assert resolved("eager", overlap_schedule=True)
    assert not LLM(**_kw(target)).engine.worker.overlapping  # CPU default


@pytest.mark.parametrize("spec", list(SPEC))
def test_a_prefill_is_launched_before_the_steps_in_flight_are_read(target, head, monkeypatch, spec):
    """Requests admitted while a decode step is in flight (max_num_seqs 2, five prompts of mixed
    lengths): the prefill pass is launched first and the step collected while it runs (the host
    emits the step's tokens while the device prefills); outputs equal the plain schedule's."""
    _static(monkeypatch)
    prompts, params = _prompts(), PARAMS["mixed-lengths"]
    kw = _kw(target, SPEC[spec], head, max_num_seqs=2)
    ref = _run(LLM(**kw), prompts, params)
    llm = LLM(**dict(kw, overlap_schedule=True))
    worker, graphs = llm.engine.worker, llm.engine.graphs
    unread_at_prefill: list[int] = []
    run_bucket = graphs.run_bucket

    def spy(name, inputs):
        if name == "prefill":
            unread_at_prefill.append(worker.unread())
        return run_bucket(name, inputs)

    monkeypatch.setattr(graphs, "run_bucket", spy)
    assert _run(llm, prompts, params) == ref
    assert len(unread_at_prefill) >= 3 and max(unread_at_prefill) > 0
    assert not worker.unread() and llm.engine.allocator.num_free == llm.engine.allocator.num_blocks


def test_steps_read_during_a_prefill_are_not_timed_for_the_policy(target, head, monkeypatch):
    """The adaptive policy's step costs leave out the steps a prefill step collects after its
    launch (their wait holds the prefill's host work); the others are timed."""
    from test_adaptive_engine import RandomShapes

    from hotspec.core.spec_shape import SpecShape

    class Record(RandomShapes):
        def __init__(self) -> None:
            super().__init__([SpecShape.parse("3/1/4")], 0)
            self.ms: list[float | None] = []

        def observe(self, shape, bs, ms, *args) -> None:
            self.ms.append(ms)

    _static(monkeypatch)
    kw = _kw(target, None, None, max_num_seqs=2, speculative_algorithm="EAGLE3",
             speculative_draft_model_path=str(head), speculative_adaptive=True,
             speculative_candidates=("3/1/4",), overlap_schedule=True)
    llm = LLM(**kw)
    worker = llm.engine.worker
    worker.policy = policy = Record()
    during: list[int] = []
    untimed = worker._untimed

    def spy(collect):
        before = len(policy.ms)
        untimed(collect)
        during.extend(range(before, len(policy.ms)))

    monkeypatch.setattr(worker, "_untimed", spy)
    _run(llm, _prompts(), PARAMS["mixed-lengths"])
    assert during and all(policy.ms[i] is None for i in during)
    assert sum(m is not None for m in policy.ms) > len(policy.ms) // 2
