"""--speculative-adaptive: the engine switches speculation shapes between steps and stays lossless
(float32, CPU: token for token the target's own greedy output)."""

from __future__ import annotations

import random

import pytest
import torch

from hotspec import LLM, SamplingParams
from hotspec.config import ConfigError, EngineConfig
from hotspec.core.spec_shape import SpecShape
from hotspec.models.default_model import default_model_path
from hotspec.models.draft_checkpoint import random_draft_checkpoint
from hotspec.models.loader import load_checkpoint
from hotspec.speculative.adaptive import AdaptivePolicy, Choice

PROMPTS = ["The capital of France is", "def quicksort(arr):", "List three colours:",
           "Write a haiku about the sea.", "In 1969, the first humans landed on"]
MAX_TOKENS = 16
CANDIDATES = ("off", "2/1/3", "3/1/4", "4/8/12", "3/4/8")


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    cfg, _ = load_checkpoint(default_model_path(), torch.float32)
    return random_draft_checkpoint(tmp_path_factory.mktemp("head") / "e3", cfg, "EAGLE3", seed=1)


@pytest.fixture(scope="module")
def adaptive_llm(head):
    return LLM(dtype="float32", device="cpu", kv_cache_memory_gb=0.05, speculative_algorithm="EAGLE3",
               speculative_draft_model_path=str(head), speculative_adaptive=True,
               speculative_candidates=CANDIDATES)


class RandomShapes(AdaptivePolicy):
    """A shape drawn at random before every step: switches as often as possible."""

    def __init__(self, shapes: list[SpecShape], seed: int) -> None:
        super().__init__(shapes, costs=None)  # type: ignore[arg-type]
        self.rng = random.Random(seed)
        self.picked: list[str] = []

    def choose(self, bs: int, rids: list[int] | None = None) -> Choice:
        s = self.rng.choice(self.candidates)
        self.picked.append(s.label)
        return Choice(s, {})

    def observe(self, *args: object) -> None:
        pass

    def observe_catch_up(self, *args: object) -> None:
        pass


def test_switching_shapes_every_step_is_lossless(adaptive_llm, smol_llm):
    worker = adaptive_llm.engine.worker
    assert [s.label for s in worker.shapes] == ["2/1/3", "3/1/4", "4/8/12", "3/4/8", "off"]
    p = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    want = [o.token_ids for o in smol_llm.generate(PROMPTS, p)]
    policy, worker.policy = worker.policy, RandomShapes([SpecShape.parse(c) for c in CANDIDATES], 0)
    try:
        for bs in (1, 3, 5):
            outs = adaptive_llm.generate(PROMPTS[:bs], p)
            assert [o.token_ids for o in outs] == want[:bs], bs
        assert len(set(worker.policy.picked)) == len(CANDIDATES)
    finally:
        worker.policy = policy


def test_the_policy_measures_and_chooses(adaptive_llm, smol_llm):
    """The real policy: every candidate runs once first (in the loop), then the choices follow
    the estimates; outputs stay the target's."""
    worker = adaptive_llm.engine.worker
    p = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    want = [o.token_ids for o in smol_llm.generate(PROMPTS, p)]
    outs = adaptive_llm.generate(PROMPTS, p)
    assert [o.token_ids for o in outs] == want
    policy = worker.policy
    assert set(policy.chosen) and all(c in {*CANDIDATES} for c in policy.chosen.values())
    measured = {s.label for (s, _) in policy.costs.ms}
    assert measured == set(CANDIDATES)
    assert {s.label for (s, _) in policy.costs.real} == set(CANDIDATES)  # each ran in the loop
    assert policy.profile.weight(SpecShape.parse("3/1/4")) > 0


class Cycle(RandomShapes):
    """`off` for `n_off` steps, then one step of `shape`, over and over."""

    def __init__(self, shape: str, n_off: int) -> None:
        super().__init__([SpecShape.parse("off"), SpecShape.parse(shape)], 0)
        self.cycle = [SpecShape.parse("off")] * n_off + [SpecShape.parse(shape)]

    def choose(self, bs: int, rids: list[int] | None = None) -> Choice:
        s = self.cycle[len(self.picked) % len(self.cycle)]
        self.picked.append(s.label)
        return Choice(s, {})


