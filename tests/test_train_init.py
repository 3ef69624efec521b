"""train-draft --init DIR: fine-tuning starts from a trained head instead of random weights, on the
tiny target (chat_target.py) in a few CPU seconds.

  * The head's shape comes from DIR: a wide MLP and an own 40-row LM head (its d2t, row order
    included) are kept; with a vanishing learning rate the exported head is DIR's head.
  * Training goes on from where DIR's left off: the first step's loss is the trained head's, far
    below a fresh head's, and the fine-tuned head drafts losslessly in the engine.
  * A head proposing from the target's LM head stays one (nothing of it exported).
  * A time-boxed fine-tuning run continues with the same command and --resume; another --init
    is refused there.
  * Options that would set the shape again, --share-lm-head on a head with its own LM head and a
    head of the other architecture are refused with a message naming the fix.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from chat_target import EOS, save_chat_target
from safetensors.torch import load_file

from hotspec import LLM, SamplingParams
from hotspec.cli.main import main
from hotspec.errors import HotspecError
from hotspec.training.config import TrainConfig, TrainConfigError
from hotspec.training.pipeline import run_train_draft

WIDE = 192  # chat_target.py's intermediate_size is 128
ENGINE = {"num_kv_blocks": 256, "block_size": 16, "max_model_len": 256}
SMALL = ["--num-prompts", "8", "--eval-prompts", "2", "--max-new-tokens", "16", "--epochs", "1",
         "--ttt-steps", "2", "--batch-size", "4", "--device", "cpu", "--dtype", "float32",
         "--kv-cache-memory-gb", "0.01", "--no-progress"]
PROMPTS = [[3] + [9 + (7 * i + n) % 50 for i in range(n)] + [EOS, 4] for n in (4, 11, 23)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_chat_target(tmp_path_factory.mktemp("train_init") / "target")


def _train(target: Path, out: Path, *extra: str) -> Path:
    rc = main(["train-draft", "--model", str(target), "--out", str(out), *SMALL, *extra])
    assert rc == 0
    return out


@pytest.fixture(scope="module")
def trained(target: Path) -> Path:
    """An EAGLE-3 head with a wide MLP and its own 40-row LM head, trained for 3 epochs."""
    return _train(target, target.parent / "trained", "--arch", "eagle3", "--draft-vocab", "40",
                  "--intermediate-size", str(WIDE), "--lr", "3e-3", "--epochs", "3")


def _losses(out: Path) -> list[float]:
    import json

    return json.loads((out / "train_report.json").read_text())["training"]["loss"]


def test_the_head_starts_as_trained(trained: Path, target: Path) -> None:
    out = _train(target, target.parent / "still", "--init", str(trained), "--lr", "1e-12")
    before, after = load_file(trained / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(before) == set(after) and "d2t" in after and "lm_head.weight" in after
    assert torch.equal(before["d2t"], after["d2t"])  # the vocabulary, row order included
    assert after["midlayer.mlp.gate_proj.weight"].shape[0] == WIDE
    for k in before:
        torch.testing.assert_close(after[k], before[k], rtol=0, atol=1e-6)
    fresh = _train(target, target.parent / "fresh", "--arch", "eagle3", "--draft-vocab", "40",
                   "--intermediate-size", str(WIDE), "--lr", "1e-12")
    far = load_file(fresh / "model.safetensors")["midlayer.mlp.gate_proj.weight"]
    assert not torch.allclose(far, before["midlayer.mlp.gate_proj.weight"], atol=1e-3)


def test_fine_tuning_goes_on_from_the_trained_loss(trained: Path, target: Path) -> None:
    out = _train(target, target.parent / "tuned", "--init", str(trained), "--lr", "1e-3")
    fresh = _train(target, target.parent / "fresh_tuned", "--arch", "eagle3", "--draft-vocab", "40",
                   "--intermediate-size", str(WIDE), "--lr", "1e-3")
    first_tuned, first_fresh = _losses(out)[0], _losses(fresh)[0]
    assert first_tuned < 0.8 * first_fresh
    assert first_tuned <= _losses(trained)[0]  # where the trained run ended, not where it began
    vanilla = LLM(str(target), dtype="float32", device="cpu", **ENGINE)
    expected = [o.token_ids for o in vanilla.generate(prompt_token_ids=PROMPTS, sampling_params=PARAMS)]
    spec = LLM(str(target), dtype="float32", device="cpu", **ENGINE, speculative_algorithm="EAGLE3",
               speculative_draft_model_path=str(out), speculative_num_steps=3,
               speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    outs = spec.generate(prompt_token_ids=PROMPTS, sampling_params=PARAMS)
    assert [o.token_ids for o in outs] == expected
    assert all(o.stats.spec_steps > 0 for o in outs)


def test_a_shared_lm_head_stays_shared(target: Path) -> None:
    shared = _train(target, target.parent / "shared", "--arch", "eagle3", "--share-lm-head",
                    "--lr", "3e-3")
    out = _train(target, target.parent / "shared_tuned", "--init", str(shared), "--lr", "1e-3")
    state = load_file(out / "model.safetensors")
    assert "lm_head.weight" not in state and "d2t" not in state
    assert set(state) == set(load_file(shared / "model.safetensors"))


def _config(target: Path, out: Path, **kw: Any) -> TrainConfig:
    base: dict[str, Any] = dict(out=out, model=str(target), arch="eagle3", num_prompts=8,
                                eval_prompts=0, max_new_tokens=16, epochs=1, ttt_steps=2,
                                batch_size=2, dtype="float32", device="cpu", progress=False,
                                engine_kwargs=ENGINE)
    base.update(kw)
    return TrainConfig(**base)


def test_a_halted_fine_tuning_run_resumes(trained: Path, target: Path, tmp_path: Path) -> None:
    out = tmp_path / "boxed"
    assert run_train_draft(_config(target, out, init=trained, halt_after=1)) == {"halted": 1}
    assert run_train_draft(_config(target, out, init=trained, resume=True, halt_after=2)) == {"halted": 2}
    ckpt = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["step"] == 2 and ckpt["meta"]["init"] == str(trained)
    other = shutil.copytree(trained, tmp_path / "another")  # the same weights, another --init
    with pytest.raises(TrainConfigError, match="--resume"):
        run_train_draft(_config(target, out, init=other, resume=True))


def test_refusals_name_the_fix(trained: Path, target: Path, tmp_path: Path) -> None:
    with pytest.raises(TrainConfigError, match="drop --draft-vocab"):
        _config(target, tmp_path / "a", init=trained, draft_vocab=40)
    with pytest.raises(TrainConfigError, match="drop --intermediate-size"):
        _config(target, tmp_path / "b", init=trained, intermediate_size=WIDE)
    with pytest.raises(TrainConfigError, match="drop --share-lm-head"):
        run_train_draft(_config(target, tmp_path / "d", init=trained, share_lm_head=True))
    with pytest.raises(HotspecError, match="EAGLE-3"):
        run_train_draft(_config(target, tmp_path / "e", init=trained, arch="eagle"))
    with pytest.raises(HotspecError, match="is not a folder"):
        run_train_draft(_config(target, tmp_path / "f", init=tmp_path / "nowhere"))
