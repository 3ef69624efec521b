"""Logprobs (`SamplingParams.logprobs`): each generated token's logprob under the target and the
most likely alternatives, the target's raw distribution (core/logprobs.py). Vanilla decoding
reports transformers' own log_softmax at each position; speculative decoding (chain and tree
shapes, the shipped hot-vocabulary head and a full-vocabulary head with and without an FR-Spec
map) reports the same tokens with the same logprobs as vanilla, greedy or sampled."""

from __future__ import annotations

import pytest
import torch

from hotspec import LLM, SamplingParams
from hotspec.errors import InvalidRequestError
from hotspec.models.default_model import default_model_path
from hotspec.models.draft_checkpoint import random_draft_checkpoint
from hotspec.models.loader import load_checkpoint

PROMPTS = [[1, 504, 3458, 282, 4649, 314], [1, 1883, 1492, 30, 88, 28, 284, 982], [1, 19842, 2]]
N, TOP = 12, 5
GREEDY = SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True, logprobs=TOP)
SAMPLED = SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=N, ignore_eos=True,
                         logprobs=TOP)


def spec_llm(shape: tuple[int, int, int], **kw: object) -> LLM:
    steps, topk, ntok = shape
    return LLM(dtype="float32", device="cpu", kv_cache_memory_gb=0.05, speculative_num_steps=steps,
               speculative_eagle_topk=topk, speculative_num_draft_tokens=ntok,
               speculative_algorithm=kw.pop("algorithm", "EAGLE3"), **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def vanilla(smol_llm: LLM) -> dict[str, list]:
    return {name: smol_llm.generate(prompt_token_ids=PROMPTS, sampling_params=p)
            for name, p in (("greedy", GREEDY), ("sampled", SAMPLED))}


@pytest.fixture(scope="module")
def eagle_head(tmp_path_factory: pytest.TempPathFactory):
    cfg = load_checkpoint(default_model_path(), torch.float32)[0]
    return random_draft_checkpoint(tmp_path_factory.mktemp("lp") / "eagle", cfg, "EAGLE", seed=3)


@torch.no_grad()
def test_vanilla_logprobs_are_transformers_log_softmax(vanilla: dict[str, list], hf_smol) -> None:
    for out in vanilla["greedy"] + vanilla["sampled"]:
        ids = out.prompt_token_ids + out.token_ids
        ref = torch.log_softmax(hf_smol(torch.tensor([ids])).logits[0].float(), -1)
        ref = ref[len(out.prompt_token_ids) - 1 : -1]  # the position each token was chosen at
        assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids) == N
        for pos, (tok, lp) in enumerate(zip(out.token_ids, out.logprobs)):
            assert lp.token_id == tok
            assert lp.logprob == pytest.approx(ref[pos, tok].item(), abs=2e-3)
            assert len(lp.top) == TOP
            top_lp = [v for _, v in lp.top]
            assert top_lp == sorted(top_lp, reverse=True)
            assert [i for i, _ in lp.top][:1] == [int(ref[pos].argmax())]
            torch.testing.assert_close(torch.tensor(top_lp), ref[pos, [i for i, _ in lp.top]],
                                       atol=2e-3, rtol=0)
    for out in vanilla["greedy"]:  # the greedy token is the most likely one
        assert all(lp.top[0][0] == lp.token_id for lp in out.logprobs)


def _assert_same(outs: list, ref: list) -> None:
    for o, r in zip(outs, ref):
        assert o.token_ids == r.token_ids
        assert o.logprobs is not None and len(o.logprobs) == len(o.token_ids)
        for a, b in zip(o.logprobs, r.logprobs):
            assert a.token_id == b.token_id
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
            assert [i for i, _ in a.top] == [i for i, _ in b.top]
            torch.testing.assert_close(torch.tensor([v for _, v in a.top]),
                                       torch.tensor([v for _, v in b.top]), atol=1e-4, rtol=0)


@pytest.mark.parametrize("shape", [(3, 1, 4), (4, 8, 12)], ids=["chain-3-1-4", "tree-4-8-12"])
def test_speculative_logprobs_equal_vanilla_with_the_shipped_head(shape, vanilla) -> None:
    """The shipped head drafts from its own 8,192-token LM head (FR-Spec) and accepts often, so
    tokens past the first of a step (path positions d > 0) are checked too."""
    llm = spec_llm(shape)
    for name, p in (("greedy", GREEDY), ("sampled", SAMPLED)):
        outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=p)
        if name == "greedy":
            _assert_same(outs, vanilla[name])
            assert sum(o.stats.spec_steps for o in outs) < sum(len(o.token_ids) for o in outs)
        else:  # the draws differ from vanilla's; each token's logprob is still the target's
            for o in outs:
                assert o.logprobs is not None and len(o.logprobs) == len(o.token_ids) == N
                assert [lp.token_id for lp in o.logprobs] == o.token_ids


