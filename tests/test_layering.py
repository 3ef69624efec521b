"""The floor plan (GUIDE section 3): imports flow down only, and the product never imports the
lab. A module imports its own floor or lower ones; imports inside functions count, imports under
`if TYPE_CHECKING:` do not (they never run)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hotspec"
# floor of each top-level module or package of hotspec, lowest first
FLOORS = {
    "core": 0, "config": 0, "errors": 0, "envs": 0, "logs": 0, "sampling_params": 0,
    "layers": 1,
    "runtime": 2,
    "models": 3,
    "speculative": 4,
    "engine": 5,
    "entrypoints": 6,
    "training": 7, "benchmark": 7,
    "cli": 8, "__main__": 8,
}
NAMES = ["ground", "layers", "runtime", "models", "speculative", "engine", "entrypoints",
         "training/benchmark", "command line"]


def floor(module: str) -> int | None:
    """The floor of a dotted module name inside hotspec; None outside it (or the package root,
    whose `__init__` is the public facade)."""
    parts = module.split(".")
    if parts[0] != "hotspec" or len(parts) < 2:
        return None
    if parts[1] not in FLOORS:
        raise AssertionError(f"{module}: no floor; add its top-level module to FLOORS")
    return FLOORS[parts[1]]


def _runtime_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every import that runs (not under `if TYPE_CHECKING:`)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from hotspec import x` names a module x, or the facade's attribute
            names = [f"{node.module}.{a.name}" for a in node.names] if node.module == "hotspec" \
                else [node.module]
            found += [(node.lineno, n) for n in names]
    return found


def upward_imports() -> list[str]:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        own = floor(module)
        if own is None:
            continue
        for line, name in _runtime_imports(ast.parse(path.read_text())):
            target = floor(name) if name.split(".")[-1] not in ("LLM", "SamplingParams") else None
            if target is not None and target > own:
                bad.append(f"{rel}.py:{line} ({NAMES[own]}) imports {name} ({NAMES[target]})")
    return bad


def test_imports_flow_down_the_floors() -> None:
    assert upward_imports() == []


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The rule itself: a lazy import inside a function counts, a TYPE_CHECKING one does not."""
    src = ("from typing import TYPE_CHECKING\n"
           "if TYPE_CHECKING:\n    from hotspec.engine.engine import Engine\n"
           "def f():\n    from hotspec.training.distill import distill\n")
    assert [n for _, n in _runtime_imports(ast.parse(src))] == ["typing", "hotspec.training.distill"]
    assert floor("hotspec.training.distill") > floor("hotspec.speculative.worker")  # type: ignore[operator]


def test_files_and_constructors_stay_small() -> None:
    """No module over 400 lines; no constructor over 8 parameters (self excluded): a constructor
    that needs more takes the typed parts they belong to."""
    long_files = [f"{p.relative_to(PACKAGE.parent)}: {n}" for p in PACKAGE.rglob("*.py")
                  if (n := len(p.read_text().splitlines())) > 400]
    assert long_files == []
    wide = []
    for p in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name == "__init__":
                a = node.args
                n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) - 1
                if n > 8:
                    wide.append(f"{p.relative_to(PACKAGE.parent)}:{node.lineno} ({n})")
    assert wide == []
