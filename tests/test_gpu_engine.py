"""On the GPU: graphed EAGLE (chain and tree, FR-Spec on and off) equals the engine's own graphed
vanilla decoding on SmolLM2 in float32, and start-up reports every phase graphed."""

from __future__ import annotations

import pytest
import torch

from hotspec import LLM, SamplingParams
from hotspec.models.default_model import default_model_path
from hotspec.models.draft_checkpoint import random_draft_checkpoint
from hotspec.models.loader import load_checkpoint

pytestmark = pytest.mark.gpu

PROMPTS = ["The capital of France is", "def quicksort(arr):", "List three colours:", "Hi",
           "Write a haiku about the sea.", "In 1969, the first humans landed on"]
N = 24


@pytest.fixture(scope="module")
def vanilla():
    llm = LLM(dtype="float32", device="cuda", kv_cache_memory_gb=0.5, max_num_seqs=8, cuda_graph_max_bs=8,
              overlap_schedule=False)  # the plain schedule: the reference every other mode must equal
    assert set(llm.engine.graphs.status.values()) == {"graphed"}
    assert not llm.engine.worker.overlapping
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=N))
    return [o.token_ids for o in outs]


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    cfg = load_checkpoint(default_model_path(), torch.float32)[0]
    return random_draft_checkpoint(tmp_path_factory.mktemp("h") / "e", cfg, "EAGLE", seed=1)


@pytest.mark.parametrize("shape", [(5, 1, 6), (6, 8, 16)], ids=["chain", "tree"])
@pytest.mark.parametrize("hot", [None, 8192], ids=["full", "frspec8k"])
def test_graphed_eagle_equals_graphed_vanilla_fp32(shape, hot, head, vanilla, tmp_path):
    tmap = None
    if hot:
        tmap = str(tmp_path / "m.pt")
        torch.save(list(range(hot)), tmap)
    steps, topk, ntok = shape
    llm = LLM(dtype="float32", device="cuda", kv_cache_memory_gb=0.5, max_num_seqs=8,
              cuda_graph_max_bs=8, speculative_algorithm="EAGLE", speculative_draft_model_path=str(head),
              speculative_num_steps=steps, speculative_eagle_topk=topk,
              speculative_num_draft_tokens=ntok, speculative_token_map=tmap,
              fuse_spec_step=False)  # the phases as separate graphs (the fused step: below)
    graphs = llm.engine.graphs
    assert set(graphs.status.values()) == {"graphed"}, graphs.report()
    assert {p for p, _ in graphs.status} == {"draft", "verify", "verify[sample]", "verify[full]",
                                             "draft_extend", "draft_extend[grammar]", "prefill",
                                             "prefill_draft"}
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=N))
    assert [o.token_ids for o in outs] == vanilla
    assert llm.engine.allocator.num_free == llm.engine.allocator.num_blocks
    print(graphs.report())


@pytest.mark.parametrize("hot", [None, 8192], ids=["full", "frspec8k"])
def test_fused_step_graphed_equals_graphed_vanilla_fp32(hot, vanilla, tmp_path):
    """fuse_spec_step: the whole speculative step replays as one graph per batch size (greedy and
    sampled), and greedy tokens still equal graphed vanilla's."""
    tmap = None
    if hot:
        tmap = str(tmp_path / "m.pt")
        torch.save(list(range(hot)), tmap)
    llm = LLM(dtype="float32", device="cuda", kv_cache_memory_gb=0.5, max_num_seqs=8,
              cuda_graph_max_bs=8, speculative_algorithm="EAGLE3", speculative_num_steps=6,
              speculative_eagle_topk=8, speculative_num_draft_tokens=16, speculative_token_map=tmap,
              fuse_spec_step=True)
    graphs = llm.engine.graphs
    assert set(graphs.status.values()) == {"graphed"}, graphs.report()
    assert {"step", "step[sample]"} <= {p for p, _ in graphs.status}
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=N))
    assert [o.token_ids for o in outs] == vanilla
    assert llm.engine.worker.stats.phase_calls["step"] > 0
    assert llm.engine.allocator.num_free == llm.engine.allocator.num_blocks


