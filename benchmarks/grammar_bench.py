"""Structured output under speculation (issue 54): JSON-schema requests, vanilla decoding against
speculative engines on one target, each with the grammar and without it, at each batch size.

    python benchmarks/grammar_bench.py --prompts ../shared/data/spec_bench_dev.jsonl \\
        --num-prompts 24 --batch-sizes 1 8 --max-tokens 256 --out out/grammar_h200.json

The prompts are Spec-Bench's (the first turn of `--num-prompts` records, taken round robin over
the categories), each followed by an instruction to answer with one JSON object matching a schema
whose text the prompt quotes: prompt i gets schema i mod 4 of SCHEMAS (a get_weather tool call,
a bibliographic extraction record, a product, a step list; every string bounded by maxLength so
answers end), rendered with the tokenizer's chat template. With the grammar each request carries
`SamplingParams(grammar=GrammarSpec("json_schema", schema))`; without it the same prompts run
free. Greedy.

Engines, one after the other around one target (no second copy): vanilla, then each `--spec`
(`adaptive`: the default adaptive engine; `S/K/N`: that fixed shape; default `adaptive 3/1/4`).
Without --speculative-algorithm the default model speculates with its shipped EAGLE-3 head. Each
engine runs every batch size, grammar on then off; each of those passes after the same untimed
warm-up (every batch of the pass prefilled alone with one token, then its first batch for
--warmup-tokens tokens, with the pass's own parameters), the schemas compiled once per engine
beforehand (the compile time is reported apart). At batch size B the timed pass is `--rounds`
times the prompt list (repeated from its start to fill the last batch) cut into batches of B, each
submitted together and run to its end, as offline batch inference does.

Reported per engine, batch size and grammar on/off: tokens/s end to end (prefill included) and
decode only (the steps that did not prefill); ms per decode step; tau (generated tokens per verify
pass, the requests' RequestStats); the share of answers that parse as JSON and validate against
their schema (the `jsonschema` package when importable, else validate() below: types, required
and additional keys, enums, bounds), and that finished because the grammar completed; the
grammar's host cost: the seconds spent in RequestGrammar.fill, fill_tree, fill_after and accept
(timed here by wrapping the class's methods; nested calls counted once), as a share of the pass's
wall time and, split by the step they ran in, per decode step (ms and share of the step: the
issue's bound is 10 %), beside LogitsState.fill_grammar* (the same plus the host buffers and
their copy to the device). Then the speculative engines against vanilla with the same grammar,
grammar on against off per engine, and whether greedy speculative token ids equal vanilla's
(expected with --dtype float32; bf16 may differ by rounding). Prints a table last; `--out` writes
every number and the answers' text.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import wraps
from pathlib import Path
from typing import Any

from hotspec.benchmark.device import device_name, sync
from hotspec.benchmark.prompts import prompt_ids, read_bench_prompts
from hotspec.benchmark.script import run_script
from hotspec.benchmark.spec_bench import load_target, run_with_engine
from hotspec.cli.engine_args import add_engine_args, engine_config
from hotspec.config import EngineConfig
from hotspec.core.request import Request
from hotspec.core.spec_shape import SpecShape
from hotspec.core.spec_stats import SpecStats
from hotspec.engine.engine import Engine
from hotspec.errors import HotspecError
from hotspec.runtime.grammar import GrammarCompiler, RequestGrammar
from hotspec.runtime.logits_state import LogitsState
from hotspec.sampling_params import GrammarSpec, SamplingParams

# -- schemas and prompts ---------------------------------------------------------------------------

SCHEMAS: dict[str, dict[str, Any]] = {
    "tool_call": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "enum": ["get_weather"]},
            "arguments": {
                "type": "object",
                "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 32},
                               "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                               "days": {"type": "integer", "minimum": 1, "maximum": 14}},
                "required": ["city", "unit", "days"], "additionalProperties": False}},
        "required": ["name", "arguments"], "additionalProperties": False},
    "record": {
        "type": "object",
        "properties": {"title": {"type": "string", "minLength": 1, "maxLength": 64},
                       "author": {"type": "string", "minLength": 1, "maxLength": 40},
                       "year": {"type": "integer", "minimum": 1000, "maximum": 2100},
                       "tags": {"type": "array", "items": {"type": "string", "maxLength": 20},
                                "minItems": 1, "maxItems": 5}},
        "required": ["title", "author", "year", "tags"], "additionalProperties": False},
    "product": {
        "type": "object",
        "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 40},
                       "price": {"type": "number", "minimum": 0, "maximum": 100000},
                       "in_stock": {"type": "boolean"},
                       "categories": {"type": "array", "items": {"type": "string", "maxLength": 20},
                                      "minItems": 1, "maxItems": 4}},
        "required": ["name", "price", "in_stock", "categories"], "additionalProperties": False},
    "steps": {
        "type": "object",
        "properties": {"goal": {"type": "string", "minLength": 1, "maxLength": 64},
                       "steps": {"type": "array", "minItems": 1, "maxItems": 5,
                                 "items": {"type": "object",
                                           "properties": {"n": {"type": "integer", "minimum": 1,
                                                                "maximum": 5},
                                                          "action": {"type": "string", "minLength": 1,
                                                                     "maxLength": 60}},
                                           "required": ["n", "action"],
                                           "additionalProperties": False}}},
        "required": ["goal", "steps"], "additionalProperties": False},
}

ASK = {
    "tool_call": "Before answering, call the weather tool for the place that matters most to the "
                 "request above (pick a city if none is named).",
    "record": "Instead of answering in full, give a catalogue record for the answer you would write "
              "(a title, an author, a year and a few tags).",
    "product": "Instead of answering in full, describe one product that would help with the request "
               "above, as a shop's catalogue entry.",
    "steps": "Instead of answering in full, give a short plan: the goal and at most five numbered "
             "steps.",
}


def schema_names(n: int) -> list[str]:
    """The schema of each of `n` prompts: SCHEMAS in turn."""
    names = list(SCHEMAS)
    return [names[i % len(names)] for i in range(n)]


def json_prompt(text: str, schema: str) -> str:
    """A Spec-Bench prompt followed by the instruction to answer as JSON matching `schema`."""
    return (f"{text}\n\n{ASK[schema]} Reply with a single JSON object and nothing else (no code "
            f"fence, no comment), matching this JSON schema:\n{json.dumps(SCHEMAS[schema])}")


@dataclass(frozen=True)
class JsonPrompt:
    question_id: Any
    category: str
    schema: str
    token_ids: tuple[int, ...]


def load_prompts(path: Path, num_prompts: int, tokenizer: Any) -> list[JsonPrompt]:
    """`num_prompts` prompts of the file (round robin over its categories) asking for JSON, through
    the tokenizer's chat template."""
    if tokenizer is None:
        raise HotspecError("structured output needs the tokenizer: drop --skip-tokenizer-init")
    records = read_bench_prompts(path, num_prompts)
    if any(r.text is None for r in records):
        raise HotspecError(f"{path}: give the prompts as text (`turns` or `prompt`), not token ids: "
                           "the JSON instruction is appended to the text")
    out = []
    for r, s in zip(records, schema_names(len(records))):
        assert r.text is not None
        ids = prompt_ids(replace(r, text=json_prompt(r.text, s)), tokenizer, True)
        out.append(JsonPrompt(r.question_id, r.category, s, tuple(ids)))
    return out


