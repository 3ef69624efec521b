"""lab/sharegpt_prompts.py: first user turns of a ShareGPT file, filtered by length and ASCII."""

from __future__ import annotations

import json
from pathlib import Path

from script_utils import load_script


def _script():  # type: ignore[no-untyped-def]
    return load_script("lab/sharegpt_prompts.py")


def test_filters_and_writes_jsonl(tmp_path: Path) -> None:
    firsts = ["short", "a prompt of a good length", "x" * 1501, "中文的问题中文的问题中文的问题中文的问题",
              "mostly ascii with one é in forty-odd characters", "a prompt of a good length"]
    convs = [{"id": str(i), "conversations": [{"from": "human", "value": t},
                                              {"from": "gpt", "value": "ignored answer"}]}
             for i, t in enumerate(firsts)]
    src = tmp_path / "sg.json"
    text = json.dumps(convs)
    src.write_text(text + text[:40], encoding="utf-8")  # a broken tail, as the package ships
    out = tmp_path / "p.jsonl"
    assert _script().main(["--json", str(src), "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert rows == [{"prompt": "a prompt of a good length"},
                    {"prompt": "mostly ascii with one é in forty-odd characters"}]
