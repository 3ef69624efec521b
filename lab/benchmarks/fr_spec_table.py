"""The FR-Spec table of RESULTS.md from spec_sweep.py outputs: one row per (prompt set, batch
size, shape, draft vocabulary), with tau, the hot set's coverage of the served tokens, the profiled draft
phase's ms a call, ms a speculative step, tokens/s, the speedup over vanilla end to end and in
decode alone (prefill excluded: steadier on few prompts) and whether greedy outputs equal vanilla's.

    python lab/benchmarks/fr_spec_table.py qsweep_humaneval_b1 qsweep_humaneval_b8 ...

A variant's vocabulary is `full` without a token map, else the map's size and the folder it came
from (`freq_32768.pt` in qhead: "32,768 (qhead)"), so maps of the training answers and of a
general corpus stay apart. The prompt set is the --prompts file's stem.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any


def vocabulary(row: dict[str, Any]) -> str:
    path = (row.get("engine_overrides") or {}).get("speculative_token_map")
    if path is None:  # (a failed variant has no overrides: its name says)
        path = next((o[4:] for o in row.get("variant", "").split(":") if o.startswith("map=")), None)
    if not path:
        return "full"
    m = re.search(r"(\d+)", Path(path).stem)
    size = f"{int(m.group(1)):,}" if m else Path(path).stem
    return f"{size} ({Path(path).parent.name})"


def _arg(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv and argv.index(name) + 1 < len(argv) else None


def table(files: list[Path]) -> str:
    lines = ["| prompts | batch | shape | draft vocabulary | tau | coverage | draft ms | ms/step "
             "| tok/s | x vanilla | decode x | identical |",
             "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for f in files:
        d = json.loads(f.read_text())
        argv = d.get("argv", [])
        prompts = Path(_arg(argv, "--prompts") or "?").stem
        batch = _arg(argv, "--batch-size") or "1"
        rows = d["rows"]
        van = rows[0]
        lines.append(f"| {prompts} | {batch} | vanilla | | | | | {d['vanilla_ms_per_step']:.3f} | "
                     f"{van['tokens_per_s']:,.0f} | 1.00x | 1.00x | |")
        for r in rows[1:]:
            shape = r["variant"].split(":")[0]
            if "error" in r:
                lines.append(f"| {prompts} | {batch} | {shape} | {vocabulary(r)} | failed: "
                             f"{r['error'][:60]} | | | | | | | |")
                continue
            ph = (r.get("phases") or {}).get("phases", {}).get("draft", {}).get("ms_per_call")
            lines.append(
                f"| {prompts} | {batch} | {shape} | {vocabulary(r)} | {r['tau_mean']:.2f} | "
                f"{r['hot_coverage']:.1%} | {'' if ph is None else f'{ph:.3f}'} | "
                f"{r['ms_per_spec_step']:.3f} | {r['tokens_per_s']:,.0f} | {r['speedup']:.2f}x | "
                f"{r['decode_speedup']:.2f}x | {r['greedy_identical']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=Path, help="spec_sweep.py --out files")
    args = p.parse_args(argv)
    print(table(args.files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
