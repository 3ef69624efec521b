"""EAGLE-1/2 and EAGLE-3 draft heads: public checkpoint format, loading, forward maths, refusals."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

from hotspec.core.forward_batch import ForwardBatch
from hotspec.core.kv_pool import KVPool
from hotspec.errors import ModelLoadError
from hotspec.layers.attention.torch_ref import TorchRefBackend
from hotspec.models.build import build_target
from hotspec.models.config import ModelConfig
from hotspec.models.draft_checkpoint import random_draft_checkpoint, save_draft_checkpoint
from hotspec.models.draft_head import DraftHead
from hotspec.models.draft_loader import load_draft_head
from hotspec.models.eagle import EagleHead
from hotspec.models.eagle3 import Eagle3Head, eagle3_capture_layers
from hotspec.models.llama import LlamaForCausalLM
from hotspec.runtime.batch_builder import prefill_batch

CFG = ModelConfig(architecture="llama", vocab_size=128, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  rope_theta=10000.0, max_position_embeddings=256)
H, V = CFG.hidden_size, CFG.vocab_size
BLOCK = 4
NUM_BLOCKS = 8
DRAFT_VOCAB = 32

EAGLE_KEYS = {
    "fc.weight", "fc.bias",
    "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight", "layers.0.self_attn.o_proj.weight",
    "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight",
    "layers.0.post_attention_layernorm.weight",
}
EAGLE3_KEYS = {
    "fc.weight", "norm.weight",
    "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight",
    "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
    "midlayer.post_attention_layernorm.weight",
}
EAGLE3_VOCAB_KEYS = {"lm_head.weight", "d2t", "t2d"}


@dataclass
class FakeRequest:
    """The slice of core.request.Request that batch_builder reads."""

    blocks: list[int]
    seq_len: int = 0
    tokens: list[int] = field(default_factory=list)

    def slot(self, index: int, block_size: int) -> int:
        return self.blocks[index // block_size] * block_size + index % block_size

    def slots(self, start: int, n: int, block_size: int) -> list[int]:
        return [self.slot(i, block_size) for i in range(start, start + n)]

    def block_array(self) -> np.ndarray:
        return np.asarray(self.blocks, dtype=np.int32)


@pytest.fixture(scope="module")
def target() -> LlamaForCausalLM:
    torch.manual_seed(0)
    state = LlamaForCausalLM(CFG).state_dict()
    for k in state:  # make the norms non-trivial
        if k.endswith("layernorm.weight") or k == "model.norm.weight":
            state[k] = 1.0 + 0.1 * torch.randn(state[k].shape)
    return build_target(CFG, state, torch.float32, "cpu")


def read_file_keys(folder: Path) -> set[str]:
    if (folder / "model.safetensors").is_file():
        with safe_open(folder / "model.safetensors", framework="pt") as f:
            return set(f.keys())
    return set(torch.load(folder / "pytorch_model.bin", weights_only=True))


def read_state(folder: Path) -> dict[str, torch.Tensor]:
    if (folder / "model.safetensors").is_file():
        with safe_open(folder / "model.safetensors", framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}
    return torch.load(folder / "pytorch_model.bin", weights_only=True)


def load(folder: Path, target: LlamaForCausalLM, algorithm: str) -> DraftHead:
    return load_draft_head(folder, target, algorithm, torch.float32, "cpu")


def make_requests() -> list[FakeRequest]:
    g = torch.Generator().manual_seed(1)
    a = FakeRequest(blocks=[5, 2], tokens=torch.randint(0, V, (7,), generator=g).tolist())
    b = FakeRequest(blocks=[1, 6], tokens=torch.randint(0, V, (5,), generator=g).tolist())
    return [a, b]


def run_target(target: LlamaForCausalLM, reqs: list[FakeRequest], capture: tuple[int, ...]
               ) -> tuple[ForwardBatch, torch.Tensor, list[torch.Tensor]]:
    fb = prefill_batch(reqs, [r.tokens for r in reqs], BLOCK, torch.device("cpu"))  # type: ignore[arg-type]
    kv = KVPool(CFG.num_hidden_layers, NUM_BLOCKS, BLOCK, CFG.num_key_value_heads, CFG.head_dim,
                torch.float32, "cpu")
    backend = TorchRefBackend(BLOCK)
    backend.plan(fb)
    target.capture_layers = capture
    try:
        hidden, aux = target(fb, kv, backend)
    finally:
        target.capture_layers = ()
    return fb, hidden, aux


def run_head(head: DraftHead, fb: ForwardBatch, hidden_in: torch.Tensor,
             kv: KVPool | None = None) -> tuple[torch.Tensor, torch.Tensor, KVPool]:
    kv = kv or head.make_kv_pool(NUM_BLOCKS, BLOCK, torch.float32, "cpu")
    backend = TorchRefBackend(BLOCK)
    fb.hidden_in = hidden_in
    fb.attn_meta = None
    backend.plan(fb)
    out, feature = head(fb, kv, backend)
    return out, feature, kv


# ---------------------------------------------------------------- straightforward references


def ref_rms(x: torch.Tensor, w: torch.Tensor, eps: float = CFG.rms_norm_eps) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def ref_rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / (CFG.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = (pos.double()[:, None] * inv[None]).float()
    cos, sin = torch.cat((ang.cos(), ang.cos()), -1)[:, None], torch.cat((ang.sin(), ang.sin()), -1)[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat((-x2, x1), -1) * sin


def ref_attn(x: torch.Tensor, sd: dict[str, torch.Tensor], p: str) -> torch.Tensor:
    """Causal attention of one request whose positions are 0..T-1, no cache."""
    t, nh, nkv, d = x.shape[0], CFG.num_attention_heads, CFG.num_key_value_heads, CFG.head_dim
    pos = torch.arange(t)
    q = ref_rope((x @ sd[p + "q_proj.weight"].T).view(t, nh, d), pos)
    k = ref_rope((x @ sd[p + "k_proj.weight"].T).view(t, nkv, d), pos)
    v = (x @ sd[p + "v_proj.weight"].T).view(t, nkv, d)
    k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    o = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(t, nh * d)
    return o @ sd[p + "o_proj.weight"].T


def ref_mlp(x: torch.Tensor, sd: dict[str, torch.Tensor], p: str) -> torch.Tensor:
    return (F.silu(x @ sd[p + "gate_proj.weight"].T) * (x @ sd[p + "up_proj.weight"].T)) @ \
        sd[p + "down_proj.weight"].T


def ref_eagle1(sd: dict[str, torch.Tensor], embed: torch.Tensor, ids: list[int],
               hidden: torch.Tensor) -> torch.Tensor:
    x = torch.cat((embed[ids], hidden), -1) @ sd["fc.weight"].T + sd["fc.bias"]
    h = x + ref_attn(x, sd, "layers.0.self_attn.")  # no input layernorm
    return h + ref_mlp(ref_rms(h, sd["layers.0.post_attention_layernorm.weight"]), sd, "layers.0.mlp.")


def ref_eagle3(sd: dict[str, torch.Tensor], embed: torch.Tensor, ids: list[int],
               feature: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """feature: [T, H], already through fc where it came from the target."""
    m = "midlayer."
    x = torch.cat((ref_rms(embed[ids], sd[m + "input_layernorm.weight"]),
                   ref_rms(feature, sd[m + "hidden_norm.weight"])), -1)
    r = ref_attn(x, sd, m + "self_attn.") + feature
    s = ref_mlp(ref_rms(r, sd[m + "post_attention_layernorm.weight"]), sd, m + "mlp.") + r
    return ref_rms(s, sd["norm.weight"]), s


# ---------------------------------------------------------------- format


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_eagle_public_format(tmp_path: Path, fmt: str) -> None:
    folder = random_draft_checkpoint(tmp_path / "e", CFG, "EAGLE", fmt=fmt)
    assert read_file_keys(folder) == EAGLE_KEYS
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle"]
    assert config["num_hidden_layers"] == 1 and config["model_type"] == "llama"
    assert config["hidden_size"] == H and config["vocab_size"] == V
    assert "hot_vocab_size" not in config and "draft_vocab_size" not in config
    state = read_state(folder)
    assert tuple(state["fc.weight"].shape) == (H, 2 * H)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_eagle3_public_format(tmp_path: Path, fmt: str) -> None:
    folder = random_draft_checkpoint(tmp_path / "e3", CFG, "EAGLE3", fmt=fmt,
                                     draft_vocab_size=DRAFT_VOCAB)
    assert read_file_keys(folder) == EAGLE3_KEYS | EAGLE3_VOCAB_KEYS
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["draft_vocab_size"] == DRAFT_VOCAB
    state = read_state(folder)
    assert tuple(state["fc.weight"].shape) == (H, 3 * H)
    assert tuple(state["midlayer.self_attn.q_proj.weight"].shape) == (CFG.num_attention_heads * 16, 2 * H)
    d2t, t2d = state["d2t"], state["t2d"]
    assert d2t.dtype == torch.int64 and d2t.shape == (DRAFT_VOCAB,)
    assert t2d.dtype == torch.bool and t2d.shape == (V,) and int(t2d.sum()) == DRAFT_VOCAB
    target_ids = torch.arange(DRAFT_VOCAB) + d2t
    assert torch.equal(target_ids, t2d.nonzero().flatten())  # ascending subset
    # Without a draft vocabulary the head has no LM head of its own.
    plain = random_draft_checkpoint(tmp_path / "plain", CFG, "EAGLE3", fmt=fmt)
    assert read_file_keys(plain) == EAGLE3_KEYS


# ---------------------------------------------------------------- loading and forward


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_eagle1_matches_reference(tmp_path: Path, target: LlamaForCausalLM, fmt: str) -> None:
    folder = random_draft_checkpoint(tmp_path / "e", CFG, "EAGLE", fmt=fmt, seed=3, scale=0.1)
    head = load(folder, target, "EAGLE")
    assert isinstance(head, EagleHead) and head.aux_layer_ids == ()
    assert head.draft_vocab_size == V and head.draft_to_target is None
    assert head.lm_head.weight.data_ptr() == target.lm_head.weight.data_ptr()  # shared
    reqs = make_requests()
    fb, hidden, _ = run_target(target, reqs, ())
    out, feature, _ = run_head(head, fb, hidden)
    assert out.shape == (fb.num_tokens, H) and feature is out
    sd = read_state(folder)
    embed = target.model.embed_tokens.weight
    start = 0
    for r in reqs:
        n = len(r.tokens)
        ref = ref_eagle1(sd, embed, r.tokens, hidden[start:start + n])
        torch.testing.assert_close(out[start:start + n], ref, rtol=1e-5, atol=1e-5)
        start += n
    logits = head.compute_logits(out)
    assert logits.dtype == torch.float32 and logits.shape == (fb.num_tokens, V)


def test_eagle1_uses_checkpoint_embedding(tmp_path: Path, target: LlamaForCausalLM) -> None:
    own = torch.randn(V, H)
    folder = random_draft_checkpoint(tmp_path / "e", CFG, "EAGLE", embed_tokens=own)
    assert read_file_keys(folder) == EAGLE_KEYS | {"embed_tokens.weight"}
    head = load(folder, target, "EAGLE")
    assert torch.equal(head.embed_tokens.weight, own)
    # Rotary tables saved by older heads are derived data, not weights: skipped.
    edit_state(folder, {"layers.0.self_attn.rotary_emb.inv_freq": torch.ones(CFG.head_dim // 2)})
    load(folder, target, "EAGLE")
    # No fc.bias when the config says bias: false.
    nobias = random_draft_checkpoint(tmp_path / "nb", CFG, "EAGLE", extra_config={"bias": False})
    assert "fc.bias" not in read_file_keys(nobias)
    assert load(nobias, target, "EAGLE").fc.bias is None


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_eagle3_matches_reference(tmp_path: Path, target: LlamaForCausalLM, fmt: str) -> None:
    folder = random_draft_checkpoint(tmp_path / "e3", CFG, "EAGLE3", fmt=fmt, seed=4, scale=0.1,
                                     draft_vocab_size=DRAFT_VOCAB)
    head = load(folder, target, "EAGLE3")
    assert isinstance(head, Eagle3Head)
    # 4-layer target: the default [2, 2, 1] collides, so the writer set ids [0, 1, 2] -> inputs of 1..3
    assert head.aux_layer_ids == (1, 2, 3) and head.target_feature_size == 3 * H
    reqs = make_requests()
    fb, _, aux = run_target(target, reqs, head.aux_layer_ids)
    assert len(aux) == 3
    out, s, kv = run_head(head, fb, torch.cat(aux, -1))
    sd = read_state(folder)
    embed = target.model.embed_tokens.weight
    feats = torch.cat(aux, -1) @ sd["fc.weight"].T
    start = 0
    for r in reqs:
        n = len(r.tokens)
        ref_out, ref_s = ref_eagle3(sd, embed, r.tokens, feats[start:start + n])
        torch.testing.assert_close(out[start:start + n], ref_out, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(s[start:start + n], ref_s, rtol=1e-5, atol=1e-5)
        start += n
    # One more step per request fed with the head's own pre-norm feature (width H: no fc),
    # attending to the cached K/V of the prefill.
    last = torch.tensor([len(r.tokens) for r in reqs]).cumsum(0) - 1
    nxt = [[5], [9]]
    for r in reqs:
        r.seq_len = len(r.tokens)
    fb2 = prefill_batch(reqs, nxt, BLOCK, torch.device("cpu"))  # type: ignore[arg-type]
    out2, _, _ = run_head(head, fb2, s[last], kv)
    start = 0
    for i, r in enumerate(reqs):
        n = len(r.tokens)
        f = torch.cat((feats[start:start + n], s[last[i]][None]))
        ref_out, _ = ref_eagle3(sd, embed, r.tokens + nxt[i], f)
        torch.testing.assert_close(out2[i], ref_out[-1], rtol=1e-5, atol=1e-5)
        start += n
    logits = head.compute_logits(out2)
    assert logits.dtype == torch.float32 and logits.shape == (2, DRAFT_VOCAB)


def test_eagle3_d2t_mapping(tmp_path: Path, target: LlamaForCausalLM) -> None:
    folder = random_draft_checkpoint(tmp_path / "e3", CFG, "EAGLE3", draft_vocab_size=DRAFT_VOCAB)
    sd = read_state(folder)
    head = load(folder, target, "EAGLE3")
    assert head.draft_vocab_size == DRAFT_VOCAB == head.lm_head.out_features
    assert head.draft_to_target is not None and head.draft_to_target.dtype == torch.long
    assert torch.equal(head.draft_to_target, torch.arange(DRAFT_VOCAB) + sd["d2t"])
    assert torch.equal(head.draft_to_target, sd["t2d"].nonzero().flatten())
    assert torch.equal(head.lm_head.weight, sd["lm_head.weight"])
    # Without lm_head/d2t: the target's LM head, identity map.
    plain = load(random_draft_checkpoint(tmp_path / "p", CFG, "EAGLE3"), target, "EAGLE3")
    assert plain.draft_to_target is None and plain.draft_vocab_size == V
    assert plain.lm_head.weight.data_ptr() == target.lm_head.weight.data_ptr()


def test_set_lm_head_slices(tmp_path: Path, target: LlamaForCausalLM) -> None:
    head = load(random_draft_checkpoint(tmp_path / "e", CFG, "EAGLE"), target, "EAGLE")
    hot = torch.tensor([3, 7, 11, 100], dtype=torch.long)
    head.set_lm_head(target.lm_head.weight[hot], hot)
    assert head.draft_vocab_size == 4 and head.lm_head.out_features == 4
    h = torch.randn(3, H)
    torch.testing.assert_close(head.compute_logits(h), (h @ target.lm_head.weight.T)[:, hot])
    assert torch.equal(head.draft_to_target, hot)
    with pytest.raises(ValueError, match="draft_to_target"):
        head.set_lm_head(target.lm_head.weight[hot], None)
    with pytest.raises(ValueError, match="outside the target"):
        head.set_lm_head(target.lm_head.weight[:2], torch.tensor([0, V]))
    head.set_lm_head(target.lm_head.weight, None)
    assert head.draft_vocab_size == V and head.draft_to_target is None


def test_sharded_safetensors(tmp_path: Path, target: LlamaForCausalLM) -> None:
    src = random_draft_checkpoint(tmp_path / "src", CFG, "EAGLE")
    sd = read_state(src)
    out = tmp_path / "sharded"
    out.mkdir()
    shutil.copy(src / "config.json", out / "config.json")
    keys = sorted(sd)
    shards = {"model-00001-of-00002.safetensors": keys[:4], "model-00002-of-00002.safetensors": keys[4:]}
    for name, ks in shards.items():
        save_file({k: sd[k] for k in ks}, str(out / name))
    index = {"weight_map": {k: name for name, ks in shards.items() for k in ks}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    head = load(out, target, "EAGLE")
    assert torch.equal(head.fc.weight, sd["fc.weight"])


def test_aux_layer_convention() -> None:
    # SGLang: default capture indices [2, L//2, L-3] (inputs of those layers); configured ids are
    # layer outputs, captured at id + 1.
    assert eagle3_capture_layers({}, 32) == (2, 16, 29)
    ids = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]}}
    assert eagle3_capture_layers(ids, 32) == (2, 16, 29)
    unsorted = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [28, 1, 15]}}
    assert eagle3_capture_layers(unsorted, 32) == (2, 16, 29)
    with pytest.raises(ValueError, match="distinct"):
        eagle3_capture_layers({}, 4)  # [2, 2, 1]
    with pytest.raises(ValueError, match="distinct"):
        eagle3_capture_layers({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 31]}}, 32)


# ---------------------------------------------------------------- refusals


def edit_state(folder: Path, edit: dict[str, torch.Tensor | None]) -> Path:
    """Rewrite the folder's weights with keys set (tensor) or removed (None)."""
    sd = read_state(folder)
    for k, v in edit.items():
        if v is None:
            sd.pop(k)
        else:
            sd[k] = v
    config = json.loads((folder / "config.json").read_text())
    fmt = "safetensors" if (folder / "model.safetensors").is_file() else "bin"
    return save_draft_checkpoint(sd, config, folder, fmt)


