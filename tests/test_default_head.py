"""The default model's shipped draft head (default_model.DEFAULT_DRAFT_HEAD).

With no model and no draft path, a speculative engine loads the shipped head and says so; a
missing head folder, or a non-default model without a draft path, is a clear error. Fast tests
stand a tiny Llama in for the default model and a random EAGLE-3 head in for the asset; the
last test runs the real SmolLM2 with the real head once it is shipped.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from engine_utils import save_tiny_llama

from hotspec import LLM, SamplingParams
from hotspec.config import ConfigError, EngineConfig
from hotspec.errors import ModelLoadError
from hotspec.models import default_model, loader
from hotspec.models.draft_checkpoint import random_draft_checkpoint
from hotspec.models.loader import load_checkpoint

VOCAB = 96
ENGINE = {"dtype": "float32", "device": "cpu", "num_kv_blocks": 64, "max_model_len": 128,
          "skip_tokenizer_init": True}
PROMPTS = [[5, 17, 3, 40], [9] * 11, list(range(20, 45))]
PARAMS = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a tiny target, a random EAGLE-3 head with its own 64-id draft vocabulary for it)."""
    root = tmp_path_factory.mktemp("default_head")
    target = save_tiny_llama(root / "target", vocab=VOCAB, hidden=64, layers=4, std=0.2)
    cfg = load_checkpoint(target, torch.float32)[0]
    head = random_draft_checkpoint(root / "asset", cfg, "EAGLE3", seed=2, draft_vocab_size=64, scale=0.2)
    return target, head


