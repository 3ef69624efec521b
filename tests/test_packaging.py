"""pyproject.toml: `pip install .` needs no triton (a CUDA torch wheel brings its own, a CPU install
runs without); the test extra holds test tools only, and a triton range that torch's CUDA wheels
and the CPU interpreter tests both accept."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
PROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]


def requirements(group: list[str]) -> dict[str, Requirement]:
    return {r.name: r for r in map(Requirement, group)}


def test_the_product_does_not_depend_on_triton() -> None:
    assert "triton" not in requirements(PROJECT["dependencies"])


def test_test_extra_accepts_the_triton_of_torch_cuda_wheels() -> None:
    triton = requirements(PROJECT["optional-dependencies"]["test"])["triton"]
    assert triton.specifier.contains("3.7.1")  # torch 2.13's CUDA wheel pins it
    assert triton.specifier.contains("3.6.0")
    assert not any(spec.operator == "==" for spec in triton.specifier)
    assert triton.marker is not None and triton.marker.evaluate({"sys_platform": "linux"})
    assert not triton.marker.evaluate({"sys_platform": "darwin"})  # no triton wheels there


def test_test_extra_holds_test_tools_and_dev_the_linters() -> None:
    from hotspec.models.packaged import PACKAGED_MODELS

    extras = PROJECT["optional-dependencies"]
    parts = {n for m in PACKAGED_MODELS.values() for n in m.pip_names}  # their parity tests' models
    assert set(requirements(extras["test"])) == {"pytest", "pytest-xdist", "scipy", "accelerate",
                                                  "mypy", "openai", "httpx", "triton"} | parts
    # (mypy: test_typing; pytest-xdist: the README's test command runs two workers)
    assert "ruff" in requirements(extras["dev"])