def refuse(folder: Path, target: LlamaForCausalLM, algorithm: str, *fragments: str) -> str:
    with pytest.raises(ModelLoadError) as e:
        load(folder, target, algorithm)
    msg = str(e.value)
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"
    return msg


def test_refuses_wrong_hidden_size(tmp_path: Path, target: LlamaForCausalLM) -> None:
    other = replace(CFG, hidden_size=32, head_dim=8)
    folder = random_draft_checkpoint(tmp_path / "e", other, "EAGLE")
    refuse(folder, target, "EAGLE", "hidden_size", "32", "64")


def test_refuses_missing_key(tmp_path: Path, target: LlamaForCausalLM) -> None:
    folder = random_draft_checkpoint(tmp_path / "e", CFG, "EAGLE")
    edit_state(folder, {"layers.0.mlp.down_proj.weight": None})
    refuse(folder, target, "EAGLE", "missing", "layers.0.mlp.down_proj.weight")


def test_refuses_unexpected_key(tmp_path: Path, target: LlamaForCausalLM) -> None:
    folder = random_draft_checkpoint(tmp_path / "e", CFG, "EAGLE", fmt="bin")
    edit_state(folder, {"layers.0.input_layernorm.weight": torch.ones(H)})
    refuse(folder, target, "EAGLE", "unexpected", "layers.0.input_layernorm.weight")


