"""The engine's fused target maps back to transformers' LlamaForCausalLM (hf_state_dict)."""

from __future__ import annotations

import pytest
import torch
from engine_utils import prefill_logits, rel_l2, save_tiny_llama

from hotspec import LLM
from hotspec.benchmark.hf_baseline import hf_llama


@pytest.mark.parametrize("tied", [False, True])
def test_hf_state_dict_loads_strict_and_matches_logits(tied: bool, tmp_path) -> None:
    from transformers import AutoConfig
    from transformers import LlamaForCausalLM as HFLlama

    save_tiny_llama(tmp_path, vocab=128, hidden=64, layers=2, std=0.15, tie_word_embeddings=tied)
    llm = LLM(model=str(tmp_path), dtype="float32", device="cpu", skip_tokenizer_init=True,
              num_kv_blocks=32, block_size=4)
    target = llm.engine.target  # built by build_target: q/k/v and gate/up are fused
    attn, mlp = target.model.layers[0].self_attn, target.model.layers[0].mlp
    assert attn.qkv_proj is not None and mlp.gate_up_proj is not None
    assert not hasattr(attn, "q_proj") and not hasattr(mlp, "gate_proj")

    state = target.hf_state_dict()
    # views of the fused weights, not copies
    assert state["model.layers.0.self_attn.q_proj.weight"].data_ptr() == attn.qkv_proj.weight.data_ptr()
    assert state["model.layers.0.mlp.gate_proj.weight"].data_ptr() == mlp.gate_up_proj.weight.data_ptr()

    hf = HFLlama(AutoConfig.from_pretrained(tmp_path)).eval()
    hf.load_state_dict(state, strict=True)
    ref = HFLlama.from_pretrained(tmp_path, dtype=torch.float32).state_dict()
    assert state.keys() == ref.keys()
    for k, v in ref.items():
        torch.testing.assert_close(state[k], v, rtol=0, atol=0, msg=k)

    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in (5, 11)]
    ours = prefill_logits(llm.engine, prompts)
    shared = hf_llama(llm.engine)  # the --vs-hf baseline: shares the engine's weights
    for i, p in enumerate(prompts):
        with torch.no_grad():
            for model in (hf, shared):
                assert rel_l2(ours[i], model(torch.tensor([p])).logits[0, -1]) < 1e-4
