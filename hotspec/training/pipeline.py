"""`hotspec train-draft` end to end: data -> draft vocabulary -> training -> export -> report.

Output folder DIR:
  config.json, model.safetensors   the head, public format (draft_loader.load_draft_head reads it)
  freq_<N>.pt                      FR-Spec maps (list of int): EAGLE-1/2 with --draft-vocab N,
                                   and each N of --token-maps (either arch)
  train_report.json, loss.png      what was done and how well the head drafts (tau)
  data/                            prompts and feature shards (data.py); none with --data,
                                   whose token shards are read where they are (online.py)
  checkpoints/last.pt              the latest training state (trainer.py)
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hotspec.entrypoints.llm import LLM
from hotspec.speculative.token_map_builder import end_of_turn_ids
from hotspec.training.config import TrainConfig, TrainConfigError
from hotspec.training.data import PromptSplit, build_shards, load_dataset, prepare_prompts
from hotspec.training.features import FeatureBlock
from hotspec.training.head_init import (
    DEFAULT_EAGLE3_VOCAB,
    InitHead,
    aux_layers,
    build_head,
    export_head,
    head_config,
    load_init_weights,
    read_init_head,
)
from hotspec.training.online import (
    OnlineData,
    check_token_ids,
    data_counts,
    read_token_data,
    split_data,
)
from hotspec.training.prompts import Prompt
from hotspec.training.report import measure_tau, plot_losses, write_report
from hotspec.training.token_shards import TokenRecords
from hotspec.training.trainer import BatchSource, Trainer, Vocab
from hotspec.training.vocab import (
    choose_draft_vocab,
    keep_draft_vocab,
    response_token_counts,
    write_token_maps,
)

log = logging.getLogger("hotspec")


@dataclass
class Prepared:
    """The training data and what the rest of the run needs of it."""

    train: FeatureBlock | BatchSource
    counts: np.ndarray  # response token counts over the target vocabulary
    eval_prompts: list[Prompt]
    eval_from: str
    report: dict[str, Any]  # the report's "prompts" and "data" sections
    meta: dict[str, Any]  # added to the checkpoint meta


def run_train_draft(cfg: TrainConfig) -> dict[str, Any]:
    """Run every stage; returns the report (also written to DIR/train_report.json). With
    `cfg.halt_after` set, stops after that many optimizer steps and returns {"halted": step}."""
    t_start = time.perf_counter()
    out = Path(cfg.out)
    data_dir, ckpt_dir = out / "data", out / "checkpoints"
    _check_out_dir(cfg, data_dir, ckpt_dir)
    tokens = None if cfg.data is None else read_token_data(cfg.data)  # before loading the target

    llm = LLM(cfg.model, **cfg.engine_options())
    engine = llm.engine
    tcfg, vocab_size = engine.model_config, engine.model_config.vocab_size
    forced = end_of_turn_ids(llm.tokenizer, vocab_size) if llm.tokenizer is not None else []
    forced += sorted(t for t in engine.eos_token_ids if t < vocab_size)
    _check_token_maps(cfg, vocab_size, forced)
    init = _init_head(cfg, engine.target, engine.device) if cfg.init is not None else None
    share = cfg.share_lm_head or (init is not None and cfg.arch == "eagle3" and init.shares_lm_head)
    # EAGLE-3: rows of the head's own LM head; EAGLE-1/2: size of the FR-Spec map (or none).
    n_draft = cfg.draft_vocab
    if share:
        n_draft = vocab_size
    elif init is not None and init.draft_to_target is not None:
        n_draft = init.draft_to_target.shape[0]
    elif cfg.arch == "eagle3":
        n_draft = min(n_draft or DEFAULT_EAGLE3_VOCAB, vocab_size)
    # A shared LM head leaves draft_vocab_size out of config.json: the loaders take the target's.
    config = init.config if init is not None else head_config(
        tcfg, cfg.algorithm, None if share else n_draft, cfg.intermediate_size)
    aux = aux_layers(config, tcfg, cfg.algorithm)
    if tokens is None:
        prep = _recorded_data(llm, cfg, aux, data_dir)
    else:
        prep = _online_data(llm, cfg, aux, tokens)
    t_data = time.perf_counter()

    if init is not None and init.draft_to_target is not None:  # the head's own vocabulary, kept
        vocab = keep_draft_vocab(init.draft_to_target, prep.counts)
    else:
        vocab = choose_draft_vocab(cfg.algorithm, None if share else n_draft, prep.counts, forced,
                                   out)
    token_maps = write_token_maps(cfg.token_maps, prep.counts, forced, out)

    device = engine.device
    ttt = cfg.resolved_ttt_steps(device.type)
    head = build_head(engine.target, config, cfg.algorithm, vocab.draft_to_target, device, cfg.seed,
                      share)
    if init is not None:
        load_init_weights(head, init)
    loss_vocab = None
    if vocab.draft_to_target is not None and vocab.t2d is not None:
        rows = engine.target.lm_head.weight[vocab.draft_to_target.to(device)]
        loss_vocab = Vocab(rows, vocab.t2d.to(device))
    elif share:  # the whole vocabulary: every target token is a draft token
        loss_vocab = Vocab(engine.target.lm_head.weight,
                           torch.ones(vocab_size, dtype=torch.bool, device=device))
    meta = {"arch": cfg.arch, "draft_vocab": n_draft, "lr": cfg.lr, "seed": cfg.seed,
            **({"share_lm_head": True} if share else {}),
            **({"init": str(cfg.init)} if cfg.init is not None else {}),
            **_width_meta(config, tcfg.intermediate_size), **prep.meta}
    trainer = Trainer(head, prep.train, cfg, ttt, loss_vocab, ckpt_dir, meta)
    if cfg.resume:
        trainer.load()
    history = trainer.run()
    if not trainer.finished:
        return {"halted": trainer.step}
    t_train = time.perf_counter()
    throughput = trainer.throughput.as_dict()

    export_head(head, config, out, engine.dtype, vocab.d2t, vocab.t2d, share)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    dtype = str(engine.dtype).removeprefix("torch.")
    del trainer, head, loss_vocab, engine, llm, prep.train
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    tau = measure_tau(cfg, out, prep.eval_prompts, vocab.token_map) if prep.eval_prompts else None
    if tau is not None:
        tau["prompts_from"] = prep.eval_from
    t_end = time.perf_counter()

    try:
        plot = plot_losses(history, out / "loss.png").name
    except ImportError as e:  # matplotlib missing: the report still has every loss
        log.warning("no loss.png: %s (pip install matplotlib)", e)
        plot = None
    report = {
        "command": cfg.command,
        "config": {k: _plain(v) for k, v in vars(cfg).items() if k != "command"},
        "target": str(cfg.model) if cfg.model is not None else "default (SmolLM2-135M-Instruct)",
        "arch": cfg.arch, "algorithm": cfg.algorithm,
        "device": device_name, "dtype": dtype,
        **prep.report,
        "draft_vocab": vocab.info,
        "token_maps": token_maps,
        "aux_layer_ids": list(aux),
        "intermediate_size": config["intermediate_size"],
        "training": {"steps": len(history.loss), "epochs": cfg.epochs,
                     "batch_size": cfg.batch_size, "ttt_steps": ttt, "lr": cfg.lr,
                     "features": "online (per batch)" if cfg.data is not None else "recorded",
                     "throughput": throughput,
                     "final_loss": history.loss[-1] if history.loss else None,
                     "final_step_acc": history.step_acc[-1] if history.step_acc else None,
                     **history.as_dict()},
        "tau": tau,
        "loss_plot": plot,
        "wall_time_s": {"data": round(t_data - t_start, 2), "train": round(t_train - t_data, 2),
                        "eval": round(t_end - t_train, 2), "total": round(t_end - t_start, 2)},
    }
    write_report(out, report)
    return report


def _init_head(cfg: TrainConfig, target: Any, device: torch.device) -> InitHead:
    """The head of --init, checked against the options that describe the head to train."""
    assert cfg.init is not None
    init = read_init_head(cfg.init, target, cfg.algorithm, device)  # ModelLoadError names the fix
    if cfg.share_lm_head and not init.shares_lm_head:
        raise TrainConfigError(f"--init {cfg.init} has an LM head of its own "
                               f"({init.state['lm_head.weight'].shape[0]} rows); --share-lm-head "
                               "trains one that proposes from the target's. Fix: drop "
                               "--share-lm-head to fine-tune the head as it is.")
    return init


def _recorded_data(llm: LLM, cfg: TrainConfig, aux: tuple[int, ...], data_dir: Path) -> Prepared:
    """Prompts, the target's responses and their features recorded under DIR/data (data.py)."""
    split = prepare_prompts(llm, cfg, data_dir)
    data_stats = build_shards(llm, cfg, split, aux, data_dir)
    data = load_dataset(data_dir)
    counts = response_token_counts(data, llm.engine.model_config.vocab_size)
    eval_prompts, eval_from = _eval_prompts(split, cfg.eval_prompts)
    report = {"prompts": {"source": split.source, "files": [str(f) for f in cfg.prompts],
                          "train": len(split.train), "held_back": len(split.eval)},
              "data": data_stats}
    return Prepared(_training_data(data, llm.engine.device), counts, eval_prompts, eval_from,
                    report, {})


