"""The context's end: a request whose prompt and max_tokens fill max_model_len gets exactly
max_tokens tokens, speculative exactly as vanilla (float32, greedy), whatever the shape writes
past the last token; the longest prompt the context allows gets one token."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_utils import tiny_target_and_head

from hotspec.core.spec_shape import SpecShape
from hotspec.entrypoints.llm import LLM
from hotspec.errors import InvalidRequestError
from hotspec.sampling_params import SamplingParams

CONTEXT = 64
SHAPES = {"vanilla": {}, "3/1/4": {"speculative_num_steps": 3, "speculative_eagle_topk": 1,
                                   "speculative_num_draft_tokens": 4},
          "4/8/12": {"speculative_num_steps": 4, "speculative_eagle_topk": 8,
                     "speculative_num_draft_tokens": 12},
          "adaptive": {"speculative_adaptive": True}}
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return tiny_target_and_head(tmp_path_factory.mktemp("ctx"), layers=4)


def _llm(models: tuple[Path, Path], name: str, **extra: object) -> LLM:
    target, head = models
    spec = {} if name == "vanilla" else {"speculative_algorithm": "EAGLE3",
                                         "speculative_draft_model_path": str(head), **SHAPES[name]}
    options = {"block_size": 4, "max_model_len": CONTEXT, "num_kv_blocks": 64, **spec, **extra}
    return LLM(model=str(target), dtype="float32", device="cpu", skip_tokenizer_init=True,
               **options)


def test_a_request_that_fills_the_context_gets_every_token_it_asked_for(models):
    prompts = [[(7 * i + j) % 90 + 3 for j in range(n)] for i, n in enumerate((40, 57, 63))]
    asks = [SamplingParams(temperature=0.0, max_tokens=CONTEXT - len(p), ignore_eos=True)
            for p in prompts]
    more = [SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True) for _ in prompts]
    outs = {}
    for name in SHAPES:
        llm = _llm(models, name)
        assert llm.engine.max_model_len == CONTEXT
        exact = llm.generate(prompt_token_ids=prompts, sampling_params=asks)
        over = llm.generate(prompt_token_ids=prompts, sampling_params=more)
        for p, a, b in zip(prompts, exact, over):
            assert len(a.token_ids) == len(b.token_ids) == CONTEXT - len(p)  # 24, 7 and 1
            assert a.finish_reason == b.finish_reason == "length" and a.token_ids == b.token_ids
        outs[name] = [o.token_ids for o in exact]
    assert all(toks == outs["vanilla"] for toks in outs.values())


def test_a_speculative_engine_keeps_room_for_its_steps_in_a_small_cache(models):
    """A 4/8/12 step writes up to 24 slots past a request's length (its draft tree's scratch: 8
    candidates at each of 3 depths): in a cache of 80 slots the context is what leaves them, and
    a request that fills it ends by length, its tokens vanilla's."""
    llm = _llm(models, "4/8/12", num_kv_blocks=20, max_model_len=None)
    cap, reserve = llm.engine.kv_capacity, SpecShape.parse("4/8/12").reserve
    assert reserve == 24 == llm.engine.worker.reserve
    assert 64 <= cap <= 80 and llm.engine.max_model_len == cap - reserve + 1
    with pytest.raises(InvalidRequestError, match=r"limited by the KV cache's capacity"):
        llm.generate(prompt_token_ids=[[5] * (cap - reserve + 1)],
                     sampling_params=SamplingParams(max_tokens=1))
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    (out,) = llm.generate(prompt_token_ids=[[5] * 40], sampling_params=params)
    assert out.finish_reason == "length" and len(out.token_ids) == cap - reserve + 1 - 40
    (plain,) = _llm(models, "vanilla").generate(prompt_token_ids=[[5] * 40], sampling_params=params)
    assert out.token_ids == plain.token_ids[:len(out.token_ids)]
