"""Turn benchmark passes into numbers: per category and overall tau, tokens/s, speedup, phase
breakdown, acceptance histogram, hot-set coverage and greedy agreement; then bench.json, bench.png
and the printed table."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hotspec.benchmark.hf_baseline import HFRun
from hotspec.benchmark.modes import NOT_PROFILED
from hotspec.benchmark.prompts import BenchPrompt
from hotspec.benchmark.spec_bench import BatchRun
from hotspec.core.spec_stats import SpecStats

OVERALL = "overall"


def _rate(tokens: int, seconds: float) -> float | None:
    return tokens / seconds if seconds > 0 else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def mode_summary(runs: list[BatchRun]) -> dict[str, Any]:
    """Tokens/s end to end (prefill included) and decode-only (the steps that did not prefill)."""
    tokens = sum(r.generated for r in runs)
    wall = sum(r.wall_s for r in runs)
    prefill_s = sum(r.prefill_s for r in runs)
    decode_tokens = tokens - sum(r.prefill_tokens for r in runs)
    return {"requests": sum(len(r.outputs) for r in runs), "generated_tokens": tokens,
            "wall_s": wall, "tokens_per_s": _rate(tokens, wall), "prefill_s": prefill_s,
            "decode_s": wall - prefill_s, "decode_tokens": decode_tokens,
            "decode_tokens_per_s": _rate(decode_tokens, wall - prefill_s),
            "decode_steps": sum(r.decode_steps for r in runs)}


def ci95(values: list[float]) -> float | None:
    """Half-width of the 95 % confidence interval of the mean of `values` (normal approximation
    over requests, sample standard deviation); None for fewer than two values."""
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return 1.96 * math.sqrt(var / n)


def merged_stats(runs: list[BatchRun]) -> SpecStats:
    total = SpecStats()
    for r in runs:
        if r.stats is None:
            continue
        total.accept_hist.update(r.stats.accept_hist)
        total.phase_calls.update(r.stats.phase_calls)
        total.phase_seconds.update(r.stats.phase_seconds)
        total.hot_hits += r.stats.hot_hits
        total.served += r.stats.served
        total.drafted += r.stats.drafted
        total.shape_steps.update(r.stats.shape_steps)
    return total


def spec_summary(runs: list[BatchRun]) -> dict[str, Any]:
    """tau two ways: the mean over requests of RequestStats.tau, and all generated tokens over all
    verify passes (both count each request's first token, sampled by prefill); plus the histogram
    of tokens emitted per verify pass and the share of served tokens inside the draft vocabulary."""
    taus = [t for r in runs for t in r.taus]
    steps = sum(s for r in runs for s in r.verify_steps)
    tokens = sum(r.generated for r in runs)
    stats = merged_stats(runs)
    hist = stats.accept_hist
    passes = sum(hist.values())
    return {"tau_mean": sum(taus) / len(taus) if taus else None, "tau_ci95": ci95(taus),
            "tau_total": _ratio(tokens, steps), "verify_steps": steps,
            "acceptance_by_depth": [{"depth": d, "reached": n, "accepted": k, "rate": k / n}
                                    for d, n, k in stats.acceptance_by_depth()],
            "accept_hist": {str(k): hist[k] for k in sorted(hist)},
            "accept_len_mean": _ratio(sum(k * v for k, v in hist.items()), passes),
            "hot_coverage": stats.hot_coverage, "hot_served_tokens": stats.served,
            "steps_per_shape": dict(stats.shape_steps.most_common())}


def phase_breakdown(runs: list[BatchRun], source: str) -> dict[str, Any]:
    """Seconds per speculative phase over the passes' wall time; `other` is prefill, scheduling,
    stop checks and the rest of the host work."""
    stats = merged_stats(runs)
    wall = sum(r.wall_s for r in runs)
    phases = {}
    for name in sorted(stats.phase_calls, key=lambda n: -stats.phase_seconds[n]):
        sec, calls = stats.phase_seconds[name], stats.phase_calls[name]
        phases[name] = {"calls": calls, "seconds": sec, "ms_per_call": 1e3 * sec / calls if calls else None,
                        "fraction_of_wall": _ratio(sec, wall)}
    other = wall - sum(stats.phase_seconds.values())
    return {"source": source, "wall_s": wall, "phases": phases, "other_s": other,
            "other_fraction": _ratio(other, wall)}


def first_mismatch(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (a length difference counts), None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _hf_summary(hf: HFRun, start: int, n: int, vanilla: list[list[int]]) -> dict[str, Any]:
    outs, secs = hf.outputs[start:start + n], hf.seconds[start:start + n]
    tokens = sum(len(o) for o in outs)
    return {"requests": n, "generated_tokens": tokens, "wall_s": sum(secs),
            "tokens_per_s": _rate(tokens, sum(secs)),
            "identical_to_vanilla": sum(first_mismatch(o, v) is None for o, v in zip(outs, vanilla))}


def _entry(prompts: list[BenchPrompt], vanilla: list[BatchRun], spec: list[BatchRun],
           profiled: list[BatchRun], profile_source: str, hf: HFRun | None, hf_start: int) -> dict[str, Any]:
    v, s = mode_summary(vanilla), mode_summary(spec)
    v_out = [o for r in vanilla for o in r.outputs]
    s_out = [o for r in spec for o in r.outputs]
    mismatched = [p.question_id for p, a, b in zip(prompts, v_out, s_out) if first_mismatch(a, b) is not None]
    entry: dict[str, Any] = {
        "num_prompts": len(prompts), "vanilla": v, "speculative": {**s, **spec_summary(spec)},
        "speedup": _ratio(s["tokens_per_s"], v["tokens_per_s"]),
        "decode_speedup": _ratio(s["decode_tokens_per_s"], v["decode_tokens_per_s"]),
        "greedy_identical": len(prompts) - len(mismatched), "greedy_mismatches": len(mismatched),
        "mismatched_question_ids": mismatched,
        "phase_breakdown": phase_breakdown(profiled, profile_source),
    }
    if hf is not None:
        entry["hf"] = _hf_summary(hf, hf_start, len(prompts), v_out)
        entry["speedup_vs_hf"] = _ratio(s["tokens_per_s"], entry["hf"]["tokens_per_s"])
    return entry


def build_results(groups: dict[str, list[BenchPrompt]], vanilla: dict[str, BatchRun],
                  spec: dict[str, BatchRun], profiled: dict[str, BatchRun], profile_source: str,
                  hf: HFRun | None = None) -> dict[str, Any]:
    """`categories` (file order) and `overall` entries, plus one row per request. `hf`, when
    given, holds every prompt in the order of `groups`."""
    cats: dict[str, Any] = {}
    start = 0
    for cat, prompts in groups.items():
        cats[cat] = _entry(prompts, [vanilla[cat]], [spec[cat]], [profiled[cat]], profile_source,
                           hf, start)
        start += len(prompts)
    order = list(groups)
    overall = _entry([p for c in order for p in groups[c]], [vanilla[c] for c in order],
                     [spec[c] for c in order], [profiled[c] for c in order], profile_source, hf, 0)
    requests = []
    for cat in order:
        v, s = vanilla[cat], spec[cat]
        for i, p in enumerate(groups[cat]):
            requests.append({"question_id": p.question_id, "category": cat,
                             "vanilla_tokens": len(v.outputs[i]), "spec_tokens": len(s.outputs[i]),
                             "verify_steps": s.verify_steps[i], "tau": s.taus[i],
                             "first_mismatch": first_mismatch(v.outputs[i], s.outputs[i])})
    return {"categories": cats, OVERALL: overall, "requests": requests}


def write_json(report: dict[str, Any], path: Path) -> Path:
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return path


def plot(results: dict[str, Any], path: Path) -> Path:
    """Left: mean tau per category; right: tokens/s per category and mode (speedup on top)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [*results["categories"], OVERALL]
    entries = [*results["categories"].values(), results[OVERALL]]
    x = list(range(len(names)))
    fig, (ax_tau, ax_tps) = plt.subplots(1, 2, figsize=(max(10, 1.4 * len(names) + 4), 4.5))
    taus = [e["speculative"]["tau_mean"] or 0.0 for e in entries]
    colors = ["tab:blue"] * (len(names) - 1) + ["black"]
    ax_tau.bar(x, taus, color=colors)
    for i, t in enumerate(taus):
        ax_tau.text(i, t, f"{t:.2f}", ha="center", va="bottom", fontsize=8)
    ax_tau.set(title="mean tau (tokens per verify pass)", ylabel="tau", ylim=(0, 1.15 * max(taus + [1.0])))
    modes = [("vanilla", "vanilla", "tab:gray"),
             ("speculative", "speculative (speedup)", "tab:orange")]
    if "hf" in results[OVERALL]:
        modes.append(("hf", "transformers, batch 1", "tab:green"))
    width = 0.8 / len(modes)
    top = 0.0
    for j, (key, label, color) in enumerate(modes):
        offset = (j - (len(modes) - 1) / 2) * width
        vals = [e[key]["tokens_per_s"] or 0.0 for e in entries]
        top = max([top, *vals])
        ax_tps.bar([i + offset for i in x], vals, width, label=label, color=color)
        if key == "speculative":
            for i, (v, e) in enumerate(zip(vals, entries)):
                if e["speedup"] is not None:
                    ax_tps.text(i + offset, v, f"{e['speedup']:.2f}x", ha="center", va="bottom", fontsize=8)
    ax_tps.set(title="tokens/s (end to end, prefill included)", ylabel="tokens/s",
               ylim=(0, 1.3 * (top or 1.0)))
    ax_tps.legend(fontsize=7, loc="upper left", ncol=len(modes))
    for ax in (ax_tau, ax_tps):
        ax.set_xticks(x)
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def table(results: dict[str, Any], header: str) -> str:
    """The short table printed last."""
    has_hf = "hf" in results[OVERALL]
    head = (f"{'category':<14} {'n':>4} {'tau ±95%':>11} {'tau tot':>7} {'vanilla tok/s':>13} "
            f"{'spec tok/s':>10} {'speedup':>7} {'decode x':>8} {'identical':>9}")
    head += f" {'HF tok/s':>9}" if has_hf else ""
    lines = [header, head]
    for name, e in [*results["categories"].items(), (OVERALL, results[OVERALL])]:
        s = e["speculative"]
        tau = _num(s["tau_mean"], ".2f") + ("" if s["tau_ci95"] is None else f"±{s['tau_ci95']:.2f}")
        row = (f"{name[:14]:<14} {e['num_prompts']:>4} {tau:>11} "
               f"{_num(s['tau_total'], '.2f'):>7} {_num(e['vanilla']['tokens_per_s'], '.1f'):>13} "
               f"{_num(s['tokens_per_s'], '.1f'):>10} {_num(e['speedup'], '.2f') + 'x':>7} "
               f"{_num(e['decode_speedup'], '.2f') + 'x':>8} "
               f"{str(e['greedy_identical']) + '/' + str(e['num_prompts']):>9}")
        if has_hf:
            row += f" {_num(e['hf']['tokens_per_s'], '.1f'):>9}"
        lines.append(row)
    o = results[OVERALL]
    pb = o["phase_breakdown"]
    parts = [f"{n} {_num(p['fraction_of_wall'], '.1%')} ({_num(p['ms_per_call'], '.2f')} ms x {p['calls']})"
             for n, p in pb["phases"].items()]
    parts.append(f"other {_num(pb['other_fraction'], '.1%')}")
    hist = " ".join(f"{k}:{v}" for k, v in o["speculative"]["accept_hist"].items())
    phases = (f"phases: {NOT_PROFILED}" if pb["source"] == NOT_PROFILED
              else f"phases [{pb['source']}]: " + ", ".join(parts))
    lines += [phases,
              f"accept length histogram (tokens per verify pass): {hist or '-'}; "
              f"mean {_num(o['speculative']['accept_len_mean'], '.2f')}",
              "acceptance by draft depth (accepted / reached): " + (" ".join(
                  f"d{r['depth']} {r['rate']:.0%} ({r['accepted']}/{r['reached']})"
                  for r in o["speculative"]["acceptance_by_depth"]) or "-"),
              "steps per shape: " + (" ".join(
                  f"{k} {v}" for k, v in o["speculative"].get("steps_per_shape", {}).items()) or "-"),
              f"hot-set coverage: {o['speculative']['hot_coverage']:.1%} of "
              f"{o['speculative']['hot_served_tokens']} served tokens",
              f"greedy outputs identical to vanilla: {o['greedy_identical']}/{o['num_prompts']}"
              + ("" if not o["greedy_mismatches"] else f"  MISMATCH: {o['mismatched_question_ids']}")]
    if has_hf:
        lines.append(f"transformers generate (static cache, batch 1): "
                     f"{_num(o['hf']['tokens_per_s'], '.1f')} tok/s, speculative/HF "
                     f"{_num(o['speedup_vs_hf'], '.2f')}x, HF greedy identical to vanilla "
                     f"{o['hf']['identical_to_vanilla']}/{o['num_prompts']}")
    return "\n".join(lines)