def grammar_of(schema: str) -> GrammarSpec:
    return GrammarSpec("json_schema", json.dumps(SCHEMAS[schema]))


# -- validation ------------------------------------------------------------------------------------

_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool)
                         or isinstance(v, float) and v.is_integer(),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}


def validate(value: Any, schema: dict[str, Any]) -> bool:
    """Whether `value` satisfies `schema`, for the keywords SCHEMAS use (type, enum, const,
    properties, required, additionalProperties, items, min/maxItems, min/maxLength,
    minimum/maximum)."""
    t = schema.get("type")
    if t is not None and not _TYPES[t](value):
        return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if "const" in schema and value != schema["const"]:
        return False
    if isinstance(value, str):
        return schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", math.inf)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return schema.get("minimum", -math.inf) <= value <= schema.get("maximum", math.inf)
    if isinstance(value, list):
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", math.inf):
            return False
        items = schema.get("items")
        return items is None or all(validate(v, items) for v in value)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        if any(k not in value for k in schema.get("required", ())):
            return False
        if schema.get("additionalProperties", True) is False and any(k not in props for k in value):
            return False
        return all(validate(v, props[k]) for k, v in value.items() if k in props)
    return True


def _validator() -> Callable[[Any, dict[str, Any]], bool]:
    """jsonschema's check when the package is there, else validate()."""
    try:
        import jsonschema
    except ImportError:
        return validate

    def check(value: Any, schema: dict[str, Any]) -> bool:
        return bool(jsonschema.Draft202012Validator(schema).is_valid(value))
    return check


