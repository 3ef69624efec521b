"""Load a public EAGLE-1/2 or EAGLE-3 draft head folder onto a built target model.

The folder holds config.json and the weights as `model.safetensors` (or shards with
`model.safetensors.index.json`) or `pytorch_model.bin` (or shards with its index), read with
`torch.load(weights_only=True)` so no pickled code ever runs. Every size comes from the tensors;
config keys such as `draft_vocab_size` / `hot_vocab_size` only get cross-checked.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from hotspec.errors import ModelLoadError
from hotspec.models.build import check_state_dict
from hotspec.models.config import ModelConfig
from hotspec.models.draft_head import DraftHead
from hotspec.models.eagle import EagleHead
from hotspec.models.eagle3 import Eagle3Head, eagle3_capture_layers
from hotspec.models.llama import LlamaForCausalLM

ALGORITHMS = ("EAGLE", "EAGLE3")
_FLAG = {a: f"speculative_algorithm='{a}' (--speculative-algorithm {a})" for a in ALGORITHMS}
_KIND = {"EAGLE": "EAGLE-1/2 (keys layers.0.*)", "EAGLE3": "EAGLE-3 (keys midlayer.*)"}
# Rotary tables some older .bin heads saved with the weights; recomputed here (SGLang skips them too).
_DERIVED_BUFFERS = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")
_WEIGHT_FILES = (("model.safetensors.index.json", "model.safetensors"),
                 ("pytorch_model.bin.index.json", "pytorch_model.bin"))


def load_draft_head(path: str | os.PathLike, target: LlamaForCausalLM, algorithm: str,
                    dtype: torch.dtype, device: torch.device | str) -> DraftHead:
    """The draft head of `path` for `target`; the head's own weights in `dtype` on `device`.

    The embedding and (unless the checkpoint has its own) the LM head are the target's tensors,
    shared, not copied. The caller sets `target.capture_layers = head.aux_layer_ids`.
    """
    if algorithm not in ALGORITHMS:
        raise ModelLoadError(f"speculative algorithm {algorithm!r} has no draft head loader; choose "
                             f"one of {', '.join(ALGORITHMS)}")
    folder = draft_folder(path)
    config = read_json_object(folder / "config.json")
    state = read_draft_tensors(folder, dtype)
    _check_algorithm(state, algorithm, folder)
    cfg = _draft_config(config, algorithm, target.config, folder)
    where = f"draft checkpoint {folder}"
    embed = _optional_embedding(state, target, where)
    vocab, max_pos = target.config.vocab_size, target.config.max_position_embeddings
    if algorithm == "EAGLE":
        # EAGLE-1/2 heads always use the target's LM head (SGLang replaces any stored copy too);
        # a stored one is accepted if it fits the target vocabulary.
        _check_rows(state.pop("lm_head.weight", None), "lm_head.weight", target, where)
        _check_draft_vocab_key(config, vocab, where)
        aux: tuple[int, ...] = ()
        lm_head, d2t = target.lm_head.weight, None
    else:
        try:
            aux = eagle3_capture_layers(config, target.config.num_hidden_layers)
        except ValueError as e:
            raise ModelLoadError(f"{where}: {e}") from e
        lm_head, d2t = _eagle3_vocab(state, config, target, where)
        lm_head = lm_head.to(device)
    try:
        with torch.device("meta"):  # own layers on meta, materialised from `state` below
            head: DraftHead
            if algorithm == "EAGLE":
                head = EagleHead(cfg, embed, lm_head, vocab, max_pos,
                                 fc_bias=bool(config.get("bias", True)))
            else:
                head = Eagle3Head(cfg, embed, lm_head, d2t, vocab, max_pos, aux)
    except ValueError as e:  # e.g. an unsupported rope_scaling type in config.json
        raise ModelLoadError(f"{where}: {e}. Fix: use the config.json that came with the head.") from e
    shared = ("embed_tokens.", "lm_head.")
    expected = {k: v.shape for k, v in head.state_dict().items() if not k.startswith(shared)}
    check_state_dict(expected, state, where)
    head.load_state_dict({k: v.to(device) for k, v in state.items()}, strict=False, assign=True)
    head.build_rotary(device)
    return head.eval().requires_grad_(False)


def read_draft_tensors(folder: Path, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """All tensors of the folder's weight files but derived rotary tables; floating ones cast to
    `dtype` (None: kept as stored), others (d2t, t2d) kept."""
    for index_name, single_name in _WEIGHT_FILES:
        index, single = folder / index_name, folder / single_name
        if index.is_file():
            files = _shards(index)
        elif single.is_file():
            files = [single]
        else:
            continue
        reader = _read_safetensors if single_name.endswith(".safetensors") else _read_bin
        tensors: dict[str, torch.Tensor] = {}
        for f in files:
            tensors.update(reader(f))
        return {k: t.to(dtype) if dtype is not None and t.is_floating_point() else t
                for k, t in tensors.items()
                if not k.endswith(_DERIVED_BUFFERS)}
    found = ", ".join(sorted(p.name for p in folder.iterdir())) or "nothing"
    raise ModelLoadError(
        f"{folder} has no draft weights (looked for model.safetensors, "
        f"model.safetensors.index.json, pytorch_model.bin, pytorch_model.bin.index.json; found "
        f"{found}). Fix: pass the folder of a public EAGLE/EAGLE-3 head as downloaded.")


# ---------------------------------------------------------------- files


def draft_folder(path: str | os.PathLike) -> Path:
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ModelLoadError(f"draft model path {folder} is not a folder. Fix: pass the folder that "
                             "holds the draft head's config.json and weights.")
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"draft model folder {folder} has no config.json. Fix: pass the folder "
                             "of a public EAGLE/EAGLE-3 head as downloaded (config.json + weights).")
    return folder


def read_json_object(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"cannot read {path} ({e}). Fix: restore the file from the original "
                             "checkpoint.") from e
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} is not a JSON object. Fix: restore the original file.")
    return data


def _shards(index: Path) -> list[Path]:
    weight_map = read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelLoadError(f"{index} has no weight_map. Fix: restore the original file.")
    shards = [index.parent / name for name in sorted(set(weight_map.values()))]
    missing = [p.name for p in shards if not p.is_file()]
    if missing:
        raise ModelLoadError(f"{index} names missing shard(s): {', '.join(missing)}. Fix: download "
                             "every file the index names into the folder.")
    return shards


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        with safe_open(path, framework="pt") as f:
            return {name: f.get_tensor(name) for name in f.keys()}
    except SafetensorError as e:
        raise ModelLoadError(f"{path} is not a valid safetensors file ({e}). Fix: re-download it.") from e


def _read_bin(path: Path) -> dict[str, torch.Tensor]:
    # weights_only=True: the unpickler only rebuilds tensors and plain containers; any other
    # class or callable in the pickle is refused before it can run.
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as e:
        raise ModelLoadError(
            f"refused to load {path}: it is not a plain tensor state dict readable with "
            f"torch.load(weights_only=True) ({type(e).__name__}: {str(e).splitlines()[0]}). Fix: "
            "re-download the file, or convert a trusted copy to model.safetensors.") from e
    if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in data.items()):
        raise ModelLoadError(f"{path} does not hold a flat {{name: tensor}} state dict. Fix: save "
                             "the head's state_dict() itself.")
    return data


# ---------------------------------------------------------------- checks


def _check_algorithm(state: dict[str, torch.Tensor], algorithm: str, folder: Path) -> None:
    found = [a for a, prefix in (("EAGLE", "layers.0."), ("EAGLE3", "midlayer."))
             if any(k.startswith(prefix) for k in state)]
    if algorithm in found:
        return
    if found:
        other = found[0]
        raise ModelLoadError(
            f"{folder} is an {_KIND[other]} draft checkpoint, but the algorithm is {algorithm}, "
            f"which expects {_KIND[algorithm]}. Fix: use {_FLAG[other]}.")
    keys = ", ".join(sorted(state)[:6]) or "none"
    raise ModelLoadError(
        f"{folder} is not an EAGLE draft head: no layers.0.* or midlayer.* keys (first keys: "
        f"{keys}). Fix: pass the draft head's folder, not the target model's.")


def _draft_config(config: dict[str, Any], algorithm: str, target: ModelConfig,
                  folder: Path) -> ModelConfig:
    source = folder / "config.json"
    # The head is a Llama layer whatever the target family: no Qwen3 qk-norm; q/k/v bias only where
    # the config asks for it (EAGLE-1/2 heads of Qwen2 targets), never for EAGLE-3 (as SGLang).
    attention_bias = algorithm == "EAGLE" and bool(
        config.get("attention_bias", config.get("model_type") == "qwen2"))
    try:
        cfg = ModelConfig.from_hf_dict({**config, "model_type": "llama"})
    except (KeyError, TypeError, ValueError) as e:
        raise ModelLoadError(f"{source}: invalid draft config ({type(e).__name__}: {e}). Fix: use the "
                             "config.json that came with the draft head.") from e
    if cfg.hidden_size != target.hidden_size:
        raise ModelLoadError(
            f"{source}: the draft head's hidden_size is {cfg.hidden_size} but the target's is "
            f"{target.hidden_size}; this head was trained for another model. Fix: use the draft head "
            "made for this target.")
    th = config.get("target_hidden_size")
    if th is not None and th != target.hidden_size:
        raise ModelLoadError(f"{source}: target_hidden_size={th} but the target's hidden_size is "
                             f"{target.hidden_size}. Fix: use the draft head made for this target.")
    if cfg.num_hidden_layers != 1:
        raise ModelLoadError(f"{source}: num_hidden_layers={cfg.num_hidden_layers}; hotspec runs "
                             "single-layer EAGLE heads only (num_hidden_layers 1).")
    if cfg.vocab_size != target.vocab_size:
        raise ModelLoadError(
            f"{source}: vocab_size={cfg.vocab_size} but the target's vocabulary has "
            f"{target.vocab_size} tokens; this head was trained for another tokenizer. Fix: use the "
            "draft head made for this target.")
    return dataclasses.replace(cfg, attention_bias=attention_bias, qk_norm=False,
                               tie_word_embeddings=False,
                               max_position_embeddings=target.max_position_embeddings)


def _check_rows(w: torch.Tensor | None, key: str, target: LlamaForCausalLM, where: str) -> None:
    """A tensor that must be [target vocab, H]."""
    want = (target.config.vocab_size, target.config.hidden_size)
    if w is not None and tuple(w.shape) != want:
        raise ModelLoadError(
            f"{where}: {key} has shape {tuple(w.shape)} but must be {want} (target vocabulary x "
            "hidden size); the head was trained for another target or tokenizer.")


def _optional_embedding(state: dict[str, torch.Tensor], target: LlamaForCausalLM,
                        where: str) -> torch.Tensor:
    """The checkpoint's own embed_tokens.weight if present (on the target's device), else the
    target's embedding weight, shared."""
    own = state.pop("embed_tokens.weight", None)
    _check_rows(own, "embed_tokens.weight", target, where)
    ref = target.model.embed_tokens.weight
    return ref if own is None else own.to(ref.device)


