"""After training: tau of the trained head in hotspec itself, DIR/train_report.json, DIR/loss.png."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hotspec.entrypoints.llm import LLM
from hotspec.sampling_params import SamplingParams
from hotspec.training.config import TrainConfig
from hotspec.training.prompts import Prompt
from hotspec.training.trainer import History


def measure_tau(cfg: TrainConfig, head_dir: Path, prompts: list[Prompt],
                token_map: Path | None) -> dict[str, Any]:
    """Greedy decoding of `prompts` with the trained head (chain drafts of eval_num_steps); tau is
    the mean over prompts of generated tokens per verify pass (RequestStats.tau); the acceptance
    rate at each draft depth d is P(accept at d | accepted at d - 1) (SpecStats.acceptance_by_depth)."""
    steps = cfg.eval_num_steps
    opts = cfg.engine_options()
    # a batch never holds more than the held-back prompts: capture no larger graphs than that
    opts["cuda_graph_max_bs"] = min(opts.get("cuda_graph_max_bs", 64), max(1, len(prompts)))
    llm = LLM(cfg.model, **opts, speculative_algorithm=cfg.algorithm,
              speculative_draft_model_path=str(head_dir), speculative_num_steps=steps,
              speculative_eagle_topk=1, speculative_num_draft_tokens=steps + 1,
              speculative_token_map=None if token_map is None else str(token_map))
    outs = llm.generate(prompt_token_ids=[p.ids for p in prompts],
                        sampling_params=SamplingParams(temperature=0.0, max_tokens=cfg.max_new_tokens))
    taus = [o.stats.tau for o in outs]
    stats = llm.engine.worker.spec_stats
    assert stats is not None, "a speculative engine keeps statistics"
    hist = stats.accept_hist
    return {"mean": sum(taus) / len(taus), "per_prompt": taus, "num_steps": steps, "topk": 1,
            "accept_hist": {str(k): v for k, v in sorted(hist.items())},
            "acceptance_by_depth": [{"depth": d, "reached": n, "accepted": k, "rate": k / n}
                                    for d, n, k in stats.acceptance_by_depth()],
            "generated_tokens": sum(o.stats.generated_tokens for o in outs)}


def write_report(out_dir: Path, report: dict[str, Any]) -> Path:
    path = out_dir / "train_report.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def plot_losses(history: History, path: Path) -> Path:
    """Loss (weighted total and per TTT step) and per-step top-1 agreement over optimizer steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    x = range(1, len(history.loss) + 1)
    ax_loss.plot(x, history.loss, color="black", lw=1.5, label="total (0.8^k weighted)")
    n_steps = len(history.step_loss[0]) if history.step_loss else 0
    for k in range(n_steps):
        ax_loss.plot(x, [s[k] for s in history.step_loss], lw=0.8, alpha=0.7, label=f"step {k}")
        ax_acc.plot(x, [a[k] for a in history.step_acc], lw=0.8, label=f"step {k}")
    ax_loss.set(xlabel="optimizer step", ylabel="loss", title="draft head loss")
    ax_acc.set(xlabel="optimizer step", ylabel="top-1 agreement with the target",
               title="per TTT step", ylim=(0, 1))
    ax_loss.legend(fontsize=7)
    ax_acc.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
