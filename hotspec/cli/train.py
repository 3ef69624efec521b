"""`hotspec train-draft`: train an EAGLE-3 or EAGLE-1/2 draft head for a target by self-distillation."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from hotspec.config import DTYPES
from hotspec.errors import HotspecError


def add_parser(sub: argparse._SubParsersAction) -> None:
    from hotspec.cli.engine_args import HelpFormatter

    p = sub.add_parser(
        "train-draft", help="train a draft head (EAGLE-3 or EAGLE-1/2) for a target model",
        formatter_class=HelpFormatter,
        description="Self-distillation: prompts (from files, or sampled from the target) are "
        "answered by the target with hotspec's engine, the target's features are recorded, and a "
        "draft head is trained on them. DIR receives config.json + model.safetensors (the public "
        "format: pass DIR as --speculative-draft-model-path), train_report.json (losses, tau) and "
        "loss.png; DIR/data and DIR/checkpoints let --resume continue an interrupted run. With "
        "--data, the head trains on token shards of conversations instead (`hotspec distill`), "
        "the target's features computed for each batch on the device.")
    p.add_argument("--model", default=None,
                   help="target model folder or .gguf (default: the built-in model)")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="output folder")
    p.add_argument("--arch", choices=("eagle3", "eagle"), default="eagle3",
                   help="head architecture (default: eagle3)")
    p.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                   help="EAGLE-3: draft vocabulary size (default min(32000, vocab)); EAGLE: also "
                   "write the FR-Spec map DIR/freq_N.pt of the N most frequent response tokens")
    p.add_argument("--share-lm-head", action="store_true",
                   help="EAGLE-3: the head proposes from the target's own LM head (the whole "
                   "vocabulary), frozen and not written to the head: its model.safetensors holds "
                   "the layer alone, without lm_head, d2t, t2d or draft_vocab_size, the public "
                   "convention for heads that load the LM head from the target (SGLang's "
                   "load_lm_head_from_target). FR-Spec maps (--speculative-token-map) cut it as "
                   "they cut any head's")
    p.add_argument("--intermediate-size", type=int, default=None, metavar="N",
                   help="width of the head's MLP, written to its config.json (default: the "
                   "target's intermediate_size); wider heads load as they are in the engine, "
                   "SGLang and the EAGLE repo")
    p.add_argument("--token-maps", nargs="+", type=int, default=(), metavar="N",
                   help="also write FR-Spec maps DIR/freq_N.pt of the N most frequent response tokens "
                   "(EOS / end-of-turn forced in), for --speculative-token-map; either arch")
    p.add_argument("--prompts", nargs="+", type=Path, default=(), metavar="FILE",
                   help="ShareGPT .json/.jsonl (first user turn of each conversation) or .txt (one "
                   "prompt per line); default: prompts sampled from the target itself")
    p.add_argument("--data", type=Path, default=None, metavar="DIR",
                   help="train on the token shards of DIR (tokens_NNNNN.npz, from `hotspec "
                   "distill`): the target's features are computed per batch on the device; no "
                   "prompts are answered and no feature shards are written")
    p.add_argument("--eval-prompts-file", type=Path, default=None, metavar="FILE",
                   help="with --data: measure tau on the first --eval-prompts prompts of FILE "
                   "(.jsonl/.json/.txt as --prompts) instead of holding back the last "
                   "--eval-prompts records (evaluated on their prefix up to the first answer)")
    p.add_argument("--num-prompts", type=int, default=256, help="prompts to use (default: 256)")
    p.add_argument("--synth-prompts", type=int, default=0, metavar="N",
                   help="with --prompts: also sample N user messages from the target and train on "
                   "its answers to them too (default: 0)")
    p.add_argument("--responses-per-prompt", type=int, default=1, metavar="R",
                   help="responses drawn per prompt, each with its own seed; R > 1 needs "
                   "--temperature > 0 (default: 1)")
    p.add_argument("--eval-prompts", type=int, default=8,
                   help="prompts held back to measure tau (default: 8)")
    p.add_argument("--max-new-tokens", type=int, default=256,
                   help="response length per prompt, and of the tau evaluation (default: 256)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="response sampling temperature, 0 = greedy (default: 0; 0.7 is common)")
    p.add_argument("--max-seq-len", type=int, default=2048, help="record length cap (default: 2048)")
    p.add_argument("--max-answer-tokens", type=int, default=None, metavar="N",
                   help="with --data: train on the first N tokens of each answer only, each record "
                   "cut after its last such token (default: every answer token)")
    p.add_argument("--epochs", type=int, default=1, help="passes over the recorded data (default: 1)")
    p.add_argument("--lr", type=float, default=1e-4,
                   help="peak AdamW learning rate of the cosine schedule (default: 1e-4)")
    p.add_argument("--batch-size", type=int, default=4, help="records per optimizer step (default: 4)")
    p.add_argument("--ttt-steps", type=int, default=None, metavar="K",
                   help="training-time-test unroll (default: eagle3 7 on CUDA, 3 on CPU; eagle 1)")
    p.add_argument("--warmup-ratio", type=float, default=0.05,
                   help="share of the steps that warm the learning rate up linearly (default: 0.05)")
    p.add_argument("--save-every", type=int, default=200,
                   help="optimizer steps between checkpoints, for --resume (default: 200)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where data is generated and the head trained; auto is cuda when available")
    p.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="target dtype for data and evaluation (auto: bfloat16 on CUDA, else float32)")
    p.add_argument("--kv-cache-memory-gb", type=float, default=None,
                   help="KV cache of the data and evaluation engines (default: the engine's)")
    p.add_argument("--max-num-seqs", type=int, default=None, metavar="N",
                   help="requests the data and evaluation engines decode at once (default: the "
                   "engine's)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of prompt sampling, the head's initialisation and shuffling (default: 0)")
    p.add_argument("--init", type=Path, default=None, metavar="DIR",
                   help="start from the trained head in DIR (public EAGLE/EAGLE-3 format) instead "
                   "of random weights: fine-tune it on this run's data; its config.json and "
                   "weights set the head's vocabulary (its own LM head or the target's) and MLP "
                   "width (pass its --arch)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in DIR (its data shards and last checkpoint)")
    p.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="after this many seconds of training, save the checkpoint and stop; "
                   "--resume continues (time-boxed GPU runs)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_train_draft)


def cmd_train_draft(args: argparse.Namespace) -> None:
    from hotspec.training.config import TrainConfig
    from hotspec.training.pipeline import run_train_draft

    engine_kwargs = {}
    if args.kv_cache_memory_gb is not None:
        engine_kwargs["kv_cache_memory_gb"] = args.kv_cache_memory_gb
    cfg = TrainConfig(
        out=args.out, model=args.model, arch=args.arch, draft_vocab=args.draft_vocab,
        intermediate_size=args.intermediate_size, share_lm_head=args.share_lm_head, init=args.init,
        token_maps=tuple(args.token_maps), max_num_seqs=args.max_num_seqs,
        prompts=tuple(args.prompts), data=args.data, eval_prompts_file=args.eval_prompts_file,
        num_prompts=args.num_prompts, eval_prompts=args.eval_prompts,
        synth_prompts=args.synth_prompts, responses_per_prompt=args.responses_per_prompt,
        max_new_tokens=args.max_new_tokens, response_temperature=args.temperature,
        max_seq_len=args.max_seq_len, max_answer_tokens=args.max_answer_tokens, epochs=args.epochs,
        lr=args.lr, batch_size=args.batch_size,
        ttt_steps=args.ttt_steps, warmup_ratio=args.warmup_ratio, save_every=args.save_every,
        device=args.device, dtype=args.dtype, seed=args.seed, resume=args.resume,
        time_limit=args.time_limit, progress=not args.no_progress, engine_kwargs=engine_kwargs,
        command=_command(args))
    try:
        report = run_train_draft(cfg)
    except HotspecError:
        raise
    except (OSError, ValueError) as e:  # unreadable prompt files, no usable prompt, ...
        raise HotspecError(str(e)) from e
    if "halted" in report:
        print(f"stopped at step {report['halted']} (--time-limit); the same command with --resume "
              f"continues it -> {args.out}")
        return
    tau = report.get("tau")
    tau_text = f", tau {tau['mean']:.2f} on {len(tau['per_prompt'])} prompts" if tau else ""
    t = report["training"]
    speed = t["throughput"]
    speed_text = (f", {speed['label_positions_per_s']:.0f} labels/s"
                  if speed.get("label_positions_per_s") else "")
    print(f"draft head ({report['algorithm']}): {t['steps']} steps, final loss {t['final_loss']:.4f}"
          f"{speed_text}{tau_text} -> {args.out}")


def _command(args: argparse.Namespace) -> str:
    """The equivalent command line with every option spelled out (defaults included)."""
    words = ["hotspec", "train-draft"]
    for name, value in vars(args).items():
        if name in ("command", "func") or value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            words.append(flag)
        elif isinstance(value, (list, tuple)):
            if value:
                words += [flag, *map(str, value)]
        else:
            words += [flag, str(value)]
    return shlex.join(words)
