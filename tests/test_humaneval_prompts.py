"""benchmarks/humaneval_prompts.py: HumanEval problems become a benchmark prompt file that the
benchmarks read, one user turn each, the function's signature and docstring inside."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import humaneval_prompts  # noqa: E402

from hotspec.benchmark.prompts import read_bench_prompts  # noqa: E402

PROBLEMS = [{"task_id": "HumanEval/0", "prompt": "def add(a, b):\n    \"\"\"Sum.\"\"\"\n",
             "entry_point": "add", "canonical_solution": "    return a + b\n", "test": ""},
            {"task_id": "HumanEval/1", "prompt": "def neg(a):\n", "entry_point": "neg",
             "canonical_solution": "    return -a\n", "test": ""}]


def test_problems_become_bench_prompts(tmp_path):
    src = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(src, "wt") as f:
        f.write("".join(json.dumps(p) + "\n" for p in PROBLEMS))
    out = tmp_path / "he.jsonl"
    assert humaneval_prompts.main(["--problems", str(src), "--out", str(out)]) == 0
    prompts = read_bench_prompts(out)
    assert [p.question_id for p in prompts] == ["HumanEval/0", "HumanEval/1"]
    assert {p.category for p in prompts} == {"humaneval"}
    text = prompts[0].text
    assert text is not None and "```python\ndef add(a, b):\n    \"\"\"Sum.\"\"\"\n```" in text
    assert "canonical" not in out.read_text() and "return a + b" not in out.read_text()
