"""A fresh trainable head for a target, its public config.json, and its export.

The head is the inference module itself (EagleHead / Eagle3Head), built from the same config the
public loader reads, so what is trained is what the engine runs. Frozen and shared with the
target: the token embedding and, for EAGLE-1/2, the LM head. Trainable, initialised from scratch
(normal(0, 0.02) Linear weights, zero biases, unit RMSNorm gains, as Hugging Face Llama
initialises): fc, the decoder layer, EAGLE-3's norms. EAGLE-3's own LM head [draft_vocab, H] is
trainable too and starts from the target's LM head rows of the draft vocabulary (a warm start:
the head's normed output then begins in the space the target's LM head reads).

With `--init DIR` (fine-tuning) every trainable weight starts from a trained head instead, read
and checked as the engine reads a head (draft_loader), and its config.json is the head's.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hotspec.errors import ModelLoadError
from hotspec.models.config import ModelConfig
from hotspec.models.draft_checkpoint import draft_config, save_draft_checkpoint
from hotspec.models.draft_head import DraftHead
from hotspec.models.draft_loader import draft_folder, load_draft_head, read_json_object
from hotspec.models.eagle import EagleHead
from hotspec.models.eagle3 import Eagle3Head, eagle3_capture_layers
from hotspec.models.llama import LlamaForCausalLM

INIT_STD = 0.02  # Hugging Face LlamaConfig.initializer_range
DEFAULT_EAGLE3_VOCAB = 32000  # SpecForge's default draft_vocab_size


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """Target layer OUTPUT ids for EAGLE-3 (config key eagle_aux_hidden_state_layer_ids):
    SpecForge's [1, L//2 - 1, L - 4]; for tiny targets where those collide, [0, (L-2)//2, L-2]."""
    ids = [1, num_layers // 2 - 1, num_layers - 4]
    if len(set(ids)) == 3 and min(ids) >= 0:
        return ids
    top = num_layers - 2
    return [0, top // 2, top]


def head_config(target_cfg: ModelConfig, algorithm: str, draft_vocab: int | None,
                intermediate_size: int | None = None) -> dict[str, Any]:
    """The config.json of the trained head (public key names, draft_checkpoint.draft_config);
    `draft_vocab` is written for EAGLE-3 only (EAGLE-1/2 heads keep the target's LM head).
    `intermediate_size` (None: the target's) is the head's MLP width: build_head and the engine's
    draft loader both read it from this config, so the trained and the served head agree."""
    config = draft_config(target_cfg, algorithm)
    if intermediate_size is not None:
        config["intermediate_size"] = intermediate_size
    if algorithm == "EAGLE":
        config["bias"] = True  # fc has a bias, as in the public EAGLE-1/2 heads
    else:
        ids = default_aux_layer_ids(target_cfg.num_hidden_layers)
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids}
        eagle3_capture_layers(config, target_cfg.num_hidden_layers)  # raises if unusable
        if draft_vocab is not None:
            config["draft_vocab_size"] = draft_vocab
    return config


def aux_layers(config: dict[str, Any], target_cfg: ModelConfig, algorithm: str) -> tuple[int, ...]:
    """Target layers whose input the head reads (empty for EAGLE-1/2), as the loader derives them."""
    if algorithm == "EAGLE":
        return ()
    return eagle3_capture_layers(config, target_cfg.num_hidden_layers)


def build_head(target: LlamaForCausalLM, config: dict[str, Any], algorithm: str,
               draft_to_target: torch.Tensor | None, device: torch.device, seed: int,
               share_lm_head: bool = False) -> DraftHead:
    """A trainable head in float32 on `device` (see the module docstring for what is trained);
    `share_lm_head` (EAGLE-3): its LM head is the target's own weight, frozen."""
    tcfg = target.config
    # The head's ModelConfig exactly as draft_loader builds it from config.json.
    cfg = dataclasses.replace(ModelConfig.from_hf_dict({**config, "model_type": "llama"}),
                              attention_bias=False, qk_norm=False, tie_word_embeddings=False,
                              max_position_embeddings=tcfg.max_position_embeddings)
    embed = target.model.embed_tokens.weight
    torch.manual_seed(seed)
    head: DraftHead
    if algorithm == "EAGLE":
        head = EagleHead(cfg, embed, target.lm_head.weight, tcfg.vocab_size,
                         tcfg.max_position_embeddings, fc_bias=bool(config.get("bias", True)))
    else:
        rows = target.lm_head.weight.detach()
        if draft_to_target is not None:
            rows = rows[draft_to_target.to(rows.device)]
        if not share_lm_head:
            rows = rows.float().clone()  # trained: float32 master weights of its own
        head = Eagle3Head(cfg, embed, rows, draft_to_target,
                          tcfg.vocab_size, tcfg.max_position_embeddings,
                          aux_layers(config, tcfg, algorithm))
    for module in head.modules():
        if isinstance(module, nn.Linear) and module is not head.lm_head:
            nn.init.normal_(module.weight, 0.0, INIT_STD)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    if algorithm == "EAGLE3" and not share_lm_head:
        head.lm_head.weight.requires_grad_(True)
    head = head.to(device)
    head.build_rotary(device)
    return head.train()


@dataclasses.dataclass
class InitHead:
    """A trained head to fine-tune: its config.json, its own weights by state-dict name, and for
    an EAGLE-3 head with an LM head of its own, the target id of each row, in row order."""
    folder: Path
    config: dict[str, Any]
    state: dict[str, torch.Tensor]
    shares_lm_head: bool
    draft_to_target: torch.Tensor | None


def read_init_head(path: Path, target: LlamaForCausalLM, algorithm: str,
                   device: torch.device) -> InitHead:
    """The head of `path` for `target` in float32 on `device` (load_draft_head's checks and
    errors: format, algorithm, hidden size, vocabulary, aux layers, d2t)."""
    loaded = load_draft_head(path, target, algorithm, torch.float32, device)
    folder = draft_folder(path)
    shares = loaded.lm_head.weight.data_ptr() == target.lm_head.weight.data_ptr()
    state = {k: v for k, v in loaded.state_dict().items()
             if not k.startswith("embed_tokens.") and not (shares and k.startswith("lm_head."))}
    d2t = loaded.draft_to_target
    return InitHead(folder, read_json_object(folder / "config.json"), state, shares,
                    None if d2t is None else d2t.cpu())


def load_init_weights(head: DraftHead, init: InitHead) -> None:
    """Copy `init`'s weights into `head`, built from init.config: every trainable weight must
    come from it (a head of another shape fails here, naming the keys)."""
    own = trainable_parameters(head)
    missing = sorted(set(own) - set(init.state))
    extra = sorted(set(init.state) - set(head.state_dict()))
    if missing or extra:
        raise ModelLoadError(f"--init {init.folder}: the head built from its config.json does not "
                             f"match its weights (missing: {missing[:5]}, unexpected: {extra[:5]})")
    with torch.no_grad():
        for name, p in head.state_dict().items():
            if name in init.state:
                p.copy_(init.state[name])


def trainable_parameters(head: DraftHead) -> dict[str, nn.Parameter]:
    return {n: p for n, p in head.named_parameters() if p.requires_grad}


def export_head(head: DraftHead, config: dict[str, Any], out_dir: Path, dtype: torch.dtype,
                d2t: torch.Tensor | None = None, t2d: torch.Tensor | None = None,
                share_lm_head: bool = False) -> Path:
    """Write config.json + model.safetensors with the public key names (no embedding; EAGLE-1/2
    and EAGLE-3 heads sharing the target's LM head without one; other EAGLE-3 heads with
    lm_head.weight, d2t and t2d)."""
    own_head = isinstance(head, Eagle3Head) and not share_lm_head
    state: dict[str, torch.Tensor] = {}
    for name, p in head.state_dict().items():
        if name.startswith("embed_tokens.") or (name.startswith("lm_head.") and not own_head):
            continue
        state[name] = p.detach().to(dtype)
    if own_head:
        if d2t is None or t2d is None:
            raise ValueError("an EAGLE-3 head is exported with its d2t and t2d")
        state["d2t"], state["t2d"] = d2t, t2d
    return save_draft_checkpoint(state, config, out_dir)
