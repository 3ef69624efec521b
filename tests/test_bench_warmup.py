"""The benchmark modes warm every prompt's prefill before timing: the first engine of a process
would otherwise pay, inside its timed prefill, for kernels and allocator blocks the modes timed
after it find ready (vanilla, timed first, came out slower than it is)."""

from __future__ import annotations

from typing import Any

import pytest

from hotspec.benchmark import modes


class _Engine:
    device = type("D", (), {"type": "cpu"})()
    worker = type("W", (), {})()


def _patch(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[list[int]], int]]:
    calls: list[tuple[list[list[int]], int]] = []
    monkeypatch.setattr(modes, "warm_up", lambda e, prompts, n: calls.append((prompts, n)))
    monkeypatch.setattr(modes, "run_with_engine", lambda cfg, target, run: run(_Engine()))
    monkeypatch.setattr(modes, "run_categories", lambda e, groups, params: {})
    return calls


GROUPS = {"a": [[1, 2, 3], [4, 5]], "b": [[6, 7, 8, 9]]}


@pytest.mark.parametrize("mode", ["vanilla", "speculative"])
def test_every_prompt_is_prefilled_before_the_timed_pass(monkeypatch: pytest.MonkeyPatch,
                                                         mode: str) -> None:
    calls = _patch(monkeypatch)
    opts = modes.RunOptions(max_tokens=8, ignore_eos=False, warmup_tokens=4,
                            warmup_prompts=[[1, 2, 3]])
    cfg: Any = object()
    if mode == "vanilla":
        modes.run_vanilla(cfg, None, GROUPS, opts, vs_hf=False)  # type: ignore[arg-type]
    else:
        monkeypatch.setattr(modes, "resolve_device_dtype", lambda c: (_Engine.device, None))
        monkeypatch.setattr(modes, "replace", lambda c, **kw: c)
        modes.run_speculative(cfg, None, GROUPS, opts, profile_pass=False)  # type: ignore[arg-type]
    every = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    assert calls == [([[1, 2, 3]], 4), *[([p], 1) for p in every], (every, 1)]


def test_no_warm_up_asked_means_none(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _patch(monkeypatch)
    opts = modes.RunOptions(max_tokens=8, ignore_eos=False, warmup_tokens=0, warmup_prompts=[])
    modes.run_vanilla(object(), None, GROUPS, opts, vs_hf=False)  # type: ignore[arg-type]
    assert calls == []
