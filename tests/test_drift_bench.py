"""benchmarks/drift_bench.py: the stream, its windows and how fast the adaptive policy follows."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import drift_bench  # noqa: E402

from hotspec.errors import HotspecError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def test_steps_to_follow_counts_decode_steps_to_the_kept_shape():
    ev = [(0.0, 1, None), (0.1, 1, "3/1/4"), (0.2, 2, "3/1/4"), (0.3, 1, None), (0.4, 3, "3/1/4"),
          (0.5, 1, "off"), (0.6, 2, "3/1/4")] + [(0.7 + i / 10, 1, "off") for i in range(6)]
    assert drift_bench.steps_to_follow(ev, 3) == (3, "3/1/4", "off")
    assert drift_bench.steps_to_follow([(0.0, 1, None)] * 4, 2) == (None, None, None)
    # single steps of another shape inside the kept one are probes: the policy followed at once
    probes = [(0.1, 1, "4/8/12"), (0.2, 1, "3/1/4")] + [(0.3, 2, "3/1/4")] * 9 + [(0.4, 1, "5/1/6")] + \
        [(0.5, 2, "3/1/4")] * 20
    assert drift_bench.steps_to_follow([(0.0, 1, "3/1/4")] + probes, 1) == (0, "3/1/4", "3/1/4")
    late = [(0.1, 2, "3/1/4")] * 5 + [(0.2, 1, "off")] * 20
    assert drift_bench.steps_to_follow([(0.0, 1, "3/1/4")] + late, 1) == (5, "3/1/4", "off")
    w = drift_bench.windows(ev, 0.5)
    assert [x["tokens"] for x in w] == [8, 6, 3] and w[0]["shape"] == "3/1/4" and w[1]["shape"] == "off"
    assert w[0]["tokens_per_s"] == 16.0


def test_stream_takes_each_phase_round_robin(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text("".join(f'{{"category": "{c}", "prompt_token_ids": [{j}, {i}]}}\n'
                         for j, c in enumerate("abc") for i in range(2)))
    prompts, switch = drift_bench.stream(f, ["a", "b"], ["c"], 3, None)
    assert switch == 3 and prompts == [[0, 0], [1, 0], [0, 1], [2, 0], [2, 1], [2, 0]]
    with pytest.raises(HotspecError, match="no prompts of categories"):
        drift_bench.stream(f, ["a"], ["z"], 2, None)
