"""The exact path CUDA graphs replay (static buffers, padding to captured batch sizes, null-block
padding rows), run on the CPU: greedy and sampled outputs equal the eager engine's."""

from __future__ import annotations

import contextlib

import pytest
import torch
from engine_utils import tiny_target_and_head

from hotspec import LLM, SamplingParams
from hotspec.engine.builder import EngineBuilder
from hotspec.runtime.graph_runner import GraphRunner


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_target_and_head(tmp_path_factory.mktemp("tiny"), layers=4)


def _static(monkeypatch):
    def runner(self):
        return GraphRunner(self.device, "static", [1, 2, 4, 8])
    monkeypatch.setattr(EngineBuilder, "_graph_runner", runner)


@pytest.mark.parametrize("spec,fused", [(None, False), ((3, 1, 4), False), ((4, 3, 8), False),
                                        ((3, 1, 4), True), ((4, 3, 8), True)],
                         ids=["vanilla", "chain", "tree", "chain-fused", "tree-fused"])
def test_static_buffer_path_matches_eager(spec, fused, tiny, monkeypatch):
    """`fused`: the static engine runs the whole speculative step as one phase (fuse_spec_step)
    and still gives the eager three-phase engine's tokens, greedy and sampled."""
    target, head = tiny
    kw = dict(model=str(target), dtype="float32", device="cpu", skip_tokenizer_init=True, num_kv_blocks=128,
              block_size=4, max_model_len=128)
    if spec:
        kw.update(speculative_algorithm="EAGLE3", speculative_draft_model_path=str(head),
                  speculative_num_steps=spec[0], speculative_eagle_topk=spec[1],
                  speculative_num_draft_tokens=spec[2])
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 96, (n,), generator=g).tolist() for n in (3, 11, 6, 20, 9)]
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=0.8, top_p=0.9, seed=5, max_tokens=12, ignore_eos=True)]
    eager = LLM(**kw)
    ref = [[o.token_ids for o in eager.generate(prompt_token_ids=prompts, sampling_params=p)]
           for p in params]
    _static(monkeypatch)
    llm = LLM(**kw, fuse_spec_step=fused)
    assert llm.engine.graphs.mode == "static"
    for p, r in zip(params, ref):
        outs = llm.generate(prompt_token_ids=prompts, sampling_params=p)  # 5 requests: padded to 8
        assert [o.token_ids for o in outs] == r
    assert llm.engine.allocator.num_free == llm.engine.allocator.num_blocks
    if spec:
        assert max(llm.engine.worker.stats.accept_hist) > 1  # acceptance happens, too
        calls = llm.engine.worker.stats.phase_calls
        assert (calls["step"] > 0, calls["verify"] > 0) == (fused, not fused)
        # steps whose batch is the last step's reuse its state tensors; the others restack
        steps = calls["step"] + calls["verify"]
        assert 0 < llm.engine.worker.states.restacks < steps


class HostSync(AssertionError):
    pass


@contextlib.contextmanager
def forbid_host_sync():
    """Inside a phase, reading a tensor's value on the host (what would sync a GPU) raises."""
    names = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
    saved = {n: getattr(torch.Tensor, n) for n in names}

    def make(name):
        def refuse(self, *a, **k):
            raise HostSync(f"Tensor.{name}() inside a phase")
        return refuse

    for n in names:
        setattr(torch.Tensor, n, make(n))
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.Tensor, n, f)


def test_phases_never_read_device_values_on_the_host(tiny, monkeypatch):
    """Invariant 4: draft, verify (greedy and sampled), draft_extend, decode and the fused step
    (also with the overlap schedule's device-side inputs) run without a host read of any tensor
    value; the step's one sync happens outside the phases."""
    target, head = tiny
    _static(monkeypatch)
    real_run = GraphRunner.run
    seen: set[str] = set()

    def guarded(self, name, inputs, **kw):
        out_inputs = {k: v.clone() for k, v in inputs.items()}
        with forbid_host_sync():
            out = real_run(self, name, out_inputs, **kw)
        seen.add(name)
        return out

    monkeypatch.setattr(GraphRunner, "run", guarded)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 96, (n,), generator=g).tolist() for n in (4, 9, 13)]
    for spec, fused, overlap in ((None, False, False), (None, False, True), ((4, 3, 8), False, False),
                                 ((4, 3, 8), True, False), ((4, 3, 8), True, True)):
        kw = dict(model=str(target), dtype="float32", device="cpu", skip_tokenizer_init=True,
                  num_kv_blocks=128, block_size=4, max_model_len=128, overlap_schedule=overlap)
        if spec:
            kw.update(speculative_algorithm="EAGLE3", speculative_draft_model_path=str(head),
                      speculative_num_steps=spec[0], speculative_eagle_topk=spec[1],
                      speculative_num_draft_tokens=spec[2], fuse_spec_step=fused)
        llm = LLM(**kw)
        for p in (SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
                  SamplingParams(temperature=0.9, seed=3, max_tokens=6, ignore_eos=True),
                  SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=2),
                  SamplingParams(temperature=0.7, seed=2, max_tokens=6, frequency_penalty=0.5,
                                 logit_bias={3: 5.0}, min_tokens=2)):
            llm.generate(prompt_token_ids=prompts, sampling_params=p)
    assert seen == {"decode", "decode[sample]", "decode[full]", "draft", "verify",
                    "verify[sample]", "verify[full]", "draft_extend", "step", "step[sample]",
                    "step[full]"}