def test_graphed_overlap_schedule_equals_graphed_vanilla_fp32(vanilla):
    """The overlap schedule (step N+1 launched before step N is read, its inputs taken on the
    device) replays the same graphs to the same tokens: vanilla greedy with EOS on, and sampled
    with a seed as the plain schedule; EAGLE-3 (shipped head, fused step) greedy."""
    llm = LLM(dtype="float32", device="cuda", kv_cache_memory_gb=0.5, max_num_seqs=8, cuda_graph_max_bs=8,
              overlap_schedule=True)
    assert set(llm.engine.graphs.status.values()) == {"graphed"}
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=N))
    assert [o.token_ids for o in outs] == vanilla
    spec = LLM(dtype="float32", device="cuda", kv_cache_memory_gb=0.5, max_num_seqs=8, cuda_graph_max_bs=8,
               overlap_schedule=True, speculative_algorithm="EAGLE3", speculative_num_steps=4,
               speculative_eagle_topk=8, speculative_num_draft_tokens=12)  # the shipped head
    assert set(spec.engine.graphs.status.values()) == {"graphed"}
    outs = spec.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=N))
    assert [o.token_ids for o in outs] == vanilla
    assert max(spec.engine.worker.stats.accept_hist) > 2
    del spec
    sampled = SamplingParams(temperature=0.8, top_p=0.95, seed=7, max_tokens=N)
    plain = LLM(dtype="float32", device="cuda", kv_cache_memory_gb=0.5, max_num_seqs=8, cuda_graph_max_bs=8,
                overlap_schedule=False)
    ref = [o.token_ids for o in plain.generate(PROMPTS, sampled)]
    assert [o.token_ids for o in llm.generate(PROMPTS, sampled)] == ref
    del plain
    # the default with CUDA graphs: on for vanilla and the fused step, off for three phase graphs
    auto = LLM(dtype="float32", device="cuda", kv_cache_memory_gb=0.5, max_num_seqs=8, cuda_graph_max_bs=8)
    assert auto.engine.worker.overlapping
    del auto
    three = LLM(dtype="float32", device="cuda", kv_cache_memory_gb=0.5, max_num_seqs=8, cuda_graph_max_bs=8,
                speculative_algorithm="EAGLE3", fuse_spec_step=False)
    assert not three.engine.worker.overlapping


def test_adaptive_shapes_with_the_overlap_schedule_equal_vanilla_fp32(vanilla):
    """--speculative-adaptive with the shipped head, graphed, overlap schedule: steps of different
    shapes follow each other while one is still in flight (their carry and draft state are
    shared), plain decode steps too (the queue drained before the draft catches up); the output
    is vanilla's, and every candidate ran."""
    spec = LLM(dtype="float32", device="cuda", kv_cache_memory_gb=0.5, max_num_seqs=8, cuda_graph_max_bs=8,
               overlap_schedule=True, speculative_algorithm="EAGLE3", speculative_adaptive=True,
               speculative_candidates=("off", "2/1/3", "3/1/4", "4/8/12", "6/8/16"))
    assert set(spec.engine.graphs.status.values()) == {"graphed"}
    assert spec.engine.worker.overlapping
    spec.engine.worker.policy.probe_every = 3  # switch often
    for bs in (1, 4, 6):
        outs = spec.generate(PROMPTS[:bs], SamplingParams(temperature=0, max_tokens=N))
        assert [o.token_ids for o in outs] == vanilla[:bs]
    measured = {s.label for (s, _) in spec.engine.worker.policy.costs.ms}
    assert measured == {"off", "2/1/3", "3/1/4", "4/8/12", "6/8/16"}
    worker = spec.engine.worker  # the catch-ups after plain steps replayed the draft's prefill graphs
    assert worker.stats.phase_calls["catch_up"] > 0 and worker.catch_up.eager_passes == 0