def test_refuses_wrong_shape(tmp_path: Path, target: LlamaForCausalLM) -> None:
    folder = random_draft_checkpoint(tmp_path / "e3", CFG, "EAGLE3")
    edit_state(folder, {"fc.weight": torch.zeros(H, 100)})
    refuse(folder, target, "EAGLE3", "fc.weight", "(64, 100)", "(64, 192)")


@pytest.mark.parametrize(("written", "given", "flag"), [("EAGLE3", "EAGLE", "'EAGLE3'"),
                                                         ("EAGLE", "EAGLE3", "'EAGLE'")])
def test_refuses_wrong_algorithm(tmp_path: Path, target: LlamaForCausalLM, written: str, given: str,
                                 flag: str) -> None:
    folder = random_draft_checkpoint(tmp_path / "x", CFG, written)
    refuse(folder, target, given, "speculative_algorithm=" + flag)


def test_refuses_target_checkpoint_as_draft(tmp_path: Path, target: LlamaForCausalLM) -> None:
    folder = save_draft_checkpoint({"model.embed_tokens.weight": torch.zeros(V, H)},
                                   {"hidden_size": H}, tmp_path / "t")
    refuse(folder, target, "EAGLE", "not an EAGLE draft head", "model.embed_tokens.weight")


def test_refuses_draft_vocab_size_disagreement(tmp_path: Path, target: LlamaForCausalLM) -> None:
    folder = random_draft_checkpoint(tmp_path / "e3", CFG, "EAGLE3", draft_vocab_size=DRAFT_VOCAB,
                                     extra_config={"draft_vocab_size": 50})
    refuse(folder, target, "EAGLE3", "draft_vocab_size=50", f"{DRAFT_VOCAB} rows")
    # A config draft_vocab_size without an lm_head of that size: the target head has V rows.
    folder = random_draft_checkpoint(tmp_path / "p", CFG, "EAGLE3",
                                     extra_config={"draft_vocab_size": DRAFT_VOCAB})
    refuse(folder, target, "EAGLE3", f"draft_vocab_size={DRAFT_VOCAB}", f"{V} rows")


