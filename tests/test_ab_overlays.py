"""scripts/ab_overlays.py: every A/B recipe still applies to the current engine sources (a refactor
that moves a recipe's text fails here, not silently on the GPU), and its output is valid Python
that differs from the source."""

from __future__ import annotations

from pathlib import Path

import pytest
from script_utils import load_script

ROOT = Path(__file__).resolve().parent.parent
ab = load_script("scripts/ab_overlays.py")


@pytest.mark.parametrize("name", sorted(ab.RECIPES))
def test_recipe_applies_to_current_sources(name: str, tmp_path: Path) -> None:
    files = ab.write(name, tmp_path)
    assert files
    for rel in files:
        text = (tmp_path / name / rel).read_text()
        assert text != (ROOT / rel).read_text()
        compile(text, rel, "exec")


def test_stale_or_unknown_recipes_stop_with_their_name(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(ab.RECIPES, "stale", [(ab.KERNELS, "text that is not there", "x")])
    with pytest.raises(SystemExit, match="recipe stale: its text is not in"):
        ab.write("stale", tmp_path)
    with pytest.raises(SystemExit, match="unknown recipe"):
        ab.main(["nope", "--out", str(tmp_path)])
