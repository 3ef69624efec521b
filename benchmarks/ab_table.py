"""Side-by-side phase times of spec_phase_bench runs of two variants, several rounds each.

    python benchmarks/ab_table.py OUT_DIR        # reads OUT_DIR/TAG_VARIANT_ROUND.json

Each file is one `spec_phase_bench.py --out` run; TAG names the target (e.g. 8b, smol), VARIANT
the code or option set (e.g. base, new), ROUND the repetition (rounds alternate the variants, so
machine drift hits both). Per (tag, shape, batch, phase) it prints each variant's rounds and the
ratio of the fastest round of the second variant to that of the first: phase replays of one
graph differ by 10-20 % between rounds, so only ratios that agree across rows mean something.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path


def main(out: str) -> None:
    times: dict[tuple, list[float]] = collections.defaultdict(list)
    variants: list[str] = []
    for f in sorted(Path(out).glob("*_*_*.json")):
        tag, variant, _ = f.stem.split("_")
        if variant not in variants:
            variants.append(variant)
        for row in json.loads(f.read_text()):
            key = (tag, row["shape"], row["bs"])
            times[key + (row["phase"], variant)].append(row["ms"])
            if row["phase"] == "step":
                times[key + ("decode", variant)].append(row["decode_ms"])
    if len(variants) != 2:
        raise SystemExit(f"ab_table: two variants expected in {out}, found {variants}")
    a, b = variants
    print(f"{'tag':5} {'shape':7} {'bs':>3} {'phase':13} {a + ' ms':>17} {b + ' ms':>17} {b}/{a}")
    for key in sorted({k[:4] for k in times}):
        ta, tb = times.get(key + (a,)), times.get(key + (b,))
        if ta and tb:
            print(f"{key[0]:5} {key[1]:7} {key[2]:>3} {key[3]:13} "
                  f"{'/'.join(f'{t:.3f}' for t in ta):>17} {'/'.join(f'{t:.3f}' for t in tb):>17} "
                  f"{min(tb) / min(ta):.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
