"""Every HOTSPEC_* environment switch the engine reads is in the README's table of switches, so
an engineer who finds one set in a deployment can look it up (and a new one cannot go unlisted)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_engine_switch_is_documented():
    read = set()
    for path in (ROOT / "hotspec").rglob("*.py"):
        read |= set(re.findall(r"HOTSPEC_[A-Z0-9_]+", path.read_text()))
    readme = ROOT.joinpath("README.md").read_text()
    assert read, "the engine reads no switch? the scan is broken"
    assert sorted(v for v in read if not re.search(rf"\b{v}\b", readme)) == []
