"""The `speed` stage's table: one run each of two trees ("before", "after") side by side.

    python lab/speed_table.py DIR        # reads DIR/{before,after}_RUN.json

RUN is `decode` (benchmarks/decode_bench.py --out: ms a step and tok/s per batch size) or
`sweep_bN` (benchmarks/spec_sweep.py --out: vanilla's ms a decode step, then each variant's tau,
tok/s and decode speedup). A missing or failed run leaves its cells empty; "after / before" is the
ratio of the two figures (for ms, below 1 is faster).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

TREES = ("before", "after")


def _figures(run: str, d: dict[str, Any]) -> dict[str, float]:
    """(row label -> figure) of one run's JSON."""
    if run == "decode":
        out = {}
        for r in d["results"]:
            out[f"batch {r['batch_size']}: ms a step"] = r["ms_per_step"]
            out[f"batch {r['batch_size']}: tok/s"] = r["tokens_per_s"]
        return out
    out = {"vanilla: ms a decode step": d["vanilla_ms_per_step"]}
    for r in d["rows"][1:]:
        if "error" not in r:
            out[f"{r['variant']}: tau"] = r["tau_mean"]
            out[f"{r['variant']}: tok/s"] = r["tokens_per_s"]
            out[f"{r['variant']}: decode x vanilla"] = r["decode_speedup"]
    return out


def table(folder: Path) -> str:
    runs = sorted({f.stem.split("_", 1)[1] for f in folder.glob("*_*.json")},
                  key=lambda r: (r != "decode", r))
    lines = ["| run | figure | before | after | after / before |", "|---|---|---:|---:|---:|"]
    for run in runs:
        figs = {}
        for tree in TREES:
            f = folder / f"{tree}_{run}.json"
            figs[tree] = _figures(run, json.loads(f.read_text())) if f.exists() else {}
        labels = list(dict.fromkeys(k for tree in TREES for k in figs[tree]))
        for label in labels:
            a, b = figs["before"].get(label), figs["after"].get(label)
            ratio = f"{b / a:.3f}" if a and b is not None else ""
            cells = [f"{x:.3f}" if x is not None else "" for x in (a, b)]
            lines.append(f"| {run} | {label} | {cells[0]} | {cells[1]} | {ratio} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1])))
