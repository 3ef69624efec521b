"""Test helper: import one of the repository's scripts or benchmarks (files outside the hotspec
package) by its path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def load_script(rel: str, register: bool = False) -> ModuleType:
    """The module at ROOT / rel, named after its file. register: listed in sys.modules while it
    executes (a module whose dataclasses look themselves up there), and removed after."""
    path = ROOT / rel
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[path.stem] = module
    try:
        spec.loader.exec_module(module)
    finally:
        if register:
            del sys.modules[path.stem]
    return module
