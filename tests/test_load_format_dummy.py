"""--load-format dummy: an engine from a checkpoint's config alone (random weights of its shapes),
and the option's errors."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from hotspec.config import ConfigError, EngineConfig
from hotspec.engine.engine import Engine
from hotspec.errors import ModelLoadError
from hotspec.sampling_params import SamplingParams

TINY = {"model_type": "qwen2", "vocab_size": 96, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 256, "tie_word_embeddings": True, "eos_token_id": 1}


def _engine(path: Path, **kw: object) -> Engine:
    return Engine(EngineConfig(model=str(path), dtype="float32", device="cpu",  # type: ignore[arg-type]
                               skip_tokenizer_init=True, num_kv_blocks=16, max_num_seqs=2, **kw))


def test_dummy_runs_a_model_from_its_config_alone(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY))  # no weights in the folder
    with caplog.at_level(logging.WARNING, logger="hotspec"):
        engine = _engine(tmp_path, load_format="dummy")
    assert "random weights" in caplog.text  # said at start-up, never silent
    cfg = engine.model_config
    assert (cfg.architecture, cfg.vocab_size, cfg.num_hidden_layers, cfg.attention_bias) == (
        "qwen2", 96, 2, True)
    req = engine.add_request([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert len(req.output_token_ids) == 4 and all(0 <= t < 96 for t in req.output_token_ids)
    with pytest.raises(ModelLoadError, match="safetensors"):  # without dummy the folder has no weights
        _engine(tmp_path)


def test_load_format_is_checked() -> None:
    with pytest.raises(ConfigError, match="load_format='random'; choose one of auto, dummy"):
        EngineConfig(load_format="random")