def _online_data(llm: LLM, cfg: TrainConfig, aux: tuple[int, ...], tokens: TokenRecords) -> Prepared:
    """Token shards whose features the target computes per batch (online.py)."""
    engine = llm.engine
    check_token_ids(tokens, engine.model_config.vocab_size, Path(str(cfg.data)))
    max_len = min(cfg.max_seq_len, engine.max_model_len)
    split = split_data(cfg, tokens, max_len, llm.tokenizer)
    counts = response_token_counts(split.train.records, engine.model_config.vocab_size)
    budget = 16384 if engine.device.type == "cuda" else 4096
    folder = data_counts(tokens)
    report = {"prompts": {"source": "data", "eval_prompts_from": split.eval_from,
                          "eval_prompts_file": None if cfg.eval_prompts_file is None
                          else str(cfg.eval_prompts_file), "held_back": len(split.eval)},
              "data": {"folder": str(cfg.data), **folder, "max_seq_len": max_len,
                       "max_answer_tokens": cfg.max_answer_tokens, **split.stats}}
    meta = {"data": {**folder, "max_seq_len": max_len, "max_answer_tokens": cfg.max_answer_tokens,
                     "train_records": split.train.num_records}}
    return Prepared(OnlineData(engine, split.train, aux, budget), counts, split.eval,
                    split.eval_from, report, meta)