def test_hot_vocab_size_key_is_ignored(tmp_path: Path, target: LlamaForCausalLM) -> None:
    folder = random_draft_checkpoint(tmp_path / "e", CFG, "EAGLE", extra_config={"hot_vocab_size": 16})
    assert load(folder, target, "EAGLE").draft_vocab_size == V


def test_refuses_vocabulary_mismatches(tmp_path: Path, target: LlamaForCausalLM) -> None:
    folder = random_draft_checkpoint(tmp_path / "emb", CFG, "EAGLE", embed_tokens=torch.zeros(100, H))
    refuse(folder, target, "EAGLE", "embed_tokens.weight", "(100, 64)", "(128, 64)")
    folder = random_draft_checkpoint(tmp_path / "cfgv", CFG, "EAGLE", extra_config={"vocab_size": 100})
    refuse(folder, target, "EAGLE", "vocab_size=100", "128")
    folder = random_draft_checkpoint(tmp_path / "d2t", CFG, "EAGLE3", draft_vocab_size=DRAFT_VOCAB)
    edit_state(folder, {"d2t": torch.full((DRAFT_VOCAB,), V, dtype=torch.long)})
    refuse(folder, target, "EAGLE3", "d2t", "outside the target vocabulary")
    folder = random_draft_checkpoint(tmp_path / "len", CFG, "EAGLE3", draft_vocab_size=DRAFT_VOCAB)
    edit_state(folder, {"d2t": torch.zeros(DRAFT_VOCAB + 1, dtype=torch.long)})
    refuse(folder, target, "EAGLE3", "d2t", f"({DRAFT_VOCAB},)", f"({DRAFT_VOCAB + 1},)")
    folder = random_draft_checkpoint(tmp_path / "nod2t", CFG, "EAGLE3", draft_vocab_size=DRAFT_VOCAB)
    edit_state(folder, {"d2t": None})
    refuse(folder, target, "EAGLE3", "lm_head.weight", f"{DRAFT_VOCAB} rows", "no d2t")


