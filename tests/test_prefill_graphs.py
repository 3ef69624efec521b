"""Prefill by token bucket (runtime/prefill.py), on the CPU through the static buffers a CUDA graph
replays: outputs equal the eager engine's, with prompts longer than the largest bucket (they
prefill in chunks) and more requests than a graphed step holds; the padded layout gives every
token to a row."""

from __future__ import annotations

import pytest
import torch
from engine_utils import tiny_target_and_head

from hotspec import LLM, SamplingParams
from hotspec.config import ConfigError, EngineConfig
from hotspec.core.request import Request
from hotspec.engine.builder import EngineBuilder
from hotspec.runtime.graph_runner import GraphRunner
from hotspec.runtime.prefill import prefill_rows, token_buckets


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_target_and_head(tmp_path_factory.mktemp("tiny"), layers=3)


def test_token_buckets():
    assert token_buckets(2048) == [16, 32, 64, 128, 256, 512, 1024, 2048]
    assert token_buckets(100) == [16, 32, 64, 100]
    assert token_buckets(8) == [8] and token_buckets(0) == []
    with pytest.raises(ConfigError, match="cuda_graph_prefill_tokens"):
        EngineConfig(cuda_graph_prefill_tokens=-1)


def test_padded_layout_gives_every_token_a_row():
    """Two requests (3 and 2 tokens, the second after 4 committed ones) in a bucket of 8 with 3
    request rows: the 3 padding tokens are the padding row's, at positions 0.. of the null block,
    writing the trash slot; the rows after it hold nothing."""
    a, b = Request(0, [5, 6, 7], SamplingParams(), 0), Request(1, [1] * 6, SamplingParams(), 0)
    a.blocks, b.blocks, b.seq_len = [3], [4, 9], 4
    x = prefill_rows([a, b], [[5, 6, 7], [1, 1]], 4, 8, 3, 5, trash=99)
    assert x.input_ids.tolist() == [5, 6, 7, 1, 1, 0, 0, 0]
    assert x.positions.tolist() == [0, 1, 2, 4, 5, 0, 1, 2]
    assert x.out_cache_loc.tolist() == [12, 13, 14, 36, 37, 99, 99, 99]
    assert x.q_lens.tolist() == [3, 2, 3, 0] and x.kv_lens.tolist() == [3, 6, 3, 0]
    assert x.cu_seqlens_q.tolist() == [0, 3, 5, 8, 8]
    assert x.last.tolist() == [2, 4, 7, 0]
    assert int(x.q_lens.sum()) == x.input_ids.shape[0]
    assert x.block_tables[:2, :2].tolist() == [[3, 0], [4, 9]] and not x.block_tables[2:].any()


@pytest.mark.parametrize("spec", [False, True], ids=["vanilla", "eagle3"])
def test_graphed_prefill_equals_eager(spec, tiny, monkeypatch):
    target, head = tiny
    kw = dict(model=str(target), dtype="float32", device="cpu", skip_tokenizer_init=True,
              num_kv_blocks=256, block_size=4, max_model_len=128, max_num_seqs=3)
    if spec:
        kw.update(speculative_algorithm="EAGLE3", speculative_draft_model_path=str(head),
                  speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 96, (n,), generator=g).tolist() for n in (5, 70, 17, 2, 33)]
    params = [SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
              SamplingParams(temperature=0.9, seed=3, max_tokens=10, ignore_eos=True)]
    eager = LLM(**kw)
    assert eager.engine.worker.prefill_limits() is None
    want = [[o.token_ids for o in eager.generate(prompt_token_ids=prompts, sampling_params=p)]
            for p in params]
    monkeypatch.setattr(EngineBuilder, "_graph_runner",
                        lambda self: GraphRunner(self.device, "static", [1, 2, 4]))
    capped = LLM(**kw)  # the default buckets stop at the context, 128
    assert capped.engine.worker.prefill_limits() == (128, 3)
    del capped
    llm = LLM(**kw, cuda_graph_prefill_tokens=32)
    assert llm.engine.worker.prefill_limits() == (32, 3)
    report = llm.engine.graphs.report()
    rows = {line.split()[0]: line.split()[1:] for line in report.splitlines()}
    assert rows["prefill"] == ["tokens", "16:S", "32:S"]
    assert rows.get("prefill_draft") == (["tokens", "16:S", "32:S"] if spec else None)
    seen: list[int] = []
    run_bucket = llm.engine.graphs.run_bucket

    def spy(name, inputs):
        seen.append(inputs["input_ids"].shape[0])
        return run_bucket(name, inputs)

    monkeypatch.setattr(llm.engine.graphs, "run_bucket", spy)
    for p, w in zip(params, want):
        assert [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=p)] == w
    assert set(seen) <= {16, 32} and len(seen) >= 6  # the 70-token prompt: three chunks at least
    assert llm.engine.allocator.num_free == llm.engine.allocator.num_blocks


def test_catch_up_replays_the_draft_prefill_graphs(tiny, monkeypatch):
    """The adaptive engine's catch-up after plain decode steps runs through the draft's prefill
    graphs (static buffers on the CPU), in groups of at most the graphs' rows: no eager pass, so
    no kernel specialises on a catch-up's lengths mid-serving. Greedy outputs stay the target's,
    with more requests than a graphed step holds."""
    from test_adaptive_engine import Cycle

    target, head = tiny
    kw = dict(model=str(target), dtype="float32", device="cpu", skip_tokenizer_init=True,
              num_kv_blocks=256, block_size=4, max_model_len=128, max_num_seqs=5)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 96, (n,), generator=g).tolist() for n in (5, 40, 17, 2, 9)]
    p = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    want = [o.token_ids for o in LLM(**kw).generate(prompt_token_ids=prompts, sampling_params=p)]
    monkeypatch.setattr(EngineBuilder, "_graph_runner",
                        lambda self: GraphRunner(self.device, "static", [1, 2, 4, 8]))
    llm = LLM(**kw, cuda_graph_prefill_tokens=32,
              speculative_algorithm="EAGLE3", speculative_draft_model_path=str(head),
              speculative_adaptive=True, speculative_candidates=("off", "3/1/4"))
    worker = llm.engine.worker
    assert worker.prefill_limits() == (32, 5)
    worker.policy = Cycle("3/1/4", 8)
    runs: list[tuple[str, int]] = []
    run_bucket = llm.engine.graphs.run_bucket

    def spy(name, inputs):
        runs.append((name, int(inputs["q_lens"][:-1].gt(0).sum())))
        return run_bucket(name, inputs)

    monkeypatch.setattr(llm.engine.graphs, "run_bucket", spy)
    calls = worker.stats.phase_calls["catch_up"]
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=p)
    assert [o.token_ids for o in outs] == want
    assert worker.stats.phase_calls["catch_up"] - calls >= 2
    assert worker.catch_up.eager_passes == 0
    catch_up_runs = sum(name == "prefill_draft" for name, _ in runs) - \
        sum(name == "prefill" for name, _ in runs)  # (a draft prefill follows each target's)
    assert catch_up_runs > worker.stats.phase_calls["catch_up"] - calls  # some in two groups
