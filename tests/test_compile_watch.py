"""runtime/compile_watch.py: once armed, every Triton compile is counted and logged, and the hook
never stops a compile (Triton skips one whose cache hook returns True)."""

from __future__ import annotations

import logging

import pytest

from hotspec.runtime import compile_watch

knobs = pytest.importorskip("triton").knobs


def test_compiles_after_arming_are_counted_and_logged(caplog, monkeypatch):
    seen: list[str] = []
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", lambda **kw: seen.append(kw["repr"]))
    monkeypatch.setattr(compile_watch, "_state", {"count": 0, "armed": False, "installed": False})
    assert compile_watch.arm()
    hook = knobs.runtime.jit_cache_hook
    with caplog.at_level(logging.WARNING, logger="hotspec.kernels"):
        assert hook(repr="paged_attn_fwd[num_warps=4](stride_bt: i32)", is_manual_warmup=False) is False
        assert hook(repr="manual_k", is_manual_warmup=True) is False  # (an explicit warm-up: not counted)
    assert compile_watch.compiles() == 1
    assert "paged_attn_fwd" in caplog.text and "manual_k" not in caplog.text
    assert seen == ["paged_attn_fwd[num_warps=4](stride_bt: i32)", "manual_k"]  # the hook before it runs
    assert compile_watch.arm() and knobs.runtime.jit_cache_hook is hook  # installed once