def test_refuses_missing_folder_and_config(tmp_path: Path, target: LlamaForCausalLM) -> None:
    refuse(tmp_path / "nope", target, "EAGLE", "not a folder")
    (tmp_path / "empty").mkdir()
    refuse(tmp_path / "empty", target, "EAGLE", "no config.json")
    folder = random_draft_checkpoint(tmp_path / "e", CFG, "EAGLE")
    (folder / "model.safetensors").unlink()
    refuse(folder, target, "EAGLE", "no draft weights")
    with pytest.raises(ModelLoadError, match="MEDUSA"):
        load(folder, target, "MEDUSA")


CALLS: list[str] = []


def _record(what: str) -> str:
    CALLS.append(what)
    return what


class _Payload:
    """Pickles as a call to _record: loading it without weights_only would run that call."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (_record, ("unpickled code ran",))


def test_refuses_pickled_code(tmp_path: Path, target: LlamaForCausalLM) -> None:
    folder = random_draft_checkpoint(tmp_path / "e", CFG, "EAGLE", fmt="bin")
    state = read_state(folder)
    torch.save({**state, "payload": _Payload()}, folder / "pytorch_model.bin")
    refuse(folder, target, "EAGLE", "weights_only=True", "pytorch_model.bin")
    assert CALLS == []


@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
def test_fused_projections_compute_the_same_head(tmp_path: Path, target: LlamaForCausalLM,
                                                 algorithm: str) -> None:
    """The engine fuses a loaded head's q/k/v and gate/up (one GEMM each, as the target);
    the fused head computes what the checkpoint's separate projections compute."""
    from hotspec.models.llama import MLP, Attention

    folder = random_draft_checkpoint(tmp_path / "h", CFG, algorithm, seed=6, scale=0.1,
                                     draft_vocab_size=DRAFT_VOCAB if algorithm == "EAGLE3" else None)
    head = load(folder, target, algorithm)
    reqs = make_requests()
    fb, hidden, aux = run_target(target, reqs, head.aux_layer_ids)
    feature = torch.cat(aux, -1) if aux else hidden
    ref, ref_s, _ = run_head(head, fb, feature)
    assert all(m.qkv_proj is None for m in head.modules() if isinstance(m, Attention))
    head.fuse_projections()
    head.fuse_projections()  # idempotent
    attns = [m for m in head.modules() if isinstance(m, Attention)]
    mlps = [m for m in head.modules() if isinstance(m, MLP)]
    assert attns and mlps
    assert all(m.qkv_proj is not None and not hasattr(m, "q_proj") for m in attns)
    assert all(m.gate_up_proj is not None and not hasattr(m, "gate_proj") for m in mlps)
    fb, hidden, aux = run_target(target, reqs, head.aux_layer_ids)
    out, s, _ = run_head(head, fb, torch.cat(aux, -1) if aux else hidden)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, ref_s, rtol=1e-5, atol=1e-5)
