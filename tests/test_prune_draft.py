"""`hotspec prune-draft` on random EAGLE-3 heads of a tiny Llama: the public format it writes,
exact equality with the source head run with the same token map, and its errors.
(test_train_draft_vocab.py prunes a trained head, where drafts are accepted.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_utils import save_tiny_llama
from safetensors import safe_open
from safetensors.torch import save_file

from hotspec import LLM, SamplingParams
from hotspec.cli.main import main
from hotspec.errors import ModelLoadError
from hotspec.models.draft_checkpoint import random_draft_checkpoint
from hotspec.models.loader import load_checkpoint
from hotspec.training.prune import prune_eagle3_head

VOCAB, DRAFT = 96, 48
ENGINE = {"num_kv_blocks": 64, "block_size": 16, "max_model_len": 128}


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("prune") / "target", vocab=VOCAB, hidden=64,
                           layers=4, std=0.2)


@pytest.fixture(scope="module")
def head(target: Path) -> Path:
    """A random EAGLE-3 head with a 48-id draft vocabulary (d2t) stored in bfloat16."""
    cfg = load_checkpoint(target, torch.float32)[0]
    folder = random_draft_checkpoint(target.parent / "head", cfg, "EAGLE3", seed=1, draft_vocab_size=DRAFT,
                                     scale=0.2)
    path = folder / "model.safetensors"
    with safe_open(path, framework="pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}
    save_file({k: v.bfloat16() if v.is_floating_point() else v for k, v in state.items()}, str(path))
    return folder


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _map(tmp_path: Path, ids: list[int]) -> Path:
    path = tmp_path / "freq.pt"
    torch.save(ids, path)
    return path


HOT = [int(i) for i in torch.randperm(VOCAB, generator=torch.Generator().manual_seed(5))[:40]]


def test_writes_the_intersection_in_public_format(head: Path, tmp_path: Path) -> None:
    src = _tensors(head)
    src_ids = torch.arange(DRAFT) + src["d2t"]
    rows = [d for d in range(DRAFT) if int(src_ids[d]) in HOT]
    assert 0 < len(rows) < DRAFT
    r = prune_eagle3_head(head, _map(tmp_path, HOT), tmp_path / "out")
    assert (r.source_vocab, r.map_size, r.draft_vocab) == (DRAFT, len(HOT), len(rows))
    out = _tensors(tmp_path / "out")
    assert torch.equal(out["lm_head.weight"], src["lm_head.weight"][rows])
    assert out["lm_head.weight"].dtype == torch.bfloat16 and out["d2t"].dtype == src["d2t"].dtype
    kept = torch.arange(len(rows)) + out["d2t"]
    assert torch.equal(kept, src_ids[rows])  # the source's order
    assert out["t2d"].shape == (VOCAB,) and out["t2d"].nonzero().squeeze(1).tolist() == sorted(kept.tolist())
    for k in src.keys() - {"lm_head.weight", "d2t", "t2d"}:
        assert torch.equal(out[k], src[k]), k
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config == {**json.loads((head / "config.json").read_text()), "draft_vocab_size": len(rows)}
    # The ids themselves, in any order, do the same.
    prune_eagle3_head(head, list(reversed(HOT)), tmp_path / "out2")
    assert all(torch.equal(v, _tensors(tmp_path / "out2")[k]) for k, v in out.items())


def _llm(target: Path, head: Path, token_map: Path | None = None, **spec: Any) -> LLM:
    return LLM(str(target), dtype="float32", device="cpu", skip_tokenizer_init=True, **ENGINE,
               speculative_algorithm="EAGLE3",
               speculative_draft_model_path=str(head),
               speculative_token_map=None if token_map is None else str(token_map), **spec)


@pytest.mark.parametrize("shape", [(3, 1, 4), (3, 4, 8)], ids=["chain", "tree"])
def test_pruned_head_runs_like_the_source_with_the_map(shape: tuple[int, int, int], head: Path,
                                                       target: Path, tmp_path: Path) -> None:
    token_map = _map(tmp_path, HOT)
    assert main(["prune-draft", str(head), "--token-map", str(token_map), "--out", str(tmp_path / "p")]) == 0
    steps, topk, ntok = shape
    spec = dict(speculative_num_steps=steps, speculative_eagle_topk=topk, speculative_num_draft_tokens=ntok)
    a, b = _llm(target, head, token_map, **spec), _llm(target, tmp_path / "p", **spec)
    da, db = a.engine.draft, b.engine.draft
    assert torch.equal(da.lm_head.weight, db.lm_head.weight)
    n = db.draft_vocab_size
    assert torch.equal(da.to_target_ids(torch.arange(n)), db.to_target_ids(torch.arange(n)))
    prompts = [[int(t) for t in torch.randint(0, VOCAB, (k,), generator=torch.Generator().manual_seed(k))]
               for k in (3, 9, 20)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    oa = a.generate(prompt_token_ids=prompts, sampling_params=params)
    ob = b.generate(prompt_token_ids=prompts, sampling_params=params)
    assert [o.token_ids for o in oa] == [o.token_ids for o in ob]
    assert [o.stats.spec_steps for o in oa] == [o.stats.spec_steps for o in ob]
    assert a.engine.worker.spec_stats == b.engine.worker.spec_stats


def test_refuses_non_eagle3_heads(target: Path, tmp_path: Path) -> None:
    cfg = load_checkpoint(target, torch.float32)[0]
    eagle = random_draft_checkpoint(tmp_path / "eagle", cfg, "EAGLE")
    with pytest.raises(ModelLoadError, match="EAGLE-1/2 head.*--speculative-token-map"):
        prune_eagle3_head(eagle, HOT, tmp_path / "out")
    shared = random_draft_checkpoint(tmp_path / "shared", cfg, "EAGLE3")  # the target's LM head
    with pytest.raises(ModelLoadError, match="no lm_head.weight"):
        prune_eagle3_head(shared, HOT, tmp_path / "out")


def test_refuses_bad_maps(head: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = _map(tmp_path, [3, 5, VOCAB + 4])
    assert main(["prune-draft", str(head), "--token-map", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert f"outside the target vocabulary [0, {VOCAB}): [{VOCAB + 4}]" in capsys.readouterr().err
    vocab = (torch.arange(DRAFT) + _tensors(head)["d2t"]).tolist()
    with pytest.raises(ModelLoadError, match="shares no token with the draft vocabulary"):
        prune_eagle3_head(head, [i for i in range(VOCAB) if i not in vocab], tmp_path / "o")
    with pytest.raises(ModelLoadError, match="repeats token ids"):
        prune_eagle3_head(head, [vocab[0], vocab[0]], tmp_path / "o")
    with pytest.raises(ModelLoadError, match="is the source folder"):
        prune_eagle3_head(head, HOT, head)
    assert not (tmp_path / "o").exists()
