"""The engine's environment switches: all in hotspec/envs.py, each in the README's table of
switches (so an engineer who finds one set in a deployment can look it up, and a new one cannot
go unlisted), each 1 or 0."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from hotspec import envs

ROOT = Path(__file__).resolve().parent.parent
NAMES = [f.metadata["env"] for f in fields(envs.Switches)]


def test_every_switch_is_declared_in_envs():
    found = {}
    for path in (ROOT / "hotspec").rglob("*.py"):
        for name in re.findall(r"HOTSPEC_[A-Z0-9_]+", path.read_text()):
            found.setdefault(name, set()).add(path.relative_to(ROOT).as_posix())
    assert found, "the engine reads no switch? the scan is broken"
    assert {n: p for n, p in found.items() if p != {"hotspec/envs.py"}} == {}
    assert sorted(found) == sorted(NAMES)


def test_every_switch_is_documented():
    readme = ROOT.joinpath("README.md").read_text()
    assert [n for n in NAMES if not re.search(rf"\b{n}\b", readme)] == []


def test_switches_parse_one_way(monkeypatch):
    """Unset or empty: the default (on); 0 / 1; anything else an error naming the variable."""
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    envs.switches.cache_clear()
    try:
        assert envs.switches() == envs.Switches() == envs.Switches(True, True, True)
        monkeypatch.setenv("HOTSPEC_PDL", "0")
        monkeypatch.setenv("HOTSPEC_GEMV", "")
        envs.switches.cache_clear()
        assert envs.switches() == envs.Switches(pdl=False)
        monkeypatch.setenv("HOTSPEC_FUSED_KERNELS", "off")
        envs.switches.cache_clear()
        with pytest.raises(ValueError, match=r"HOTSPEC_FUSED_KERNELS='off': use 1 or 0"):
            envs.switches()
    finally:
        envs.switches.cache_clear()


def test_table_lists_every_switch():
    lines = envs.table().splitlines()
    assert lines[0] == "| Variable | Default | Effect |" and len(lines) == 2 + len(NAMES)
    assert all(f"`{n}` | 1 |" in row for n, row in zip(NAMES, lines[2:]))
