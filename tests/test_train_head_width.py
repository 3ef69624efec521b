"""train-draft --intermediate-size: a head with a wider MLP than the target's (chat_target.py, whose
intermediate_size is 128), on the tiny target in a few CPU seconds.

  * Through the CLI: config.json and train_report.json carry the width, model.safetensors holds
    MLP weights of that width, the engine loads the head as it is and greedy speculative output
    equals vanilla greedy.
  * --resume refuses a checkpoint of another width (and continues one of the same resolved width).
  * A width < 1 is a TrainConfigError naming --intermediate-size, before any work.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from chat_target import EOS, save_chat_target
from safetensors import safe_open

from hotspec import LLM, SamplingParams
from hotspec.cli.main import main
from hotspec.models.eagle3 import Eagle3Head
from hotspec.training.config import TrainConfig, TrainConfigError
from hotspec.training.pipeline import run_train_draft

TARGET_WIDTH, WIDE, HIDDEN = 128, 192, 64  # chat_target.py's intermediate and hidden sizes
ENGINE = {"num_kv_blocks": 256, "block_size": 16, "max_model_len": 256}
SMALL = ["--num-prompts", "8", "--eval-prompts", "2", "--max-new-tokens", "16", "--epochs", "1",
         "--ttt-steps", "2", "--lr", "3e-3", "--batch-size", "4", "--device", "cpu",
         "--dtype", "float32", "--kv-cache-memory-gb", "0.01", "--no-progress"]
PROMPTS = [[3] + [9 + (7 * i + n) % 50 for i in range(n)] + [EOS, 4] for n in (4, 11, 23)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_chat_target(tmp_path_factory.mktemp("train_head_width") / "target")


@pytest.fixture(scope="module")
def wide(target: Path) -> Path:
    """An EAGLE-3 head with a WIDE MLP, trained through the CLI."""
    out = target.parent / "wide"
    rc = main(["train-draft", "--model", str(target), "--out", str(out), "--arch", "eagle3",
               "--draft-vocab", "40", "--intermediate-size", str(WIDE), *SMALL])
    assert rc == 0
    return out


def _config(target: Path, out: Path, **kw: Any) -> TrainConfig:
    base: dict[str, Any] = dict(out=out, model=str(target), arch="eagle3", draft_vocab=40,
                                num_prompts=8, eval_prompts=0, max_new_tokens=16, epochs=1,
                                ttt_steps=2, batch_size=2, dtype="float32", device="cpu",
                                progress=False, engine_kwargs=ENGINE)
    base.update(kw)
    return TrainConfig(**base)


def test_wide_head_files(wide: Path) -> None:
    config = json.loads((wide / "config.json").read_text())
    assert config["intermediate_size"] == WIDE and config["hidden_size"] == HIDDEN
    with safe_open(wide / "model.safetensors", framework="pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert shapes["midlayer.mlp.gate_proj.weight"] == (WIDE, HIDDEN)
    assert shapes["midlayer.mlp.up_proj.weight"] == (WIDE, HIDDEN)
    assert shapes["midlayer.mlp.down_proj.weight"] == (HIDDEN, WIDE)
    report = json.loads((wide / "train_report.json").read_text())
    assert report["intermediate_size"] == WIDE
    assert report["config"]["intermediate_size"] == WIDE
    assert f"--intermediate-size {WIDE}" in report["command"]


def test_wide_head_lossless_in_engine(wide: Path, target: Path) -> None:
    vanilla = LLM(str(target), dtype="float32", device="cpu", **ENGINE)
    expected = [o.token_ids for o in vanilla.generate(prompt_token_ids=PROMPTS, sampling_params=PARAMS)]
    spec = LLM(str(target), dtype="float32", device="cpu", **ENGINE, speculative_algorithm="EAGLE3",
               speculative_draft_model_path=str(wide), speculative_num_steps=3,
               speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    head = spec.engine.draft
    assert isinstance(head, Eagle3Head)
    assert head.midlayer.mlp.down_proj.weight.shape == (HIDDEN, WIDE)  # loaded as trained
    outs = spec.generate(prompt_token_ids=PROMPTS, sampling_params=PARAMS)
    assert [o.token_ids for o in outs] == expected
    assert all(o.stats.spec_steps > 0 for o in outs)  # the head did draft


def test_resume_refuses_another_width(target: Path) -> None:
    out = target.parent / "resume_width"
    assert run_train_draft(_config(target, out, halt_after=1)) == {"halted": 1}  # target's width
    with pytest.raises(TrainConfigError, match="intermediate_size"):
        run_train_draft(_config(target, out, resume=True, intermediate_size=WIDE, halt_after=2))
    # The target's width spelled out is the same head: the run continues.
    resumed = _config(target, out, resume=True, intermediate_size=TARGET_WIDTH, halt_after=2)
    assert run_train_draft(resumed) == {"halted": 2}
    ckpt = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["step"] == 2 and ckpt["trainable"]["midlayer.mlp.gate_proj.weight"].shape[0] == TARGET_WIDTH


@pytest.mark.parametrize("bad", [0, -3])
def test_bad_width_is_refused(bad: int, target: Path, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(TrainConfigError, match="--intermediate-size"):
        _config(target, tmp_path / "x", intermediate_size=bad)
    rc = main(["train-draft", "--model", str(target), "--out", str(tmp_path / "y"),
               "--intermediate-size", str(bad), *SMALL])
    assert rc == 2 and "--intermediate-size must be a positive integer" in capsys.readouterr().err
    assert not (tmp_path / "y").exists()  # refused before any work
