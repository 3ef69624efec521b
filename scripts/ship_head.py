"""Make a trained head the default model's head: `python scripts/ship_head.py DIR [--note TEXT]`.

Copies DIR's config.json and model.safetensors (a `hotspec train-draft` output, EAGLE-3 format)
into hotspec/assets/smollm2-eagle3/ and writes a compact train_report.json beside them: the
report of DIR with its per-step histories (loss, step_loss, step_acc, lr) replaced by their means
over each 100 optimizer steps, so the repo keeps kilobytes, not the whole curve.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

ASSET = Path(__file__).resolve().parent.parent / "hotspec" / "assets" / "smollm2-eagle3"
PER_STEP = ("loss", "step_loss", "step_acc", "lr")


def means_per_100(values: list[Any]) -> list[Any]:
    out = []
    for i in range(0, len(values), 100):
        chunk = values[i:i + 100]
        if isinstance(chunk[0], list):  # one value per TTT step
            out.append([round(sum(c[k] for c in chunk) / len(chunk), 4) for k in range(len(chunk[0]))])
        else:
            out.append(round(sum(chunk) / len(chunk), 6))
    return out


def compact(report: dict[str, Any]) -> dict[str, Any]:
    training = dict(report["training"])
    for key in PER_STEP:
        if training.get(key):
            training[f"{key}_mean_per_100_steps"] = means_per_100(training.pop(key))
    return dict(report, training=training)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("head", type=Path, help="a train-draft output folder")
    ap.add_argument("--note", default=None, help="a line kept in the report (how it was trained)")
    ap.add_argument("--into", type=Path, default=ASSET, help="where the default head lives")
    args = ap.parse_args(argv)
    report = json.loads((args.head / "train_report.json").read_text())
    if report.get("target") != "default (SmolLM2-135M-Instruct)":
        raise SystemExit(f"{args.head} was trained for {report.get('target')!r}, not the default model")
    args.into.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(args.head / name, args.into / name)
    out = compact(report)
    if args.note:
        out["note"] = args.note
    (args.into / "train_report.json").write_text(json.dumps(out, indent=1) + "\n")
    size = (args.into / "model.safetensors").stat().st_size / 1e6
    print(f"{args.head} -> {args.into} ({size:.1f} MB)")


if __name__ == "__main__":
    main()