VALIDATOR = "jsonschema" if _validator() is not validate else "validate()"


def embedded_json(text: str) -> Any:
    """The first JSON object in `text` (a free answer may wrap it in prose or a code fence);
    raises ValueError when there is none."""
    dec = json.JSONDecoder()
    i = text.find("{")
    while i >= 0:
        try:
            return dec.raw_decode(text, i)[0]
        except ValueError:
            i = text.find("{", i + 1)
    raise ValueError("no JSON object")


def check_answer(text: str, schema: str, check: Callable[[Any, dict[str, Any]], bool]
                 ) -> dict[str, bool]:
    """`json`: the whole text parses; `valid`: and validates against the schema; `valid_embedded`:
    the first JSON object inside the text validates (what a lenient client would extract)."""
    out = {"json": False, "valid": False, "valid_embedded": False}
    try:
        value = json.loads(text)
        out["json"] = True
        out["valid"] = check(value, SCHEMAS[schema])
    except ValueError:
        pass
    try:
        out["valid_embedded"] = check(embedded_json(text), SCHEMAS[schema])
    except ValueError:
        pass
    return out


# -- the grammar's host time -----------------------------------------------------------------------

GRAMMAR_METHODS = ("fill", "fill_tree", "fill_after", "accept")
STATE_METHODS = ("fill_grammar", "fill_grammar_tree", "fill_grammar_after")


