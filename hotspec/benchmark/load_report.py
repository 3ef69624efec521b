"""Reports of `hotspec bench-serve`: one RunReport per server and rate, the PASS/FAIL checks over
them, a markdown table and the latency-throughput plot."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


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
    tpot_ms_p99: float
    tau_mean: float | None
    engine_ttft_ms_mean: float | None  # the engine's own (its /metrics): TTFT less the server's part
    shape_steps: dict[str, int] = field(default_factory=dict)  # steps per speculation shape
    greedy_checked: int = 0
    greedy_mismatched: int = 0
    kernel_compiles: int = 0  # Triton kernels the engine compiled during the run (each held steps)
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
        compiled = sum(r.kernel_compiles for r in rs)
        out.append((compiled == 0, f"{target}: {compiled} Triton kernels compiled while serving "
                    "(counted with CUDA graphs)"))
        if verify:
            n, bad = sum(r.greedy_checked for r in rs), sum(r.greedy_mismatched for r in rs)
            out.append((n > 0 and bad == 0, f"{target}: greedy under load == alone for {n - bad} of "
                        f"{n} completed greedy requests"))
    return out


def table(reports: list[RunReport]) -> str:
    head = ("target", "rate", "ok", "fail", "hangup", "req/s", "tok/s", "TTFT p50", "TTFT p99",
            "ITL p50", "ITL p99", "TPOT p50", "TPOT p99", "engine TTFT", "tau", "steps by shape")
    rows = [head]
    for r in reports:
        rows.append((r.target, r.rate, str(r.completed), str(r.failed), str(r.disconnected),
                     f"{r.requests_per_s:.2f}", f"{r.output_tokens_per_s:.1f}",
                     f"{r.ttft_ms_p50:.1f}", f"{r.ttft_ms_p99:.1f}", f"{r.itl_ms_p50:.2f}",
                     f"{r.itl_ms_p99:.2f}", f"{r.tpot_ms_p50:.2f}", f"{r.tpot_ms_p99:.2f}",
                     "-" if r.engine_ttft_ms_mean is None else f"{r.engine_ttft_ms_mean:.1f}",
                     "-" if r.tau_mean is None else f"{r.tau_mean:.2f}", shares(r.shape_steps)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines) + ("\n(latencies in ms; ITL = gap between streamed chunks; engine TTFT: "
                               "the engine's own mean, from a request reaching its loop to its "
                               "first token leaving it)")


def shares(steps: dict[str, int]) -> str:
    """Each shape's share of the steps, most run first ("3/1/4 62% off 38%"); "-" for none."""
    total = sum(steps.values())
    if not total:
        return "-"
    return " ".join(f"{k} {100 * v / total:.0f}%" for k, v in sorted(steps.items(), key=lambda kv: -kv[1]))


def plot(reports: list[RunReport], path: Path) -> Path:
    """Latency against throughput, one curve per server, a point per rate: TTFT p50 and TPOT p50
    against output tokens/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for target in dict.fromkeys(r.target for r in reports):
        rs = [r for r in reports if r.target == target]
        x = [r.output_tokens_per_s for r in rs]
        for ax, ys in ((axes[0], [r.ttft_ms_p50 for r in rs]), (axes[1], [r.tpot_ms_p50 for r in rs])):
            ax.plot(x, ys, marker="o", label=target)
            for xi, yi, r in zip(x, ys, rs):
                ax.annotate(r.rate, (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=8)
    for ax, name in ((axes[0], "TTFT p50 (ms)"), (axes[1], "TPOT p50 (ms)")):
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(name)
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle("hotspec bench-serve: latency against throughput, a point per request rate (req/s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
