"""Reports of benchmarks/load_test.py: one RunReport per target and rate, the PASS/FAIL checks
over them, and a markdown table."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RunReport:
    target: str
    rate: str
    requests: int
    completed: int
    failed: int
    http_5xx: int
    disconnected: int
    server_aborts: int
    step_errors: int
    drained: bool
    duration_s: float
    requests_per_s: float
    output_tokens_per_s: float  # tokens streamed to clients that read to the end
    server_tokens_per_s: float  # every token the engine generated (hung-up requests too)
    ttft_ms_p50: float
    ttft_ms_p99: float
    itl_ms_p50: float
    itl_ms_p99: float
    tpot_ms_p50: float
    tau_mean: float | None
    greedy_checked: int = 0
    greedy_mismatched: int = 0
    errors: list[str] = field(default_factory=list)


def checks(reports: list[RunReport], verify: bool) -> list[tuple[bool, str]]:
    out = []
    for target in dict.fromkeys(r.target for r in reports):
        rs = [r for r in reports if r.target == target]
        fails, e5 = sum(r.failed for r in rs), sum(r.http_5xx for r in rs)
        steps = sum(r.step_errors for r in rs)
        out.append((fails == 0 and steps == 0, f"{target}: {fails} failed requests ({e5} 5xx), "
                    f"{steps} failed engine steps"))
        stuck = [r.rate for r in rs if not r.drained]
        out.append((not stuck, f"{target}: drained after every run (no request left, every KV block "
                    f"free){'; not after rate ' + ', '.join(stuck) if stuck else ''}"))
        hung, aborted = sum(r.disconnected for r in rs), sum(r.server_aborts for r in rs)
        out.append((aborted == hung, f"{target}: {hung} clients hung up mid-stream, the server "
                    f"aborted {aborted} requests"))
        if verify:
            n, bad = sum(r.greedy_checked for r in rs), sum(r.greedy_mismatched for r in rs)
            out.append((n > 0 and bad == 0, f"{target}: greedy under load == alone for {n - bad} of "
                        f"{n} completed greedy requests"))
    return out


def table(reports: list[RunReport]) -> str:
    head = ("target", "rate", "ok", "fail", "hangup", "req/s", "tok/s", "TTFT p50", "TTFT p99",
            "ITL p50", "ITL p99", "TPOT p50", "tau")
    rows = [head]
    for r in reports:
        rows.append((r.target, r.rate, str(r.completed), str(r.failed), str(r.disconnected),
                     f"{r.requests_per_s:.2f}", f"{r.output_tokens_per_s:.1f}",
                     f"{r.ttft_ms_p50:.0f}", f"{r.ttft_ms_p99:.0f}", f"{r.itl_ms_p50:.1f}",
                     f"{r.itl_ms_p99:.1f}", f"{r.tpot_ms_p50:.1f}",
                     "-" if r.tau_mean is None else f"{r.tau_mean:.2f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines) + "\n(latencies in ms; ITL = gap between streamed chunks)"