@dataclass
class GrammarClock:
    """Seconds and calls of the wrapped methods, summed since `install`; nested calls of the same
    group (fill_after calls accept and fill) count once, in the outer method."""

    seconds: Counter[str] = field(default_factory=Counter)
    calls: Counter[str] = field(default_factory=Counter)
    _depth: dict[str, int] = field(default_factory=lambda: Counter())

    def total(self, methods: tuple[str, ...] = GRAMMAR_METHODS) -> float:
        return float(sum(self.seconds[m] for m in methods))

    def _wrap(self, group: str, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth[group]:
                return fn(*args, **kwargs)
            self._depth[group] += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                # (Counter's stubs only know int counts; float seconds work the same at runtime)
                self.seconds[name] += time.perf_counter() - t0  # type: ignore[assignment]
                self.calls[name] += 1
                self._depth[group] -= 1
        return timed

    @contextmanager
    def install(self) -> Iterator[GrammarClock]:
        """RequestGrammar's and LogitsState's grammar methods and GrammarCompiler.compile wrapped
        with this clock (the classes themselves: every engine's instances), restored on exit."""
        patched: list[tuple[type, str, str]] = [(RequestGrammar, m, "grammar") for m in GRAMMAR_METHODS]
        patched += [(LogitsState, m, "state") for m in STATE_METHODS]
        patched += [(GrammarCompiler, "compile", "compile")]
        saved = [(cls, m, cls.__dict__[m]) for cls, m, _ in patched]
        try:
            for cls, m, group in patched:
                setattr(cls, m, self._wrap(group, m, cls.__dict__[m]))
            yield self
        finally:
            for cls, m, fn in saved:
                setattr(cls, m, fn)

    def snapshot(self) -> tuple[Counter[str], Counter[str]]:
        return Counter(self.seconds), Counter(self.calls)


# -- running ---------------------------------------------------------------------------------------


@dataclass
class Pass:
    """One batch submitted together and stepped to its end (spec_bench.drive, with a
    SamplingParams per prompt and the grammar clock read around every step)."""

    wall_s: float
    prefill_s: float
    prefill_tokens: int
    decode_steps: int
    reqs: list[Request]
    grammar_s: Counter[str]  # seconds per method over the pass
    grammar_calls: Counter[str]
    grammar_decode_s: float  # RequestGrammar's seconds inside decode steps
    state_decode_s: float  # LogitsState.fill_grammar*'s seconds inside decode steps
    stats: SpecStats | None


def _delta(before: SpecStats, after: SpecStats) -> SpecStats:
    return SpecStats(accept_hist=after.accept_hist - before.accept_hist,
                     phase_calls=after.phase_calls - before.phase_calls,
                     shape_steps=after.shape_steps - before.shape_steps)


def drive(engine: Engine, prompts: list[list[int]], params: list[SamplingParams],
          clock: GrammarClock) -> Pass:
    """Submit `prompts` (each with its params) together and step the engine until it is idle;
    steps that prefill are timed apart between device syncs (as spec_bench.drive does)."""
    ws = engine.worker.spec_stats
    before = _delta(SpecStats(), ws) if ws is not None else None
    dev = engine.device
    g0, c0 = clock.snapshot()
    prefill_s, prefill_tokens, decode_steps = 0.0, 0, 0
    grammar_decode, state_decode = 0.0, 0.0
    sync(dev)
    start = time.perf_counter()
    reqs = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    while engine.has_unfinished():
        waiting, prefilling = len(engine.waiting), len(engine.prefilling)
        may_admit = waiting and len(engine.running) + prefilling < engine.cfg.max_num_seqs
        pending = {id(r) for r in (*engine.waiting, *engine.prefilling)} if prefilling or may_admit else set()
        if pending:
            sync(dev)
        g, s = clock.total(), clock.total(STATE_METHODS)
        t0 = time.perf_counter()
        outs = engine.step()
        if prefilling or len(engine.waiting) < waiting:
            sync(dev)
            prefill_s += time.perf_counter() - t0
            prefill_tokens += sum(len(o.new_token_ids) for o in outs if id(o.request) in pending)
        else:
            decode_steps += 1
            grammar_decode += clock.total() - g
            state_decode += clock.total(STATE_METHODS) - s
    wall = time.perf_counter() - start
    g1, c1 = clock.snapshot()
    stats = _delta(before, ws) if ws is not None and before is not None else None
    return Pass(wall, prefill_s, prefill_tokens, decode_steps, reqs, g1 - g0, c1 - c0,
                grammar_decode, state_decode, stats)


def batches(prompts: list[JsonPrompt], b: int, rounds: int) -> list[list[JsonPrompt]]:
    """`rounds` times the prompts, the list repeated from its start to fill the last batch of b."""
    n = math.ceil(len(prompts) / b) * b
    full = [prompts[i % len(prompts)] for i in range(n)]
    return [full[i:i + b] for i in range(0, n, b)] * rounds


def params_of(batch: list[JsonPrompt], grammar: bool, max_tokens: int) -> list[SamplingParams]:
    return [SamplingParams(temperature=0.0, max_tokens=max_tokens,
                           grammar=grammar_of(p.schema) if grammar else None) for p in batch]


def warm_up(engine: Engine, bs: list[list[JsonPrompt]], grammar: bool, tokens: int,
            clock: GrammarClock) -> None:
    """Untimed: every batch of the pass prefilled (one token each), then its first batch for
    `tokens` tokens, with the pass's parameters."""
    for batch in dict.fromkeys(tuple(b) for b in bs):
        drive(engine, [list(p.token_ids) for p in batch], params_of(list(batch), grammar, 1), clock)
    if tokens > 0:
        drive(engine, [list(p.token_ids) for p in bs[0]], params_of(bs[0], grammar, tokens), clock)


def summarise(runs: list[Pass], bs: list[list[JsonPrompt]], grammar: bool,
              check: Callable[[Any, dict[str, Any]], bool]) -> dict[str, Any]:
    """A timed pass's numbers (see the module doc); `outputs` (token ids) and `answers` (text)
    per request in submission order."""
    reqs = [r for run in runs for r in run.reqs]
    prompts = [p for b in bs for p in b]
    tokens = sum(len(r.output_token_ids) for r in reqs)
    wall = sum(r.wall_s for r in runs)
    prefill_s = sum(r.prefill_s for r in runs)
    decode_s = wall - prefill_s
    decode_tokens = tokens - sum(r.prefill_tokens for r in runs)
    decode_steps = sum(r.decode_steps for r in runs)
    verify = sum(r.stats.spec_steps for r in reqs)
    gs: Counter[str] = Counter()
    gc: Counter[str] = Counter()
    for run in runs:
        gs += run.grammar_s
        gc += run.grammar_calls
    g_total = float(sum(gs[m] for m in GRAMMAR_METHODS))
    g_state = float(sum(gs[m] for m in STATE_METHODS))
    g_decode = sum(r.grammar_decode_s for r in runs)
    s_decode = sum(r.state_decode_s for r in runs)
    spec = [r.stats for r in runs if r.stats is not None]
    shapes: Counter[str] = Counter()
    hist: Counter[int] = Counter()
    for s in spec:
        shapes += s.shape_steps
        hist += s.accept_hist
    answers = []
    for p, r in zip(prompts, reqs):
        text = r.checker.text if r.checker is not None else ""
        answers.append({"question_id": p.question_id, "category": p.category, "schema": p.schema,
                        "finish_reason": r.finish_reason, "tokens": len(r.output_token_ids),
                        **check_answer(text, p.schema, check), "text": text})
    n = len(answers)
    return {
        "grammar": grammar, "requests": n, "tokens": tokens, "wall_s": wall, "prefill_s": prefill_s,
        "decode_s": decode_s, "decode_tokens": decode_tokens, "decode_steps": decode_steps,
        "tokens_per_s": _rate(tokens, wall), "decode_tokens_per_s": _rate(decode_tokens, decode_s),
        "ms_per_decode_step": _rate(decode_s * 1e3, decode_steps),
        "verify_steps": verify, "tau": _rate(tokens, verify) if spec else None,
        "tau_speculative_steps": _rate(sum(a * k for a, k in hist.items()), sum(hist.values()))
        if spec else None,
        "steps_per_shape": dict(shapes), "accept_hist": dict(sorted(hist.items())),
        "grammar_host": {
            "seconds": {m: gs[m] for m in GRAMMAR_METHODS}, "calls": {m: gc[m] for m in GRAMMAR_METHODS},
            "total_s": g_total, "share_of_wall": _rate(g_total, wall),
            "decode_s": g_decode, "ms_per_decode_step": _rate(g_decode * 1e3, decode_steps),
            "share_of_decode_step": _rate(g_decode, decode_s),
            "with_buffers_s": g_state, "with_buffers_seconds": {m: gs[m] for m in STATE_METHODS},
            "with_buffers_decode_s": s_decode,
            "with_buffers_share_of_decode_step": _rate(s_decode, decode_s),
            "compile_s": gs["compile"]},
        "json": {"parsed": sum(a["json"] for a in answers), "valid": sum(a["valid"] for a in answers),
                 "valid_embedded": sum(a["valid_embedded"] for a in answers),
                 "finished_stop": sum(a["finish_reason"] == "stop" for a in answers),
                 "valid_share": _rate(sum(a["valid"] for a in answers), n)},
        "outputs": [list(r.output_token_ids) for r in reqs], "answers": answers}


def run_engine(engine: Engine, prompts: list[JsonPrompt], sizes: list[int], rounds: int,
               max_tokens: int, warmup_tokens: int, clock: GrammarClock,
               check: Callable[[Any, dict[str, Any]], bool]) -> dict[str, Any]:
    """Every batch size, grammar on then off, each pass after its warm-up; the schemas compiled
    first (untimed; their seconds reported as `compile_s`)."""
    c0 = clock.seconds["compile"]
    for s in SCHEMAS:
        engine.grammars.matcher(SamplingParams(grammar=grammar_of(s)))
    out: dict[str, Any] = {"compile_s": clock.seconds["compile"] - c0, "passes": {}}
    for b in sizes:
        bs = batches(prompts, b, rounds)
        for grammar in (True, False):
            warm_up(engine, bs, grammar, min(warmup_tokens, max_tokens), clock)
            runs = [drive(engine, [list(p.token_ids) for p in batch], params_of(batch, grammar, max_tokens),
                          clock) for batch in bs]
            out["passes"][key(b, grammar)] = summarise(runs, bs, grammar, check)
    return out


def key(b: int, grammar: bool) -> str:
    return f"{b}/{'on' if grammar else 'off'}"


def engines(cfg: EngineConfig, spec: list[str]) -> dict[str, EngineConfig]:
    """vanilla and each of `spec` (`adaptive`, or a fixed shape S/K/N)."""
    out = {"vanilla": replace(cfg, speculative_algorithm=None, speculative_draft_model_path=None,
                              speculative_token_map=None, speculative_num_steps=None,
                              speculative_eagle_topk=None, speculative_num_draft_tokens=None,
                              speculative_adaptive=None)}
    for name in spec:
        if name == "adaptive":
            out[name] = replace(cfg, speculative_adaptive=True)
            continue
        try:
            s = SpecShape.parse(name)
        except ValueError as e:
            raise HotspecError(f"--spec {name!r}: {e}") from None
        if s.off:
            raise HotspecError("--spec off is vanilla decoding, which always runs")
        out[s.label] = replace(cfg, speculative_num_steps=s.num_steps, speculative_eagle_topk=s.topk,
                               speculative_num_draft_tokens=s.num_draft_tokens,
                               speculative_adaptive=False)
    return out


# -- report ----------------------------------------------------------------------------------------


def _rate(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def _f(v: float | None, spec: str, suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def _frac(a: int | None, n: int) -> str:
    return "-" if a is None else f"{a}/{n}"


def table(results: dict[str, dict[str, Any]], sizes: list[int]) -> tuple[list[str], dict[str, Any]]:
    """The printed table and the summary: per batch size and grammar on/off, each engine's
    tokens/s as a multiple of vanilla's and its greedy agreement with vanilla; per engine and
    batch size, grammar on against off; the worst grammar share of a decode step."""
    names = list(results)
    summary: dict[str, Any] = {"x_vanilla": {}, "decode_x_vanilla": {}, "identical": {},
                               "on_vs_off": {}, "decode_on_vs_off": {}}
    head = (f"{'engine':<10} {'batch':>5} {'gram':>4} {'tok/s':>8} {'dec tok/s':>9} {'x van':>6} "
            f"{'on/off':>6} {'tau':>5} {'ms/step':>8} {'gram ms':>8} {'gram %':>6} {'% wall':>6} "
            f"{'valid':>7} {'stop':>7} {'same':>7}")
    lines = [head]
    for b in sizes:
        for grammar in (True, False):
            k = key(b, grammar)
            v = results["vanilla"]["passes"][k]
            for n in names:
                r = results[n]["passes"][k]
                other = results[n]["passes"][key(b, not grammar)]
                x = r["tokens_per_s"] / v["tokens_per_s"] if n != "vanilla" else None
                dx = (r["decode_tokens_per_s"] / v["decode_tokens_per_s"]
                      if n != "vanilla" and r["decode_tokens_per_s"] and v["decode_tokens_per_s"]
                      else None)
                onoff = r["tokens_per_s"] / other["tokens_per_s"] if grammar else None
                same = (sum(a == w for a, w in zip(r["outputs"], v["outputs"]))
                        if n != "vanilla" else None)
                if n != "vanilla":
                    summary["x_vanilla"].setdefault(k, {})[n] = x
                    summary["decode_x_vanilla"].setdefault(k, {})[n] = dx
                    summary["identical"].setdefault(k, {})[n] = same
                if grammar:
                    summary["on_vs_off"].setdefault(str(b), {})[n] = onoff
                    d_on, d_off = r["decode_tokens_per_s"], other["decode_tokens_per_s"]
                    summary["decode_on_vs_off"].setdefault(str(b), {})[n] = (
                        d_on / d_off if d_on and d_off else None)
                gh, js, req = r["grammar_host"], r["json"], r["requests"]
                g_ms = gh["ms_per_decode_step"] if grammar else None
                g_step = gh["share_of_decode_step"] if grammar else None
                g_wall = gh["share_of_wall"] if grammar else None
                lines.append(
                    f"{n:<10} {b:>5} {'on' if grammar else 'off':>4} {r['tokens_per_s']:>8.1f} "
                    f"{_f(r['decode_tokens_per_s'], '.1f'):>9} {_f(x, '.2f', 'x'):>6} "
                    f"{_f(onoff, '.2f', 'x'):>6} {_f(r['tau'], '.2f'):>5} "
                    f"{_f(r['ms_per_decode_step'], '.2f'):>8} {_f(g_ms, '.3f'):>8} "
                    f"{_f(g_step and g_step * 100, '.1f'):>6} {_f(g_wall and g_wall * 100, '.1f'):>6} "
                    f"{_frac(js['valid'], req):>7} {_frac(js['finished_stop'], req):>7} "
                    f"{_frac(same, req):>7}")
    shapes = []
    for b in sizes:
        for grammar in (True, False):
            for n in names:
                steps = results[n]["passes"][key(b, grammar)]["steps_per_shape"]
                if steps:
                    shapes.append(f"{n:<10} {b:>5} {'on' if grammar else 'off':>4}  " + ", ".join(
                        f"{s} {c}" for s, c in sorted(steps.items(), key=lambda kv: -kv[1])))
    if shapes:
        lines += ["", "speculative engines' steps per shape (`off`: plain decoding)", *shapes]
    spec = [n for n in names if n != "vanilla"]
    on = [results[n]["passes"][key(b, True)] for n in names for b in sizes]
    shares = [r["grammar_host"]["share_of_decode_step"] for r in on
              if r["grammar_host"]["share_of_decode_step"] is not None]
    summary["max_grammar_share_of_decode_step"] = max(shares) if shares else None
    summary["grammar_within_10_percent"] = bool(shares) and max(shares) <= 0.10
    summary["greedy_equal_with_grammar"] = all(
        summary["identical"][key(b, True)][n] == results[n]["passes"][key(b, True)]["requests"]
        for n in spec for b in sizes)
    summary["greedy_equal_without_grammar"] = all(
        summary["identical"][key(b, False)][n] == results[n]["passes"][key(b, False)]["requests"]
        for n in spec for b in sizes)
    summary["valid_with_grammar"] = {n: {str(b): results[n]["passes"][key(b, True)]["json"]["valid_share"]
                                         for b in sizes} for n in names}
    return lines, summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p)
    p.add_argument("--prompts", required=True, type=Path,
                   help="Spec-Bench-style jsonl (text prompts: `turns` or `prompt`)")
    p.add_argument("--num-prompts", type=int, default=24,
                   help="prompts taken from the file, round robin over its categories")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--rounds", type=int, default=1, help="timed passes over the prompts per batch size")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--warmup-tokens", type=int, default=32,
                   help="tokens of the untimed batch before each timed pass")
    p.add_argument("--spec", nargs="+", default=["adaptive", "3/1/4"], metavar="ENGINE",
                   help="speculative engines beside vanilla: `adaptive` or a fixed shape S/K/N")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.num_prompts < 1 or args.rounds < 1 or args.max_tokens < 1 or min(args.batch_sizes) < 1:
        raise HotspecError("--num-prompts, --rounds, --max-tokens and --batch-sizes must be >= 1")
    sizes = sorted(set(args.batch_sizes))
    cfg = replace(engine_config(args, default_head=True), max_num_seqs=sizes[-1])
    if cfg.speculative_algorithm is None:
        raise HotspecError("pass --speculative-algorithm (and a head unless the model is the default)")
    target = load_target(cfg)
    prompts = load_prompts(args.prompts, args.num_prompts, target.tokenizer)
    check = _validator()
    results: dict[str, dict[str, Any]] = {}
    with GrammarClock().install() as clock:
        for name, ecfg in engines(cfg, args.spec).items():
            print(f"engine {name}", file=sys.stderr, flush=True)
            results[name] = run_with_engine(ecfg, target, lambda e: run_engine(
                e, prompts, sizes, args.rounds, args.max_tokens, args.warmup_tokens, clock, check))
            print("  tokens/s by batch/grammar: " + ", ".join(
                f"{k}: {r['tokens_per_s']:.1f}" for k, r in results[name]["passes"].items()),
                file=sys.stderr, flush=True)
    lines, summary = table(results, sizes)
    dev = device_name(target.model.lm_head.weight.device)
    dtype = str(target.model.lm_head.weight.dtype).removeprefix("torch.")
    lengths = [len(q.token_ids) for q in prompts]
    head = (f"{dev}, {dtype}; {len(prompts)} prompts ({min(lengths)}-{max(lengths)} tokens), schemas "
            f"{', '.join(SCHEMAS)} in turn; {args.max_tokens} tokens a request at most, greedy, "
            f"{args.rounds} round(s); validated by {VALIDATOR}")
    worst = summary["max_grammar_share_of_decode_step"]
    foot = [
        "grammar host time (RequestGrammar fill/fill_tree/fill_after/accept) per decode step, worst: "
        f"{_f(worst and worst * 100, '.2f', ' %')} of the step "
        f"({'within' if summary['grammar_within_10_percent'] else 'OVER'} the 10 % bound)",
        "greedy speculative token ids == vanilla's: with the grammar "
        f"{summary['greedy_equal_with_grammar']}, without {summary['greedy_equal_without_grammar']}"
        + ("" if dtype == "float32" else f" ({dtype}: rounding may differ; exact in float32)"),
        "tok/s: end to end; dec tok/s: decode steps only; x van: tok/s over vanilla's with the same "
        "grammar setting; on/off: grammar on over off; tau: generated tokens per verify pass; gram "
        "ms, gram %: the grammar's host time per decode step and its share of the step; % wall: its "
        "share of the pass; valid: answers that parse and match their schema; stop: finished by the "
        "grammar or EOS, not max tokens; same: token ids == vanilla's"]
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "benchmark": "benchmarks/grammar_bench.py", "argv": sys.argv[1:] if argv is None else argv,
            "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": dev,
            "dtype": dtype, "validator": VALIDATOR, "schemas": SCHEMAS,
            "prompts": [{"question_id": q.question_id, "category": q.category, "schema": q.schema,
                         "tokens": len(q.token_ids)} for q in prompts],
            "engines": {n: {"compile_s": r["compile_s"]} for n, r in results.items()},
            "summary": summary,
            "results": {n: {k: {f: v for f, v in r.items() if f != "outputs"}
                            for k, r in per["passes"].items()} for n, per in results.items()}},
            indent=1, default=str))
    print(head)
    print("\n".join(lines))
    print("\n".join(foot))
    return 0


if __name__ == "__main__":
    run_script(main)