def test_serving_compiles_no_kernel_after_start_up():
    """Once start-up has captured and warmed everything, no Triton kernel compiles while serving
    (each compile holds every running request 0.1-1 s): the adaptive engine, greedy and sampled,
    batches of 1 to 6 and prompts of 2 to ~600 tokens."""
    from hotspec.runtime import compile_watch

    llm = LLM(device="cuda", kv_cache_memory_gb=0.5, max_num_seqs=8, cuda_graph_max_bs=8,
              speculative_algorithm="EAGLE3", speculative_adaptive=True)
    if not compile_watch.arm():
        pytest.skip("this Triton has no compile hook")
    before = compile_watch.compiles()
    prompts = PROMPTS + [" ".join(PROMPTS) * 12]
    for bs in (1, 3, 6):
        for p in (SamplingParams(temperature=0, max_tokens=N),
                  SamplingParams(temperature=0.8, top_p=0.9, seed=1, max_tokens=N)):
            llm.generate(prompts[-bs:], p)
    assert compile_watch.compiles() == before


def test_deterministic_bf16_equals_alone_batched_and_speculative(head, tmp_path):
    """--deterministic in bf16 (graphed, overlap schedule): the default model's greedy tokens are
    the same alone and batched, and so are seeded samples; the shipped head's default (adaptive)
    engine and its 4/8/12 tree, and a random EAGLE head with an 8k FR-Spec map, give vanilla's
    greedy tokens bit for bit, and their logprobs (top 5) too; a fixed shape's seeded samples
    are alike alone and batched (the adaptive engine's depend on the shapes its steps ran,
    which follow the batch)."""
    kw = dict(device="cuda", kv_cache_memory_gb=0.5, max_num_seqs=8, cuda_graph_max_bs=8,
              deterministic=True)
    greedy = SamplingParams(temperature=0, max_tokens=64, logprobs=5)
    sampled = SamplingParams(temperature=0.8, top_p=0.95, seed=7, max_tokens=32)

    def alone_and_batched(llm: LLM, params: SamplingParams) -> list[list[int]]:
        alone = [llm.generate([p], params)[0].token_ids for p in PROMPTS]
        assert [o.token_ids for o in llm.generate(PROMPTS, params)] == alone
        return alone

    van = LLM(**kw)
    assert set(van.engine.graphs.status.values()) == {"graphed"} and van.engine.worker.overlapping
    want = alone_and_batched(van, greedy)
    want_lp = [o.logprobs for o in van.generate(PROMPTS, greedy)]
    alone_and_batched(van, sampled)
    del van
    tmap = str(tmp_path / "m.pt")
    torch.save(list(range(8192)), tmap)
    for spec in [dict(speculative_algorithm="EAGLE3"),
                 dict(speculative_algorithm="EAGLE3", speculative_num_steps=4,
                      speculative_eagle_topk=8, speculative_num_draft_tokens=12),
                 dict(speculative_algorithm="EAGLE", speculative_draft_model_path=str(head),
                      speculative_num_steps=5, speculative_eagle_topk=1,
                      speculative_num_draft_tokens=6, speculative_token_map=tmap)]:
        llm = LLM(**spec, **kw)
        assert set(llm.engine.graphs.status.values()) == {"graphed"}, spec
        outs = llm.generate(PROMPTS, greedy)
        assert [o.token_ids for o in outs] == want, spec
        assert [o.logprobs for o in outs] == want_lp, spec
        if "speculative_draft_model_path" not in spec:  # the shipped head accepts
            assert max(llm.engine.worker.stats.accept_hist) > 2, spec
        if "speculative_num_steps" in spec:
            alone_and_batched(llm, sampled)
        del llm