def _plain(v: Any) -> Any:
    """A TrainConfig value as JSON (paths as strings)."""
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    return v


def _width_meta(config: dict[str, Any], target_width: int) -> dict[str, int]:
    """The head's MLP width for the checkpoint meta that --resume compares: only when it is not the
    target's, so checkpoints written before --intermediate-size existed (no such key) still resume,
    a run with the target's width spelled out continues one made with the default, and any other
    width is refused."""
    width = int(config["intermediate_size"])
    return {} if width == target_width else {"intermediate_size": width}


def _check_out_dir(cfg: TrainConfig, data_dir: Path, ckpt_dir: Path) -> None:
    if cfg.resume:
        return
    used = [p for p in ((ckpt_dir,) if cfg.data is not None else (data_dir, ckpt_dir)) if p.exists()]
    if used:
        raise TrainConfigError(
            f"{cfg.out} already holds a training run ({', '.join(p.name for p in used)}/). Fix: pass "
            "--resume to continue it, or choose a new --out.")


def _check_token_maps(cfg: TrainConfig, vocab_size: int, forced: list[int]) -> None:
    """Before any work: every --token-maps size fits the vocabulary and holds the forced ids."""
    too_big = [n for n in cfg.token_maps if n > vocab_size]
    if too_big:
        raise TrainConfigError(f"--token-maps {' '.join(map(str, too_big))}: larger than the target "
                               f"vocabulary ({vocab_size} tokens). Fix: pass sizes <= {vocab_size}.")
    n_forced = len(set(forced))
    too_small = [n for n in cfg.token_maps if n < n_forced]
    if too_small:
        raise TrainConfigError(f"--token-maps {' '.join(map(str, too_small))}: a map must hold the "
                               f"{n_forced} end-of-turn / EOS token(s) {sorted(set(forced))}")


def _training_data(data: FeatureBlock, device: torch.device) -> FeatureBlock:
    """On CUDA the features stay in the target's dtype (autocast reads them) and move to the GPU
    when they take under half its free memory, so a batch is gathered there instead of copied
    over PCIe every step; float32 on the CPU."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if data.nbytes < free // 2:
            return data.to(device)
        log.warning("training features (%.1f GB) stay in host memory: over half the GPU's free "
                    "%.1f GB; every batch is copied to the GPU", data.nbytes / 1e9, free / 1e9)
        return data
    if data.feature.dtype == torch.float32:
        return data
    return FeatureBlock(data.tokens, data.offsets, data.n_prompt, data.feature.float(),
                        None if data.final is None else data.final.float(), data.argmax)


def _eval_prompts(split: PromptSplit, n: int) -> tuple[list[Any], str]:
    """The held-back prompts; with none held back (too few prompts), the first training ones."""
    if split.eval:
        return split.eval, "held-back"
    return split.train[:n], "train"
