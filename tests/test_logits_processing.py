"""Logits processing (SamplingParams: presence, frequency and repetition penalties, logit_bias,
min_tokens): vanilla greedy decoding equals a step-by-step reference on transformers' logits, and
speculative decoding (chain and tree, the shipped hot-vocabulary head, a full-vocabulary head
with an FR-Spec map) equals vanilla token for token, each tree node processed with the counts
along its path. Sampling's exactness is tests/test_spec_stochastic.py's."""

from __future__ import annotations

import pytest
import torch

from hotspec import LLM, SamplingParams
from hotspec.errors import InvalidRequestError
from hotspec.models.default_model import default_model_path
from hotspec.models.draft_checkpoint import random_draft_checkpoint
from hotspec.models.loader import load_checkpoint

PROMPTS = [[1, 504, 3458, 282, 4649, 314], [1, 1883, 1492, 30, 88, 28, 284, 982], [1, 19842, 2]]
N = 16
CASES = {
    "presence-frequency": dict(presence_penalty=1.5, frequency_penalty=0.7),
    "repetition": dict(repetition_penalty=1.4),
    "bias-and-all": dict(presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.2,
                         logit_bias={28: 4.0, 30: -100.0}),
}


def params(case: str, **kw: object) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True, **CASES[case], **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def vanilla(smol_llm: LLM) -> dict[str, list[list[int]]]:
    return {c: [o.token_ids for o in smol_llm.generate(prompt_token_ids=PROMPTS, sampling_params=params(c))]
            for c in CASES}


@torch.no_grad()
def reference(hf, prompt: list[int], p: SamplingParams) -> list[int]:
    """Greedy decoding on transformers' logits, processed in SamplingParams' order."""
    ids, out = list(prompt), []
    for _ in range(N):
        x = hf(torch.tensor([ids])).logits[0, -1].double()
        for t, v in (p.logit_bias or {}).items():
            x[t] += v
        counts = torch.bincount(torch.tensor(out, dtype=torch.long), minlength=x.numel()).double()
        seen = counts > 0
        seen[prompt] = True
        r = p.repetition_penalty
        x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
        x = x - p.presence_penalty * (counts > 0) - p.frequency_penalty * counts
        out.append(int(x.argmax()))
        ids.append(out[-1])
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_vanilla_greedy_with_processing_is_the_reference(case, vanilla, smol_llm, hf_smol) -> None:
    plain = [o.token_ids for o in smol_llm.generate(prompt_token_ids=PROMPTS, sampling_params=SamplingParams(
        temperature=0.0, max_tokens=N, ignore_eos=True))]
    assert plain != vanilla[case]  # the processing changes the answers
    for prompt, got in zip(PROMPTS, vanilla[case]):
        assert got == reference(hf_smol, prompt, params(case))


@pytest.mark.parametrize("case", list(CASES))
def test_speculative_greedy_with_processing_equals_vanilla(case, spec, vanilla) -> None:
    outs = spec.generate(prompt_token_ids=PROMPTS, sampling_params=params(case))
    assert [o.token_ids for o in outs] == vanilla[case]
    assert sum(o.stats.spec_steps for o in outs) < len(PROMPTS) * N  # drafts were accepted


def test_full_vocabulary_head_with_a_map_equals_vanilla(vanilla, tmp_path) -> None:
    cfg = load_checkpoint(default_model_path(), torch.float32)[0]
    head = random_draft_checkpoint(tmp_path / "eagle", cfg, "EAGLE", seed=3)
    torch.save(list(range(0, 49152, 3)), tmp_path / "hot.pt")
    llm = LLM(dtype="float32", device="cpu", kv_cache_memory_gb=0.05, speculative_algorithm="EAGLE",
              speculative_draft_model_path=str(head), speculative_num_steps=3,
              speculative_eagle_topk=2, speculative_num_draft_tokens=5,
              speculative_token_map=str(tmp_path / "hot.pt"))
    outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params("bias-and-all"))
    assert [o.token_ids for o in outs] == vanilla["bias-and-all"]


@pytest.mark.parametrize("spec", [False, True], ids=["vanilla", "speculative-3-1-4"])
def test_min_tokens_masks_the_stop_tokens_until_reached(spec, smol_llm) -> None:
    eos = smol_llm.engine.eos_token_ids
    llm = LLM(dtype="float32", device="cpu", kv_cache_memory_gb=0.05, speculative_algorithm="EAGLE3",
              speculative_num_steps=3, speculative_eagle_topk=1,
              speculative_num_draft_tokens=4) if spec else smol_llm
    push = {t: 100.0 for t in eos}  # the stop token wins wherever it is allowed
    for m in (0, 1, 5):
        out = llm.generate(prompt_token_ids=PROMPTS[:1], sampling_params=SamplingParams(
            temperature=0.0, max_tokens=N, min_tokens=m, logit_bias=push))[0]
        assert len(out.token_ids) == m + 1 and out.token_ids[-1] in eos and out.finish_reason == "stop"
        assert not set(out.token_ids[:-1]) & eos


def test_bad_processing_parameters_are_refused(smol_llm) -> None:
    with pytest.raises(InvalidRequestError, match="logit_bias token ids \\[99999\\] are outside"):
        smol_llm.generate(prompt_token_ids=PROMPTS[:1],
                          sampling_params=SamplingParams(logit_bias={99999: 1.0}))
    for kw, msg in ((dict(presence_penalty=2.5), "presence_penalty must be a number in \\[-2, 2\\]"),
                    (dict(repetition_penalty=0.0), "repetition_penalty must be a finite number > 0"),
                    (dict(logit_bias={1: 101.0}), "logit_bias must be a mapping"),
                    (dict(min_tokens=20, max_tokens=10),
                     "min_tokens must be an int in \\[0, max_tokens=10\\]")):
        with pytest.raises(InvalidRequestError, match=msg):
            SamplingParams(**kw)  # type: ignore[arg-type]


def test_the_draft_proposes_under_the_penalties(spec, monkeypatch) -> None:
    """The [full] step processes the draft's logits too (its hot columns), so its proposals are
    the ones the penalised target keeps: more tokens per step than raw proposals, same answer."""
    from hotspec.speculative.phases import EaglePhases

    p = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, presence_penalty=2.0,
                       frequency_penalty=1.0, repetition_penalty=1.3)
    outs = spec.generate(prompt_token_ids=PROMPTS, sampling_params=p)
    with monkeypatch.context() as m:
        m.setattr(EaglePhases, "_draft_process", lambda self, *a: None)
        raw = spec.generate(prompt_token_ids=PROMPTS, sampling_params=p)
    assert [o.token_ids for o in outs] == [o.token_ids for o in raw]
    steps, raw_steps = (sum(o.stats.spec_steps for o in x) for x in (outs, raw))
    print("steps with the draft processed", steps, "raw", raw_steps)
    assert steps < raw_steps