@torch.no_grad()
def test_sampled_speculative_logprobs_are_the_targets(hf_smol) -> None:
    outs = spec_llm((3, 1, 4)).generate(prompt_token_ids=PROMPTS, sampling_params=SAMPLED)
    for out in outs:
        ids = out.prompt_token_ids + out.token_ids
        ref = torch.log_softmax(hf_smol(torch.tensor([ids])).logits[0].float(), -1)
        ref = ref[len(out.prompt_token_ids) - 1 : -1]
        got = torch.tensor([lp.logprob for lp in out.logprobs])
        torch.testing.assert_close(got, ref[torch.arange(N), out.token_ids], atol=2e-3, rtol=0)


@pytest.mark.parametrize("token_map", [False, True], ids=["full-vocab", "fr-spec-map"])
def test_full_vocabulary_head_with_and_without_a_map(token_map, eagle_head, vanilla, tmp_path) -> None:
    kw: dict[str, object] = {"algorithm": "EAGLE", "speculative_draft_model_path": str(eagle_head)}
    if token_map:
        path = tmp_path / "hot.pt"
        torch.save(list(range(0, 49152, 3)), path)
        kw["speculative_token_map"] = str(path)
    outs = spec_llm((3, 1, 4), **kw).generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)
    _assert_same(outs, vanilla["greedy"])


def test_logprobs_zero_gives_the_chosen_token_alone(smol_llm: LLM) -> None:
    out = smol_llm.generate(prompt_token_ids=PROMPTS[:1], sampling_params=SamplingParams(
        temperature=0.0, max_tokens=3, logprobs=0))[0]
    assert out.logprobs is not None and [lp.top for lp in out.logprobs] == [(), (), ()]
    assert all(lp.logprob <= 0 for lp in out.logprobs)
    plain = smol_llm.generate(prompt_token_ids=PROMPTS[:1], sampling_params=SamplingParams(
        temperature=0.0, max_tokens=3))[0]
    assert plain.logprobs is None and plain.token_ids == out.token_ids


@pytest.mark.parametrize("bad", [-1, 21, 2.5, True])
def test_logprobs_out_of_range_is_refused(bad: object) -> None:
    with pytest.raises(InvalidRequestError, match=r"logprobs must be None or an int in \[0, 20\]"):
        SamplingParams(logprobs=bad)  # type: ignore[arg-type]


@torch.no_grad()
@pytest.mark.parametrize("chunk", [None, 3], ids=["whole", "chunked-prefill-3"])
def test_prompt_logprobs_are_transformers_and_max_tokens_zero_scores_only(chunk, hf_smol) -> None:
    """`prompt_logprobs` (the API's `echo` with logprobs): each prompt token after the first
    under the prefix before it, whole or over prefill chunks; max_tokens 0 generates nothing."""
    llm = LLM(dtype="float32", device="cpu", kv_cache_memory_gb=0.05, max_prefill_tokens=chunk)
    p = SamplingParams(temperature=0.0, max_tokens=0, prompt_logprobs=3)
    outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=p)
    for out, ids in zip(outs, PROMPTS):
        assert out.token_ids == [] and out.finish_reason == "length"
        assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(ids)
        assert out.prompt_logprobs[0] is None
        ref = torch.log_softmax(hf_smol(torch.tensor([ids])).logits[0].float(), -1)
        for pos, lp in enumerate(out.prompt_logprobs[1:]):
            assert lp is not None and lp.token_id == ids[pos + 1] and len(lp.top) == 3
            assert lp.logprob == pytest.approx(ref[pos, ids[pos + 1]].item(), abs=2e-3)
            assert lp.top[0][0] == int(ref[pos].argmax())
    one = llm.generate(prompt_token_ids=[[1]], sampling_params=p)[0]
    assert one.prompt_logprobs == [None]


def test_prompt_logprobs_with_generation_and_speculation(vanilla) -> None:
    """With tokens generated too (speculative engine), the prompt's logprobs come once and the
    generated tokens are vanilla's."""
    p = SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True, logprobs=TOP, prompt_logprobs=1)
    outs = spec_llm((3, 1, 4)).generate(prompt_token_ids=PROMPTS, sampling_params=p)
    _assert_same(outs, vanilla["greedy"])
    assert [len(o.prompt_logprobs or []) for o in outs] == [len(ids) for ids in PROMPTS]


def test_max_tokens_zero_needs_prompt_logprobs() -> None:
    with pytest.raises(InvalidRequestError, match="max_tokens must be an int >= 1, got 0"):
        SamplingParams(max_tokens=0)
    assert SamplingParams(max_tokens=0, prompt_logprobs=0).max_tokens == 0