def _check_draft_vocab_key(config: dict[str, Any], rows: int, where: str) -> None:
    n = config.get("draft_vocab_size")
    if n is not None and n != rows:
        raise ModelLoadError(
            f"{where}: config.json says draft_vocab_size={n} but the LM head has {rows} rows "
            "(lm_head.weight, or the target's LM head when the checkpoint has none). Fix: correct "
            "draft_vocab_size or remove it; hotspec sizes the draft vocabulary from the tensors.")


def _eagle3_vocab(state: dict[str, torch.Tensor], config: dict[str, Any],
                  target: LlamaForCausalLM, where: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(LM head weight, draft_to_target or None) from lm_head.weight / d2t, popped from `state`."""
    vocab, hidden = target.config.vocab_size, target.config.hidden_size
    state.pop("t2d", None)  # target->draft mask: redundant with d2t, unused
    lm_head = state.pop("lm_head.weight", None)
    d2t = state.pop("d2t", None)
    if lm_head is None:
        lm_head = target.lm_head.weight
    elif lm_head.dim() != 2 or lm_head.shape[1] != hidden:
        raise ModelLoadError(f"{where}: lm_head.weight has shape {tuple(lm_head.shape)} but must be "
                             f"(draft_vocab_size, {hidden}).")
    rows = lm_head.shape[0]
    _check_draft_vocab_key(config, rows, where)
    if d2t is None:
        if rows != vocab:
            raise ModelLoadError(
                f"{where}: lm_head.weight has {rows} rows, not the target vocabulary's {vocab}, and "
                "there is no d2t to map draft ids to target ids. Fix: restore d2t from the original "
                "checkpoint.")
        return lm_head, None
    if d2t.shape != (rows,) or d2t.is_floating_point() or d2t.dtype == torch.bool:
        raise ModelLoadError(
            f"{where}: d2t must be an integer tensor of shape ({rows},) (one offset per "
            f"lm_head.weight row), got {d2t.dtype} {tuple(d2t.shape)}.")
    # d2t holds offsets: target id = draft id + d2t[draft id].
    mapped = torch.arange(rows, dtype=torch.long) + d2t.long()
    bad = (mapped < 0) | (mapped >= vocab)
    if bool(bad.any()):
        d = int(bad.nonzero()[0])
        raise ModelLoadError(
            f"{where}: d2t maps draft id {d} to target id {int(mapped[d])}, outside the target "
            f"vocabulary [0, {vocab}). Fix: use the draft head made for this target.")
    if mapped.unique().numel() != rows:
        raise ModelLoadError(f"{where}: d2t maps several draft ids to the same target id. Fix: "
                             "restore d2t from the original checkpoint.")
    return lm_head, mapped
