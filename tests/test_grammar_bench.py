"""benchmarks/grammar_bench.py (JSON-schema requests, speculative against vanilla, grammar on and
off: issue 54's H200 benchmark) runs end to end on the CPU with the default model in float32:
a row per engine, batch size and grammar setting, answers validated against their schemas, the
grammar's host time counted (nested calls once), greedy speculative ids equal to vanilla's. Its
schemas compile and its validator tells valid answers from broken ones."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from hotspec.errors import HotspecError
from hotspec.models.loader import load_tokenizer, resolve_model_path
from hotspec.runtime.grammar import GrammarCompiler, RequestGrammar
from hotspec.sampling_params import GrammarSpec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import grammar_bench as gb  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPTS = Path(__file__).resolve().parent.parent / "hotspec" / "assets" / "prompts_small.jsonl"

GOOD: dict[str, dict[str, Any]] = {
    "tool_call": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius", "days": 3}},
    "record": {"title": "Mars", "author": "Ann", "year": 2020, "tags": ["space"]},
    "product": {"name": "Lamp", "price": 12.5, "in_stock": True, "categories": ["home"]},
    "steps": {"goal": "tea", "steps": [{"n": 1, "action": "boil water"}]},
}
# Small schemas for the end-to-end run, so answers complete within a few tokens.
TINY = {"flag": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                 "additionalProperties": False},
        "pick": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
                 "required": ["color"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler(load_tokenizer(resolve_model_path(None)), 49152)


def test_schemas_compile_and_validate(compiler: GrammarCompiler) -> None:
    assert set(GOOD) == set(gb.SCHEMAS) == set(gb.ASK)
    for name, schema in gb.SCHEMAS.items():
        compiler.compile(GrammarSpec("json_schema", json.dumps(schema)))
        assert gb.validate(GOOD[name], schema), name
        assert gb.check_answer(json.dumps(GOOD[name]), name, gb.validate) == {
            "json": True, "valid": True, "valid_embedded": True}
        for broken in _broken(GOOD[name]):
            assert not gb.validate(broken, schema), (name, broken)
    text = f"Sure:\n```json\n{json.dumps(GOOD['record'])}\n```"
    assert gb.check_answer(text, "record", gb.validate) == {"json": False, "valid": False,
                                                            "valid_embedded": True}
    assert gb.schema_names(6) == ["tool_call", "record", "product", "steps", "tool_call", "record"]


def _broken(value: dict[str, Any]) -> list[dict[str, Any]]:
    """`value` with a key dropped, a key added, and its first string made too long."""
    out = [{k: v for k, v in list(value.items())[1:]}, {**value, "extra": 1}]
    long = copy.deepcopy(value)
    for k, v in long.items():
        if isinstance(v, str):
            long[k] = v + "x" * 100
            out.append(long)
            break
    return out


def test_grammar_clock_counts_nested_calls_once(compiler: GrammarCompiler) -> None:
    real = RequestGrammar.__dict__["fill_after"]
    g = compiler.matcher(GrammarSpec("json_schema", json.dumps(TINY["flag"])))
    row = torch.empty(g.width, dtype=torch.int32)
    with gb.GrammarClock().install() as clock:
        assert RequestGrammar.__dict__["fill_after"] is not real
        g.fill_after([], row)  # (calls accept and fill inside: counted in fill_after alone)
        g.fill(row)
        assert g.accept([]) == 0
    assert dict(clock.calls) == {"fill_after": 1, "fill": 1, "accept": 1}
    assert clock.total() == pytest.approx(sum(clock.seconds.values())) and clock.total() > 0
    assert RequestGrammar.__dict__["fill_after"] is real  # restored on exit
    g.fill(row)
    assert clock.calls["fill"] == 1


def test_bad_spec_is_refused() -> None:
    from hotspec.config import EngineConfig

    cfg = EngineConfig(speculative_algorithm="EAGLE3", device="cpu")
    assert list(gb.engines(cfg, ["adaptive", "3/1/4"])) == ["vanilla", "adaptive", "3/1/4"]
    with pytest.raises(HotspecError):
        gb.engines(cfg, ["off"])
    with pytest.raises(HotspecError):
        gb.engines(cfg, ["3/x/4"])


def test_end_to_end_on_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(gb, "SCHEMAS", TINY)
    monkeypatch.setattr(gb, "ASK", {"flag": "Is the answer yes?", "pick": "Pick a colour."})
    out = tmp_path / "grammar.json"
    torch.manual_seed(0)
    rc = gb.main(["--dtype", "float32", "--device", "cpu", "--kv-cache-memory-gb", "0.05",
                  "--prompts", str(PROMPTS), "--num-prompts", "2", "--batch-sizes", "2", "1",
                  "--max-tokens", "12", "--warmup-tokens", "2", "--spec", "3/1/4", "--out", str(out)])
    assert rc == 0
    d = json.loads(out.read_text())
    assert list(d["results"]) == ["vanilla", "3/1/4"]
    assert [p["schema"] for p in d["prompts"]] == ["flag", "pick"]
    for name, per in d["results"].items():
        assert sorted(per) == ["1/off", "1/on", "2/off", "2/on"]
        for k, r in per.items():
            on = k.endswith("/on")
            assert r["requests"] == 2 and 0 < r["tokens"] <= 2 * 12
            gh = r["grammar_host"]
            assert (gh["calls"]["fill"] + gh["calls"]["fill_tree"] > 0) == on, (name, k)
            assert 0 <= gh["share_of_wall"] <= 1 and gh["total_s"] <= r["wall_s"]
            if on:  # every answer the grammar completed parses and validates
                js = r["json"]
                assert js["finished_stop"] >= 1
                assert js["valid"] == js["finished_stop"] == js["parsed"]
                assert gh["ms_per_decode_step"] is not None and gh["share_of_decode_step"] < 1
            if name == "vanilla":
                assert r["tau"] is None and r["verify_steps"] == 0
            else:
                assert r["tau"] >= 1 and set(r["steps_per_shape"]) == {"3/1/4"}
    s = d["summary"]
    assert s["greedy_equal_with_grammar"] is True and s["greedy_equal_without_grammar"] is True
    assert s["identical"]["1/on"] == {"3/1/4": 2} and s["identical"]["2/on"] == {"3/1/4": 2}
    assert set(s["x_vanilla"]["2/on"]) == {"3/1/4"} and s["on_vs_off"]["1"]["vanilla"] > 0
    table = capsys.readouterr().out
    rows = [line.split() for line in table.splitlines() if line.split()[:1] in (["vanilla"], ["3/1/4"])]
    assert {(r[0], r[1], r[2]) for r in rows if len(r) > 12} == {
        (n, b, g) for n in ("vanilla", "3/1/4") for b in ("1", "2") for g in ("on", "off")}
    assert "with the grammar True" in table
