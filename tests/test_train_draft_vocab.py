"""train-draft's vocabulary options on the tiny chat target (chat_target.py), and pruning.

  * EAGLE-3 with --draft-vocab equal to the target vocabulary: d2t all zeros, t2d all true, the
    head loads in the engine and greedy speculative output equals vanilla, with and without the
    FR-Spec maps that --token-maps wrote next to it (ranked by response-token frequency, EOS in).
  * --max-num-seqs reaches every engine train-draft builds (data and evaluation).
  * EAGLE-1/2 writes --token-maps too; sizes beyond the vocabulary fail before any work.
  * prune-draft of the trained head to a map == the trained head run with that map: same LM-head
    rows and target ids, same greedy tokens, same verify passes and acceptance histogram.
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
from hotspec.training import pipeline, report
from hotspec.training.config import TrainConfig, TrainConfigError
from hotspec.training.data import load_dataset
from hotspec.training.vocab import response_token_counts

VOCAB = 64
ENGINE = {"num_kv_blocks": 256, "block_size": 16, "max_model_len": 256}
SMALL = ["--num-prompts", "24", "--eval-prompts", "2", "--max-new-tokens", "32", "--lr", "3e-3",
         "--batch-size", "4", "--device", "cpu", "--dtype", "float32", "--kv-cache-memory-gb", "0.01",
         "--no-progress"]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_chat_target(tmp_path_factory.mktemp("train_draft_vocab") / "target")


@pytest.fixture(scope="module")
def full(target: Path) -> tuple[Path, list[dict[str, Any]]]:
    """A full-vocabulary EAGLE-3 head trained through the CLI; the engine options of every LLM
    train-draft built on the way."""
    built: list[dict[str, Any]] = []

    class SpyLLM(LLM):
        def __init__(self, model: str | None = None, **kwargs: Any) -> None:
            built.append(kwargs)
            super().__init__(model, **kwargs)

    out = target.parent / "full"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pipeline, "LLM", SpyLLM)
        mp.setattr(report, "LLM", SpyLLM)
        rc = main(["train-draft", "--model", str(target), "--out", str(out), "--arch", "eagle3",
                   "--draft-vocab", str(VOCAB), "--token-maps", "16", "8", "--max-num-seqs", "3",
                   "--epochs", "12", "--ttt-steps", "2", *SMALL])
    assert rc == 0
    return out, built


def _llm(target: Path, head: Path | None, algorithm: str = "EAGLE3", token_map: Path | None = None) -> LLM:
    spec: dict[str, Any] = {}
    if head is not None:
        spec = dict(speculative_algorithm=algorithm, speculative_draft_model_path=str(head),
                    speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4,
                    speculative_token_map=None if token_map is None else str(token_map))
    return LLM(str(target), dtype="float32", device="cpu", **ENGINE, **spec)


PROMPTS = [[3] + [9 + (7 * i + n) % 50 for i in range(n)] + [EOS, 4] for n in (4, 11, 23)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


def test_full_vocab_head_format(full: tuple[Path, list[dict[str, Any]]]) -> None:
    out, _ = full
    with safe_open(out / "model.safetensors", framework="pt") as f:
        d2t, t2d, lm_head = f.get_tensor("d2t"), f.get_tensor("t2d"), f.get_tensor("lm_head.weight")
    assert d2t.shape == (VOCAB,) and not d2t.any()
    assert t2d.shape == (VOCAB,) and t2d.dtype == torch.bool and t2d.all()
    assert lm_head.shape[0] == VOCAB


def test_max_num_seqs_reaches_every_engine(full: tuple[Path, list[dict[str, Any]]]) -> None:
    _, built = full
    assert len(built) == 2  # data generation, then the tau evaluation
    assert all(kw["max_num_seqs"] == 3 for kw in built)


def test_token_maps_ranked_by_response_frequency(full: tuple[Path, list[dict[str, Any]]]) -> None:
    out, _ = full
    counts = response_token_counts(load_dataset(out / "data"), VOCAB)
    for n in (16, 8):
        ids = torch.load(out / f"freq_{n}.pt", weights_only=True)
        assert isinstance(ids, list) and len(ids) == len(set(ids)) == n and EOS in ids
        ranked = [counts[i] for i in ids if i != EOS]
        assert ranked == sorted(ranked, reverse=True)  # most frequent first
        left_out = [counts[i] for i in range(VOCAB) if i not in ids]
        assert min(ranked) >= max(left_out)  # the most frequent ones (EOS aside)
    top = [[i for i in torch.load(out / f"freq_{n}.pt") if i != EOS] for n in (16, 8)]
    assert top[0][:7] == top[1][:7]  # one ranking, cut at two sizes
    maps = json.loads((out / "train_report.json").read_text())["token_maps"]
    assert [(m["file"], m["size"]) for m in maps] == [("freq_16.pt", 16), ("freq_8.pt", 8)]
    assert 1 >= maps[0]["coverage"] > maps[1]["coverage"] > 0


@pytest.mark.parametrize("map_size", [None, 16, 8])
def test_full_vocab_head_lossless(map_size: int | None, full: tuple[Path, list[dict[str, Any]]],
                                  target: Path) -> None:
    out, _ = full
    vanilla = [o.token_ids for o in _llm(target, None).generate(prompt_token_ids=PROMPTS,
                                                                  sampling_params=PARAMS)]
    token_map = None if map_size is None else out / f"freq_{map_size}.pt"
    llm = _llm(target, out, token_map=token_map)
    assert llm.engine.draft.draft_vocab_size == (map_size or VOCAB)
    outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=PARAMS)
    assert [o.token_ids for o in outs] == vanilla
    if map_size is None:  # the trained head drafts: some drafts are accepted
        assert sum(o.stats.generated_tokens for o in outs) > 1.2 * sum(o.stats.spec_steps + 1 for o in outs)


def test_pruned_head_equals_head_with_map(full: tuple[Path, list[dict[str, Any]]], target: Path,
                                          tmp_path: Path) -> None:
    out, _ = full
    token_map = out / "freq_16.pt"
    pruned = tmp_path / "pruned"
    assert main(["prune-draft", str(out), "--token-map", str(token_map), "--out", str(pruned)]) == 0
    with_map, small = _llm(target, out, token_map=token_map), _llm(target, pruned)
    a, b = with_map.engine.draft, small.engine.draft
    assert b.draft_vocab_size == 16
    assert torch.equal(a.lm_head.weight, b.lm_head.weight)
    assert torch.equal(a.to_target_ids(torch.arange(16)), b.to_target_ids(torch.arange(16)))
    outs_a = with_map.generate(prompt_token_ids=PROMPTS, sampling_params=PARAMS)
    outs_b = small.generate(prompt_token_ids=PROMPTS, sampling_params=PARAMS)
    assert [o.token_ids for o in outs_a] == [o.token_ids for o in outs_b]
    assert [o.stats.spec_steps for o in outs_a] == [o.stats.spec_steps for o in outs_b]
    hist_a = with_map.engine.worker.stats.accept_hist  # type: ignore[attr-defined]
    assert hist_a == small.engine.worker.stats.accept_hist  # type: ignore[attr-defined]
    assert sum(v for k, v in hist_a.items() if k > 1) > 0  # drafts were accepted: a real comparison


def test_eagle_writes_token_maps(target: Path) -> None:
    out = target.parent / "eagle"
    rc = main(["train-draft", "--model", str(target), "--out", str(out), "--arch", "eagle",
               "--token-maps", "12", "--epochs", "1", *SMALL, "--eval-prompts", "0"])
    assert rc == 0
    ids = torch.load(out / "freq_12.pt", weights_only=True)
    assert len(ids) == len(set(ids)) == 12 and EOS in ids


def test_token_map_larger_than_vocab_fails_first(target: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "too_big"
    assert main(["train-draft", "--model", str(target), "--out", str(out), "--token-maps", "8",
                 "100", *SMALL]) == 2
    assert "--token-maps 100: larger than the target vocabulary (64 tokens)" in capsys.readouterr().err
    assert not (out / "data").exists()  # refused before any prompt or response was made
    with pytest.raises(TrainConfigError, match="--token-maps"):
        TrainConfig(out=out, token_maps=(0,))
    with pytest.raises(TrainConfigError, match="--max-num-seqs"):
        TrainConfig(out=out, max_num_seqs=0)


def test_shared_lm_head_head_trains_the_layer_only_and_loads_the_target_head(target: Path) -> None:
    """--share-lm-head: the target's LM head is the head's, frozen; the file holds the layer alone
    (no lm_head, d2t, t2d or draft_vocab_size: loaders take the target's head); it drafts, and the
    output stays vanilla's, with and without an FR-Spec map."""
    out = target.parent / "shared"
    assert main(["train-draft", "--model", str(target), "--out", str(out), "--arch", "eagle3",
                 "--share-lm-head", "--token-maps", "16", "--epochs", "12", "--ttt-steps", "2",
                 *SMALL]) == 0
    with safe_open(out / "model.safetensors", framework="pt") as f:
        keys = set(f.keys())
    assert keys and not keys & {"lm_head.weight", "d2t", "t2d"}
    assert "draft_vocab_size" not in json.loads((out / "config.json").read_text())
    vanilla = [o.token_ids for o in _llm(target, None).generate(prompt_token_ids=PROMPTS,
                                                                  sampling_params=PARAMS)]
    llm = _llm(target, out)
    assert torch.equal(llm.engine.draft.lm_head.weight, llm.engine.target.lm_head.weight)
    outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=PARAMS)
    assert [o.token_ids for o in outs] == vanilla
    assert sum(o.stats.generated_tokens for o in outs) > 1.2 * sum(o.stats.spec_steps + 1 for o in outs)
    mapped = _llm(target, out, token_map=out / "freq_16.pt")
    assert mapped.engine.draft.draft_vocab_size == 16
    outs = mapped.generate(prompt_token_ids=PROMPTS, sampling_params=PARAMS)
    assert [o.token_ids for o in outs] == vanilla


@pytest.mark.parametrize("extra, match", [(["--arch", "eagle"], "for EAGLE-3 heads"),
                                          (["--draft-vocab", "16"], "drop --draft-vocab")])
def test_shared_lm_head_refusals(extra: list[str], match: str, tmp_path: Path) -> None:
    with pytest.raises(TrainConfigError, match=match):
        TrainConfig(out=tmp_path, share_lm_head=True,
                    arch=extra[1] if extra[0] == "--arch" else "eagle3",
                    draft_vocab=int(extra[1]) if extra[0] == "--draft-vocab" else None)