def _accept_rate(worker) -> float:
    hist = worker.stats.accept_hist
    steps = sum(hist.values())
    return sum((a - 1) * n for a, n in hist.items()) / steps / 3 if steps else 0.0


def test_the_draft_catches_up_after_plain_decode_steps(smol_llm):
    """With the shipped head: a 3/1/4 step after plain decode steps (the draft caught up on
    their tokens, once by the bound of MAX_PENDING steps while still off) accepts about as
    often as 3/1/4 steps back to back; outputs stay the target's."""
    from hotspec.speculative import worker as worker_mod

    llm = LLM(dtype="float32", device="cpu", kv_cache_memory_gb=0.05, speculative_algorithm="EAGLE3",
              speculative_adaptive=True, speculative_candidates=("off", "3/1/4"))
    worker = llm.engine.worker
    p = SamplingParams(temperature=0.0, max_tokens=48)
    want = [o.token_ids for o in smol_llm.generate(PROMPTS[:2], p)]
    worker.policy = Cycle("3/1/4", 0)
    assert [o.token_ids for o in llm.generate(PROMPTS[:2], p)] == want
    steady = _accept_rate(worker)
    worker.stats.accept_hist.clear()
    worker.policy = Cycle("3/1/4", 3)
    assert [o.token_ids for o in llm.generate(PROMPTS[:2], p)] == want
    after_off = _accept_rate(worker)
    assert steady > 0.2 and after_off > 0.6 * steady, (steady, after_off)
    old, worker_mod.MAX_PENDING = worker_mod.MAX_PENDING, 4
    try:
        worker.policy = Cycle("3/1/4", 10)
        calls = worker.stats.phase_calls["catch_up"]
        assert [o.token_ids for o in llm.generate(PROMPTS[:2], p)] == want
        assert worker.stats.phase_calls["catch_up"] - calls > 2
    finally:
        worker_mod.MAX_PENDING = old


def test_candidates_are_checked():
    with pytest.raises(ConfigError, match="speculative_candidates: a speculation shape is"):
        EngineConfig(speculative_algorithm="EAGLE3", speculative_adaptive=True,
                     speculative_candidates=("3-1-4",))
    with pytest.raises(ConfigError, match="a chain"):
        EngineConfig(speculative_algorithm="EAGLE3", speculative_adaptive=True,
                     speculative_candidates=("3/1/5",))
    with pytest.raises(ConfigError, match="fused step"):
        EngineConfig(speculative_algorithm="EAGLE3", speculative_adaptive=True, fuse_spec_step=False)


def test_profiled_engine_still_adapts(head, smol_llm):
    """With phase profiling on (hotspec bench on the CPU), the policy's shapes still run, as fused
    steps."""
    llm = LLM(dtype="float32", device="cpu", kv_cache_memory_gb=0.05, speculative_algorithm="EAGLE3",
              speculative_draft_model_path=str(head), speculative_adaptive=True,
              speculative_candidates=("off", "2/1/3", "4/8/12"), profile_phases=True)
    llm.engine.worker.profile = True
    p = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    want = [o.token_ids for o in smol_llm.generate(PROMPTS[:2], p)]
    assert [o.token_ids for o in llm.generate(PROMPTS[:2], p)] == want
    assert set(llm.engine.worker.stats.shape_steps) >= {"off", "2/1/3", "4/8/12"}


def test_catch_up_warm_up_writes_nothing_a_request_reads(adaptive_llm, smol_llm):
    """The start-up pass that compiles the catch-up's kernels (run on CUDA by the builder) runs
    every captured batch size and pending length, writing only the trash slot: outputs after it
    are still the target's."""
    worker = adaptive_llm.engine.worker
    p = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    want = [o.token_ids for o in smol_llm.generate(PROMPTS[:2], p)]
    assert worker.catch_up.warm((1, 3)) == 3 * 2 * len(worker.executor.graphs.batch_sizes)
    policy = worker.policy
    assert set(policy.catch_up_ms) == set(worker.executor.graphs.batch_sizes)
    assert all(ms > 0 for ms in policy.catch_up_ms.values())
    assert [o.token_ids for o in adaptive_llm.generate(PROMPTS[:2], p)] == want