@pytest.fixture
def as_default(tiny: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tiny target is the default model and its random head the shipped one."""
    target, head = tiny
    monkeypatch.setattr(loader, "default_model_path", lambda: target)
    monkeypatch.setattr(default_model, "default_model_path", lambda: target)
    monkeypatch.setattr(default_model, "DEFAULT_DRAFT_HEAD", head)
    return head


@pytest.mark.parametrize("algorithm", ["EAGLE3", "EAGLE"])
def test_default_model_uses_the_shipped_head(algorithm: str, as_default: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    vanilla = [o.token_ids for o in LLM(**ENGINE).generate(prompt_token_ids=PROMPTS, sampling_params=PARAMS)]
    with caplog.at_level(logging.INFO, logger="hotspec"):
        llm = LLM(**ENGINE, speculative_algorithm=algorithm, speculative_num_steps=3,
                  speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    assert f"draft head: {as_default} (EAGLE3, 64 draft tokens: the head's own LM head" in caplog.text
    if algorithm == "EAGLE":  # the shipped head is EAGLE-3; said, not hidden
        assert "built-in draft head is EAGLE3" in caplog.text
    assert llm.engine.draft.draft_vocab_size == 64
    outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=PARAMS)
    assert [o.token_ids for o in outs] == vanilla
    assert all(o.stats.spec_steps > 0 for o in outs)


def test_missing_head_folder_says_so(as_default: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(default_model, "DEFAULT_DRAFT_HEAD", tmp_path / "smollm2-eagle3")
    with pytest.raises(ModelLoadError, match=r"built-in draft head is missing: .*smollm2-eagle3 lacks "
                       r"config\.json, model\.safetensors.*--speculative-draft-model-path"):
        LLM(**ENGINE, speculative_algorithm="EAGLE3")


def test_other_models_still_need_a_draft_path(tiny: tuple[Path, Path]) -> None:
    with pytest.raises(ConfigError, match="needs speculative_draft_model_path.*only the default model"):
        LLM(str(tiny[0]), **ENGINE, speculative_algorithm="EAGLE3")


def test_head_path_is_package_data() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    globs = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"]["hotspec"]
    package = Path(default_model.__file__).resolve().parents[1]
    rel = default_model.DEFAULT_DRAFT_HEAD.relative_to(package).as_posix()
    assert {f"{rel}/*.json", f"{rel}/*.safetensors"} <= set(globs)


@pytest.mark.slow
@pytest.mark.skipif(not (default_model.DEFAULT_DRAFT_HEAD / "model.safetensors").is_file(),
                    reason="the default draft head is not shipped yet (hotspec/assets/smollm2-eagle3)")
def test_shipped_head_on_smollm2() -> None:
    from hotspec.benchmark.spec_bench import load_target, run_with_engine
    from hotspec.config import EngineConfig

    cfg = EngineConfig(dtype="float32", device="cpu", num_kv_blocks=64, max_model_len=512)
    target = load_target(cfg)
    tok = target.tokenizer
    asks = ["Write a short poem about the sea.", "Write a Python function that reverses a string.",
            "Translate into French: The weather is nice today and we are going to the beach.",
            "Explain in a few sentences why the sky is blue."]
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": a}], tokenize=False,
                                                  add_generation_prompt=True), add_special_tokens=False)
               for a in asks]
    params = SamplingParams(temperature=0.0, max_tokens=48)

    def run(engine):  # type: ignore[no-untyped-def]
        reqs = [engine.add_request(list(ids), params) for ids in prompts]
        while engine.has_unfinished():
            engine.step()
        return reqs

    vanilla = run_with_engine(cfg, target, run)
    # a pinned shape: the adaptive default picks shapes (plain decoding too) from step timings,
    # which a loaded machine skews
    spec = run_with_engine(replace(cfg, speculative_algorithm="EAGLE3", speculative_num_steps=3,
                                   speculative_eagle_topk=1, speculative_num_draft_tokens=4),
                           target, run)
    assert [r.output_token_ids for r in spec] == [r.output_token_ids for r in vanilla]
    taus = [r.stats.tau for r in spec]
    assert sum(taus) / len(taus) > 1.3, taus  # a trained head drafts (an untrained one: tau ~1)


def test_generate_and_serve_speculate_with_the_shipped_head_by_default(
        tiny: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """`hotspec generate` and `hotspec serve` with no model (or the default model's own path) and
    no speculative option run the default model with its shipped head; shape flags alone shape
    that head's speculation; --no-default-head, another model or a chosen algorithm are left
    alone; without the head a warning says so and the engine runs without speculation."""
    from hotspec.cli.engine_args import engine_config
    from hotspec.cli.main import build_parser

    target, head = tiny
    monkeypatch.setattr(default_model, "default_model_path", lambda: target)
    monkeypatch.setattr(default_model, "DEFAULT_DRAFT_HEAD", head)

    def config(*words: str) -> EngineConfig:
        args = build_parser().parse_args(list(words))
        return engine_config(args, args.default_head)

    shape = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", "4"]
    for command in ("generate", "serve"):
        words = [command, "hi"] if command == "generate" else [command]
        for model in ([], ["--model", str(target)]):
            cfg = config(*words, *model)
            assert (cfg.speculative_algorithm, cfg.speculative_draft_model_path) == ("EAGLE3", str(head))
        cfg = config(*words, *shape)
        assert (cfg.speculative_algorithm, cfg.spec_shape.label, cfg.adaptive) == ("EAGLE3", "3/1/4", False)
        assert config(*words, "--no-default-head").speculative_algorithm is None
        with pytest.raises(ConfigError, match="given without speculative_algorithm"):
            config(*words, "--no-default-head", *shape)
        assert config(*words, "--model", str(tmp_path)).speculative_algorithm is None
        chosen = config(*words, "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "h")
        assert chosen.speculative_draft_model_path == "h"
    monkeypatch.setattr(default_model, "DEFAULT_DRAFT_HEAD", tmp_path / "missing")
    with caplog.at_level(logging.WARNING, logger="hotspec"):
        cfg = config("generate", "hi")
    assert cfg.speculative_algorithm is None
    assert "running WITHOUT speculative decoding" in caplog.text and "missing" in caplog.text


def test_the_default_models_path_gets_the_shipped_head(as_default: Path, tiny: tuple[Path, Path],
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """`LLM(model=<the default model's path>, speculative_algorithm=...)` is `LLM(speculative_
    algorithm=...)`: the shipped head, not "needs speculative_draft_model_path"."""
    with caplog.at_level(logging.INFO, logger="hotspec"):
        llm = LLM(str(tiny[0]), **ENGINE, speculative_algorithm="EAGLE3")
    assert f"draft head: {as_default} (EAGLE3, 64 draft tokens: the head's own LM head" in caplog.text
    outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=PARAMS)
    assert all(o.stats.spec_steps > 0 for o in outs)


def test_is_default_model(default_gguf: Path, tmp_path: Path) -> None:
    assert default_model.is_default_model(None)
    assert default_model.is_default_model(str(default_gguf))
    link = tmp_path / "link.gguf"
    link.symlink_to(default_gguf)
    assert default_model.is_default_model(str(link))  # the same file by another name
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF")
    assert not default_model.is_default_model(str(other))
    assert not default_model.is_default_model(str(tmp_path / "nothing.gguf"))
