"""Engine options: SGLang's speculative option names, on the Python API and the command line, and
invalid combinations refused with a message that says what to set."""

from __future__ import annotations

import pytest

from hotspec.cli.main import build_parser, engine_config
from hotspec.config import ConfigError, EngineConfig
from hotspec.core.spec_shape import SpecShape


@pytest.mark.parametrize("kwargs,match", [
    ({"speculative_num_steps": 3}, "without speculative_algorithm"),
    ({"speculative_algorithm": "MEDUSA"}, "EAGLE"),
    ({"speculative_algorithm": "EAGLE", "speculative_num_steps": 0}, "num_steps must be >= 1"),
    ({"speculative_algorithm": "EAGLE", "speculative_eagle_topk": 0}, "topk must be >= 1"),
    ({"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
      "speculative_num_draft_tokens": 8}, "speculative_num_draft_tokens=4"),
    ({"speculative_algorithm": "EAGLE", "speculative_num_steps": 2, "speculative_eagle_topk": 2,
      "speculative_num_draft_tokens": 20}, r"must be in \[2, 7\]"),
    ({"dtype": "int8"}, "dtype"),
    ({"attention_backend": "flash"}, "attention_backend"),
    ({"block_size": 0}, "block_size"),
    ({"cuda_graph_bs": (0, 8)}, "cuda_graph_bs must list batch sizes >= 1"),
    ({"cuda_graph_bs": ()}, "cuda_graph_bs must list batch sizes >= 1"),
])
def test_invalid_options_are_refused(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        EngineConfig(**kwargs)


def test_unknown_option_is_named():
    with pytest.raises(ConfigError, match="speculative_num_stepz"):
        EngineConfig.from_kwargs(speculative_num_stepz=3)


def test_sglang_defaults_and_cli_names():
    cfg = EngineConfig(speculative_algorithm="EAGLE3", speculative_eagle_topk=4, speculative_num_steps=5)
    assert cfg.spec_shape == SpecShape(5, 4, 8)
    args = build_parser().parse_args([
        "generate", "hi", "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "/h",
        "--speculative-num-steps", "6", "--speculative-eagle-topk", "8",
        "--speculative-num-draft-tokens", "16", "--speculative-token-map", "freq.pt",
        "--allow-eager-fallback", "--dtype", "float32"])
    cfg = engine_config(args)
    assert cfg.allow_eager_fallback is True and cfg.disable_cuda_graph is False
    assert cfg.spec_shape == SpecShape(6, 8, 16)
    assert cfg.speculative_token_map == "freq.pt" and cfg.speculative_draft_model_path == "/h"
    off = engine_config(build_parser().parse_args(["generate", "hi", "--disable-cuda-graph"]))
    assert off.disable_cuda_graph is True and off.allow_eager_fallback is False


def test_cuda_graph_batch_sizes_from_the_command_line_reach_the_graph_runner(tmp_path):
    """--cuda-graph-bs 8 1 32: exactly those sizes, sorted, are the graph runner's (a batch of 5
    replays 8); unset, the default ladder up to --cuda-graph-max-bs."""
    from engine_utils import save_tiny_llama

    from hotspec.engine.engine import Engine

    cfg = engine_config(build_parser().parse_args(["generate", "hi", "--cuda-graph-bs", "8", "1", "32"]))
    assert cfg.cuda_graph_bs == (1, 8, 32)
    assert EngineConfig(cuda_graph_bs=[4, 2, 4]).cuda_graph_bs == (2, 4)
    save_tiny_llama(tmp_path / "m", vocab=64, hidden=64, layers=1, std=0.2)
    for sizes, want in (((8, 1, 32), [1, 8, 32]), (None, [1, 2, 4, 8, 16])):
        engine = Engine(EngineConfig(model=str(tmp_path / "m"), dtype="float32", device="cpu",
                                     skip_tokenizer_init=True, num_kv_blocks=16, max_num_seqs=16,
                                     cuda_graph_bs=sizes))
        assert engine.graphs.batch_sizes == want


def test_adaptive_shape_is_the_default_when_no_shape_is_given():
    """No --speculative-num-steps/-eagle-topk/-num-draft-tokens: the engine chooses the shape;
    any of them pins it; the flag decides when given; profiled phases and the unfused step (one
    shape's phase graphs) keep the pinned shape; no speculation, no policy."""
    assert EngineConfig(speculative_algorithm="EAGLE3").adaptive
    assert not EngineConfig(speculative_algorithm="EAGLE3", speculative_num_steps=5).adaptive
    assert not EngineConfig(speculative_algorithm="EAGLE3", speculative_eagle_topk=8).adaptive
    assert EngineConfig(speculative_algorithm="EAGLE3", speculative_num_steps=5,
                        speculative_adaptive=True).adaptive
    assert not EngineConfig(speculative_algorithm="EAGLE3", speculative_adaptive=False).adaptive
    assert not EngineConfig(speculative_algorithm="EAGLE3", profile_phases=True).adaptive
    assert not EngineConfig(speculative_algorithm="EAGLE3", fuse_spec_step=False).adaptive
    assert not EngineConfig().adaptive
    with pytest.raises(ConfigError, match="at least one speculation shape"):
        EngineConfig(speculative_algorithm="EAGLE3", speculative_candidates=("off",))
