"""FR-Spec: hot-vocabulary draft heads stay lossless, and every draft buffer is sized from the head."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from hotspec import LLM, SamplingParams
from hotspec.config import ConfigError
from hotspec.models.default_model import default_model_path
from hotspec.models.draft_checkpoint import random_draft_checkpoint
from hotspec.models.loader import load_checkpoint
from hotspec.runtime.graph_runner import GraphRunner
from hotspec.speculative.io import DraftIn, ExtendIn, ExtendOut
from hotspec.speculative.tree import DraftTree

PROMPTS = ["The capital of France is", "def add(a, b):", "Name three fruits:", "Hello"]
N = 10


@pytest.fixture(scope="module")
def target_cfg():
    return load_checkpoint(default_model_path(), torch.float32)[0]


@pytest.fixture(scope="module")
def eagle_head(tmp_path_factory, target_cfg):
    path = random_draft_checkpoint(tmp_path_factory.mktemp("h") / "eagle", target_cfg, "EAGLE", seed=3)
    cfg = json.loads((path / "config.json").read_text())
    assert "hot_vocab_size" not in cfg and "draft_vocab_size" not in cfg  # the seed's bug setup
    return path


@pytest.fixture(scope="module")
def vanilla(smol_llm):
    outs = smol_llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=N))
    return [o.token_ids for o in outs]


def _save_map(tmp_path, ids: list[int], name: str) -> str:
    p = tmp_path / name
    torch.save(ids, p)  # the public format: a plain list of ints
    return str(p)


def _spec(head, token_map, shape=(3, 1, 4), **kw) -> LLM:
    steps, topk, ntok = shape
    return LLM(dtype="float32", device="cpu", kv_cache_memory_gb=0.05, speculative_algorithm="EAGLE",
               speculative_draft_model_path=str(head), speculative_num_steps=steps,
               speculative_eagle_topk=topk, speculative_num_draft_tokens=ntok,
               speculative_token_map=token_map, **kw)


@pytest.mark.parametrize("size,shape", [(1024, (3, 1, 4)), (8192, (5, 4, 8)), (32768, (3, 1, 4))])
def test_greedy_lossless_with_token_maps(size, shape, eagle_head, vanilla, tmp_path, caplog):
    g = torch.Generator().manual_seed(size)
    ids = torch.randperm(49152, generator=g)[:size].tolist()
    path = _save_map(tmp_path, ids, f"freq_{size}.pt")
    with caplog.at_level(logging.INFO, logger="hotspec"):
        llm = _spec(eagle_head, path, shape)
    assert llm.engine.draft.draft_vocab_size == size
    assert f"{size} draft tokens: the FR-Spec map {path}, {size:,} of the target's 49,152)" in caplog.text
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=N))
    assert [o.token_ids for o in outs] == vanilla
    stats = llm.engine.worker.stats
    hot = set(ids)
    served = [t for o in outs for t in o.token_ids[1:]]  # tokens produced by verify passes
    assert stats.served == len(served)
    assert stats.hot_coverage == pytest.approx(sum(t in hot for t in served) / len(served))


def test_greedy_lossless_when_map_excludes_target_tokens(eagle_head, vanilla, tmp_path):
    """The hot set leaves out every token the target actually emits: the draft can never propose
    them, and the output is still exactly the target's."""
    emitted = {t for toks in vanilla for t in toks}
    ids = [t for t in range(49152) if t not in emitted][:2048]
    llm = _spec(eagle_head, _save_map(tmp_path, ids, "adversarial.pt"), (5, 4, 8))
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=N))
    assert [o.token_ids for o in outs] == vanilla
    assert llm.engine.worker.stats.hot_coverage == 0.0
    assert set(llm.engine.worker.stats.accept_hist) == {1}


def test_draft_buffers_sized_from_head_and_static_pass_matches_eager(eagle_head, tmp_path):
    """The seed's regression (SGLang PR #28856): a head whose config names no reduced vocabulary,
    plus a token map. Every draft logits buffer has len(hot_ids) columns, and the draft_extend
    phase run through static buffers (what a CUDA graph replays) matches the eager run."""
    hot = list(range(3000, 3000 + 777))
    # the three phases run separately (not fused into one `step`), so draft_extend is seen alone
    llm = _spec(eagle_head, _save_map(tmp_path, hot, "m.pt"), (3, 2, 5), fuse_spec_step=False)
    worker = llm.engine.worker
    assert llm.engine.draft.lm_head.out_features == len(hot)
    seen: dict[str, dict[str, torch.Tensor]] = {}
    real_run = worker.executor.graphs.run

    def spy(name, inputs, **kw):
        out = real_run(name, inputs, **kw)
        seen[name] = ({k: v.clone() for k, v in inputs.items()}, out)
        return out

    worker.executor.graphs.run = spy
    llm.generate(PROMPTS[:3], SamplingParams(temperature=0, max_tokens=6))
    ext_in, ext_out = seen["draft_extend"]
    assert ext_out["logits"].shape == (3, len(hot))  # written by the 777-row head, nothing else

    # The same phases through static buffers, sized from the inputs' own declarations.
    phases, shapes = worker.phases, worker.phases.shapes
    static = GraphRunner(torch.device("cpu"), "static", [1, 2, 4])
    extend = static.register("draft_extend", phases.draft_extend, lambda bs: ExtendIn.example(shapes, bs),
                             ExtendOut)
    draft = static.register("draft", phases.draft_tree, lambda bs: DraftIn.example(shapes, bs), DraftTree)
    static.capture_all()
    assert "S" in static.report()
    phases.max_kv = shapes.max_blocks_per_seq * worker.executor.block_size  # the static bound
    out = extend.run(ExtendIn.of(ext_in))
    assert out.logits.shape == (3, len(hot))
    for k in ("topk_logp", "feature", "logits"):
        torch.testing.assert_close(getattr(out, k), ext_out[k], rtol=1e-4, atol=1e-4)
    assert torch.equal(out.topk_ids, ext_out["topk_ids"])
    # the draft tree built through static buffers only ever proposes hot tokens
    d_in, _ = seen["draft"]
    tree = draft.run(DraftIn.of(d_in))
    assert set(tree.tokens[:, 1:].flatten().tolist()) <= set(hot)


def test_hot_vocab_size_disagreeing_with_head_is_refused(target_cfg, tmp_path):
    head = random_draft_checkpoint(tmp_path / "h", target_cfg, "EAGLE", seed=0,
                                   extra_config={"hot_vocab_size": 4096})
    with pytest.raises(ConfigError, match="hot_vocab_size=4096"):
        _spec(head, _save_map(tmp_path, list(range(1000)), "m.pt"))


def test_eagle3_token_map_restricts_to_intersection(target_cfg, tmp_path):
    head = random_draft_checkpoint(tmp_path / "h3", target_cfg, "EAGLE3", seed=0, draft_vocab_size=4000)
    d2t_vocab = set((torch.arange(4000) + __import__("safetensors.torch").torch.load_file(
        str(head / "model.safetensors"))["d2t"]).tolist())
    hot = list(range(0, 49152, 3))[:8000]
    llm = LLM(dtype="float32", device="cpu", kv_cache_memory_gb=0.05, speculative_algorithm="EAGLE3",
              speculative_draft_model_path=str(head), speculative_token_map=_save_map(tmp_path, hot, "m.pt"))
    d = llm.engine.draft
    inter = d2t_vocab & set(hot)
    assert d.draft_vocab_size == len(inter)
    assert set(d.to_target_ids(torch.arange(d.draft_vocab_size)).tolist()) == inter
