"""Bad input fails loudly and locally: a clear error naming the problem and the fix, and requests
already in the engine finish exactly as if the bad one had never been sent."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_utils import save_tiny_llama, write_gemma_gguf

from hotspec import LLM, SamplingParams
from hotspec.cli.main import main
from hotspec.errors import HotspecError, InvalidRequestError, ModelLoadError

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
SEEDED = SamplingParams(temperature=1.0, top_p=0.9, seed=7, max_tokens=10, ignore_eos=True)
GOOD = [[5, 9, 17, 3, 44], [100, 2, 71]]
VOCAB = 128


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight Llama HF folder (no tokenizer): loads in well under a second."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"), vocab=VOCAB, hidden=32, layers=2,
                           std=0.15)


def _tiny_llm(folder: Path, **kwargs: object) -> LLM:
    options: dict[str, object] = {"num_kv_blocks": 64, "block_size": 4, **kwargs}
    return LLM(model=str(folder), dtype="float32", device="cpu", skip_tokenizer_init=True, **options)


@pytest.fixture(scope="module")
def tiny_llm(tiny_folder: Path) -> LLM:
    return _tiny_llm(tiny_folder, max_model_len=64)


@pytest.fixture(scope="module")
def alone(tiny_llm: LLM) -> list[list[int]]:
    """Each good request's tokens when it runs alone: greedy for the first, seeded sampling for
    the second (its random stream must not depend on what else the engine saw)."""
    return [tiny_llm.generate(prompt_token_ids=[p], sampling_params=sp)[0].token_ids
            for p, sp in zip(GOOD, (GREEDY, SEEDED))]


# ---------------------------------------------------------------- model paths


def test_missing_model_path_names_the_path_and_the_fix() -> None:
    with pytest.raises(ModelLoadError, match=r"model path /nonexistent does not exist\. Fix: pass"):
        LLM(model="/nonexistent")


def test_folder_without_config_json(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ModelLoadError,
                       match=rf"{re.escape(str(tmp_path))} has no config.json and no \.gguf file.*Fix:"):
        LLM(model=str(tmp_path))


def test_gguf_of_an_unsupported_architecture(tmp_path: Path) -> None:
    path = tmp_path / "gemma.gguf"
    write_gemma_gguf(path)
    with pytest.raises(ModelLoadError, match=r"'gemma3'.*not supported.*llama.*qwen3.*Fix: use"):
        LLM(model=str(path))


# ---------------------------------------------------------------- requests


def test_prompt_longer_than_the_context(tiny_llm: LLM) -> None:
    assert tiny_llm.engine.max_model_len == 64
    with pytest.raises(InvalidRequestError,
                       match=r"prompt of 64 tokens does not fit the context of 64 tokens \(at most 63 "
                             r"prompt tokens .*shorten the prompt or raise max_model_len"):
        tiny_llm.generate(prompt_token_ids=[[1] * 64], sampling_params=GREEDY)
    # the longest prompt the message allows is accepted, and ends by length at the context
    (out,) = tiny_llm.generate(prompt_token_ids=[[1] * 63], sampling_params=GREEDY)
    assert out.finish_reason == "length" and len(out.token_ids) == 1


def test_max_model_len_past_the_models_positions_is_refused(tiny_folder: Path) -> None:
    """A context longer than the model's rotary tables is a configuration error, not a silent cap
    (the tiny model's max_position_embeddings is 256)."""
    with pytest.raises(HotspecError, match=r"max_model_len 300 is longer than the model's context, 256 "
                                           r"tokens .*--max-model-len 256 or less"):
        _tiny_llm(tiny_folder, max_model_len=300)


def test_prompt_longer_than_the_kv_cache_names_the_cache(tiny_folder: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="hotspec"):
        llm = _tiny_llm(tiny_folder, num_kv_blocks=None, kv_cache_memory_gb=2e-6)  # a few blocks
    cap = llm.engine.allocator.num_blocks * llm.engine.block_size
    assert llm.engine.max_model_len == cap < 256
    # start-up says so: the cut, and the cache's size
    assert f"context 256 -> {cap} tokens: the KV cache holds {cap} tokens" in caplog.text
    assert f"a request's context: {cap} tokens" in caplog.text
    with pytest.raises(InvalidRequestError, match=r"limited by the KV cache's capacity.*more memory"):
        llm.generate(prompt_token_ids=[[1] * cap], sampling_params=GREEDY)


def test_empty_prompt(tiny_llm: LLM, smol_llm: LLM) -> None:
    with pytest.raises(InvalidRequestError, match="empty prompt: give at least one token"):
        tiny_llm.generate(prompt_token_ids=[[]], sampling_params=GREEDY)
    with pytest.raises(InvalidRequestError, match="empty prompt"):
        smol_llm.generate([""], SamplingParams(max_tokens=2))


def test_token_ids_outside_the_vocabulary(tiny_llm: LLM) -> None:
    with pytest.raises(InvalidRequestError,
                       match=rf"\[{VOCAB}, -1\] are outside the vocabulary \[0, {VOCAB}\)"):
        tiny_llm.generate(prompt_token_ids=[[1, VOCAB, -1]], sampling_params=GREEDY)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_tokens": -1}, r"max_tokens must be an int >= 1, got -1"),
    ({"max_tokens": 0}, r"max_tokens must be an int >= 1, got 0"),
    ({"top_p": 0.0}, r"top_p must be a number in \(0, 1\] \(1 = off\), got 0.0"),
    ({"top_p": 1.5}, r"top_p must be a number in \(0, 1\] \(1 = off\), got 1.5"),
    ({"top_p": -0.1}, r"top_p must be a number in \(0, 1\]"),
    ({"temperature": -0.5}, r"temperature must be a finite number >= 0 \(0 = greedy\), got -0.5"),
    ({"temperature": float("nan")}, r"temperature must be a finite number >= 0"),
])
def test_invalid_sampling_parameters(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(InvalidRequestError, match=r"SamplingParams\." + message) as info:
        SamplingParams(**kwargs)
    assert isinstance(info.value, ValueError) and isinstance(info.value, HotspecError)


# ---------------------------------------------------------------- the other requests are unaffected


@pytest.mark.parametrize("bad", ["empty", "too_long", "outside_vocab"])
def test_bad_request_leaves_running_requests_untouched(tiny_llm: LLM, alone: list[list[int]],
                                                       bad: str) -> None:
    engine = tiny_llm.engine
    reqs = [engine.add_request(p, sp) for p, sp in zip(GOOD, (GREEDY, SEEDED))]
    engine.step()  # both prefilled and running
    assert len(engine.running) == 2
    bad_ids = {"empty": [], "too_long": [3] * 70, "outside_vocab": [1, 2, VOCAB + 5]}[bad]
    with pytest.raises(InvalidRequestError):
        engine.add_request(bad_ids, GREEDY)
    assert len(engine.running) == 2 and not engine.waiting  # nothing was queued
    for _ in tiny_llm.stream_steps():
        pass
    assert [r.output_token_ids for r in reqs] == alone
    assert all(r.finish_reason == "length" for r in reqs)
    assert engine.allocator.num_free == engine.allocator.num_blocks


def test_bad_prompt_in_a_batch_fails_the_call_and_the_engine_goes_on(tiny_llm: LLM,
                                                                      alone: list[list[int]]) -> None:
    engine = tiny_llm.engine
    with pytest.raises(InvalidRequestError, match="empty prompt"):
        tiny_llm.generate(prompt_token_ids=[GOOD[0], [], GOOD[1]], sampling_params=GREEDY)
    assert not engine.has_unfinished()  # the good requests queued before the bad one were aborted
    assert engine.allocator.num_free == engine.allocator.num_blocks
    outs = tiny_llm.generate(prompt_token_ids=GOOD, sampling_params=[GREEDY, SEEDED])
    assert [o.token_ids for o in outs] == alone


# ---------------------------------------------------------------- command line


@pytest.fixture(autouse=True)
def hotspec_logger() -> Iterator[None]:
    """main() points the "hotspec" logger at this test's stderr and stops its propagation: undone
    after each test, so later tests' caplog still sees hotspec's messages."""
    log = logging.getLogger("hotspec")
    saved = log.handlers[:], log.propagate, log.level
    yield
    log.handlers[:], log.propagate = saved[0], saved[1]
    log.setLevel(saved[2])


def test_cli_missing_model_exits_2_with_an_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--model", "/nonexistent", "hi"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: model path /nonexistent does not exist. Fix:")
    assert "Traceback" not in captured.err and captured.out == ""


@pytest.mark.parametrize("options,speculative", [
    ([], True),  # the default model speculates with its shipped head
    (["--no-default-head"], False),
    (["--model", "DEFAULT_GGUF", "--speculative-algorithm", "EAGLE3"], True),  # the same head
])
def test_cli_generates_text_on_the_default_model(options: list[str], speculative: bool,
                                                 capsys: pytest.CaptureFixture[str], smol_llm: LLM,
                                                 default_gguf: Path) -> None:
    options = [str(default_gguf) if o == "DEFAULT_GGUF" else o for o in options]
    assert main(["generate", "--max-tokens", "8", "--dtype", "float32", *options, "Hello"]) == 0
    captured = capsys.readouterr()
    (expected,) = smol_llm.generate(["Hello"], SamplingParams(temperature=0.0, max_tokens=8))
    assert expected.text.strip()
    assert captured.out == expected.text + "\n"  # the CLI's stream is the API's greedy text
    tau = r", tau \d+\.\d\d" if speculative else ""
    assert re.search(rf"\[{len(expected.token_ids)} tokens, finish: {expected.finish_reason}{tau}, "
                     r"\d+\.\d tokens/s\]", captured.err), captured.err
    assert ("draft head: " in captured.err) == speculative
