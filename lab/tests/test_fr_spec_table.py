"""lab/benchmarks/fr_spec_table.py: spec_sweep outputs become the FR-Spec table, one row per draft
vocabulary, maps of different folders kept apart, a failed variant reported in its row."""

from __future__ import annotations

import json
from pathlib import Path

import fr_spec_table


def _row(variant: str, tmap: str | None, tau: float, cov: float, draft_ms: float | None) -> dict:
    over = {"speculative_num_steps": 3} | ({"speculative_token_map": tmap} if tmap else {})
    return {"variant": variant, "engine_overrides": over, "tau_mean": tau, "hot_coverage": cov,
            "ms_per_spec_step": 1.5, "tokens_per_s": 1000.0, "speedup": 0.9, "decode_speedup": 0.95,
            "greedy_identical": "8/8",
            "phases": None if draft_ms is None else
            {"phases": {"draft": {"ms_per_call": draft_ms}, "verify": {"ms_per_call": 0.8}}}}


def test_table_rows(tmp_path: Path) -> None:
    f = tmp_path / "qsweep_humaneval_b8"
    f.write_text(json.dumps({
        "argv": ["--prompts", ".data/humaneval.jsonl", "--batch-size", "8"], "vanilla_ms_per_step": 1.1,
        "rows": [{"variant": "vanilla", "tokens_per_s": 7000.0},
                 _row("3/1/4:profile", None, 1.6, 1.0, 0.412),
                 _row("3/1/4:map=/root/qhead/freq_32768.pt:profile", "/root/qhead/freq_32768.pt", 1.5,
                      0.966, 0.301),
                 _row("3/1/4:map=.data/qmaps_general/freq_8192.pt", ".data/qmaps_general/freq_8192.pt",
                      1.4, 0.85, None),
                 {"variant": "5/1/6", "error": "RuntimeError: capture failed"},
                 {"variant": "5/1/6:map=/root/qhead/freq_8192.pt", "error": "RuntimeError: x"}]}))
    lines = fr_spec_table.table([f]).splitlines()
    assert lines[2] == "| humaneval | 8 | vanilla | | | | | 1.100 | 7,000 | 1.00x | 1.00x | |"
    assert lines[3] == ("| humaneval | 8 | 3/1/4 | full | 1.60 | 100.0% | 0.412 | 1.500 | 1,000 | 0.90x "
                        "| 0.95x | 8/8 |")
    assert "| 32,768 (qhead) | 1.50 | 96.6% | 0.301 |" in lines[4]
    assert "| 8,192 (qmaps_general) | 1.40 | 85.0% |  |" in lines[5]
    assert "| 5/1/6 | full | failed: RuntimeError: capture failed" in lines[6]
    assert "| 5/1/6 | 8,192 (qhead) | failed: RuntimeError: x" in lines[7]  # its map, though it failed
