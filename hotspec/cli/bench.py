"""`hotspec bench`: speculative vs vanilla decoding on a prompt file, one command, one report.

Both modes run the same prompts greedily through hotspec's engine, category by category (the
prompts of one category submitted together, at most --batch-size decoding at once), after a short
warm-up. The vanilla engine is built, run and released before the speculative one is built; both
share one copy of the target's weights. Optionally transformers' `generate` (static cache, batch
1) runs the same prompts on the same weights as a baseline. DIR/bench.json holds every number,
DIR/bench.png plots tau and tokens/s per category, and a short table is printed last.

--batch-size sets max_num_seqs, and the benchmark decides where phases are timed (see
--profile-pass), so --max-num-seqs and --profile-phases are ignored.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from hotspec.config import EngineConfig
from hotspec.errors import HotspecError

SET_BY_BENCH = ("max_num_seqs", "profile_phases")  # from --batch-size; phase timing: see --profile-pass
SPEC_FIELDS = ("speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
               "speculative_eagle_topk", "speculative_num_draft_tokens", "speculative_token_map")


def add_parser(sub: argparse._SubParsersAction) -> None:
    from hotspec.cli.engine_args import RawDescriptionHelpFormatter, add_engine_args

    p = sub.add_parser(
        "bench", help="benchmark speculative decoding against vanilla decoding on a prompt file",
        description=__doc__, formatter_class=RawDescriptionHelpFormatter)
    add_engine_args(p)
    b = p.add_argument_group("benchmark")
    b.add_argument("--prompts", required=True, type=Path, metavar="FILE",
                   help="JSON lines: category, question_id and turns (the first is used), prompt, "
                   "or prompt_token_ids (used verbatim)")
    b.add_argument("--batch-size", type=int, default=1, metavar="B",
                   help="requests decoded together (sets max_num_seqs; default: 1)")
    b.add_argument("--max-tokens", type=int, default=256, help="new tokens per prompt (default: 256)")
    b.add_argument("--num-prompts", type=int, default=None, metavar="N",
                   help="use N prompts, round-robin over the categories (default: all)")
    b.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                   help="text prompts through the chat template as one user turn (default: on)")
    b.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=False,
                   help="always generate --max-tokens tokens (default: stop at EOS)")
    b.add_argument("--warmup-tokens", type=int, default=16,
                   help="tokens of the untimed warm-up pass over the first B prompts (default: 16)")
    b.add_argument("--profile-pass", action=argparse.BooleanOptionalAction, default=True,
                   help="on GPU, time the phases in a separate profiled pass (profiling "
                   "synchronises the device; on CPU the timed pass is profiled for free)")
    b.add_argument("--vs-hf", action=argparse.BooleanOptionalAction, default=False,
                   help="also time transformers generate (static cache, greedy, batch 1) on the "
                   "same weights and prompts (Llama-family targets without biases or q/k norms)")
    b.add_argument("--out", type=Path, default=Path("bench_out"), metavar="DIR",
                   help="writes DIR/bench.json and DIR/bench.png (default: bench_out)")
    p.set_defaults(func=cmd_bench)


def _command(args: argparse.Namespace) -> str:
    """The equivalent command line, every option spelled out (defaults included)."""
    words = ["hotspec", "bench"]
    for name, value in vars(args).items():
        if name in ("command", "func", *SET_BY_BENCH) or value is None:
            continue
        flag = name.replace("_", "-")
        if isinstance(value, bool):
            words.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            words += [f"--{flag}", str(value)]
    return shlex.join(words)


def _check(args: argparse.Namespace, cfg: EngineConfig) -> None:
    if cfg.speculative_algorithm is None:
        raise HotspecError("hotspec bench compares speculative decoding with vanilla decoding: pass "
                           "--speculative-algorithm and --speculative-draft-model-path (the default "
                           "model needs no path: it has a built-in head)")
    for name in ("batch_size", "max_tokens", "num_prompts"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise HotspecError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.warmup_tokens < 0:
        raise HotspecError(f"--warmup-tokens must be >= 0, got {args.warmup_tokens}")


def cmd_bench(args: argparse.Namespace) -> None:
    from hotspec.benchmark.device import device_name
    from hotspec.benchmark.modes import RunOptions, run_speculative, run_vanilla
    from hotspec.benchmark.prompts import BenchPrompt, prompt_ids, read_bench_prompts
    from hotspec.benchmark.report import build_results, plot, table, write_json
    from hotspec.benchmark.spec_bench import load_target
    from hotspec.cli.engine_args import engine_config

    cfg = engine_config(args)
    _check(args, cfg)
    # Phase timing is switched on by the benchmark itself (see --profile-pass), never in the
    # timed pass on GPU.
    spec_cfg = replace(cfg, max_num_seqs=args.batch_size, profile_phases=False)
    no_spec: dict[str, Any] = dict.fromkeys(SPEC_FIELDS)  # every speculative field set to None
    vanilla_cfg = replace(spec_cfg, **no_spec)
    prompts = read_bench_prompts(args.prompts, args.num_prompts)
    started = datetime.now(timezone.utc)
    target = load_target(cfg)
    groups: dict[str, list[BenchPrompt]] = {}
    for p in prompts:
        groups.setdefault(p.category, []).append(p)
    ids = {c: [prompt_ids(p, target.tokenizer, args.chat) for p in ps] for c, ps in groups.items()}
    opts = RunOptions(args.max_tokens, args.ignore_eos, args.warmup_tokens,
                      [i for c in ids for i in ids[c]][: args.batch_size])
    vanilla, hf, device = run_vanilla(vanilla_cfg, target, ids, opts, args.vs_hf)
    spec, profiled, source = run_speculative(spec_cfg, target, ids, opts, args.profile_pass)
    results = build_results(groups, vanilla, spec, profiled, source, hf)

    mc = target.model_config
    dtype = str(next(target.model.parameters()).dtype).removeprefix("torch.")
    report: dict[str, Any] = {
        "benchmark": "hotspec bench", "command": _command(args),
        "date_utc": started.strftime("%Y-%m-%d %H:%M UTC"), "device": device_name(device),
        "device_type": device.type, "torch": torch.__version__,
        "model": cfg.model or "default (SmolLM2-135M-Instruct)", "dtype": dtype,
        "model_config": asdict(mc), "engine_config": asdict(spec_cfg),
        "vanilla_engine_config": asdict(vanilla_cfg),
        "settings": {"prompts": str(args.prompts), "num_prompts": len(prompts),
                     "batch_size": args.batch_size, "max_tokens": args.max_tokens, "chat": args.chat,
                     "ignore_eos": args.ignore_eos, "warmup_tokens": args.warmup_tokens,
                     "greedy": True, "vs_hf": args.vs_hf},
        **results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = write_json(report, args.out / "bench.json")
    png_path = plot(results, args.out / "bench.png")
    print(f"wrote {json_path} and {png_path}", file=sys.stderr)
    s = spec_cfg.spec_shape
    shape = (f"adaptive over {' '.join(spec_cfg.speculative_candidates)}" if spec_cfg.adaptive
             else f"steps {s.num_steps}, topk {s.topk}, draft tokens {s.num_draft_tokens}")
    header = (f"hotspec bench: {report['model']}, {dtype} on {report['device']}; "
              f"{spec_cfg.speculative_algorithm} {shape}"
              f"{', token map ' + spec_cfg.speculative_token_map if spec_cfg.speculative_token_map else ''}; "
              f"batch {args.batch_size}, max_tokens {args.max_tokens}, greedy")
    print(table(results, header))
