"""TrainConfig: every option of `hotspec train-draft`, validated once (the CLI maps onto it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hotspec.errors import HotspecError

ARCHS = ("eagle3", "eagle")
ALGORITHM = {"eagle3": "EAGLE3", "eagle": "EAGLE"}  # the engine's speculative_algorithm


class TrainConfigError(HotspecError, ValueError):
    """An invalid train-draft option."""


@dataclass(frozen=True)
class TrainConfig:
    out: Path
    model: str | None = None  # None: the embedded default (SmolLM2-135M-Instruct)
    arch: str = "eagle3"
    # EAGLE-3: rows of the head's own LM head (d2t). EAGLE: size of the FR-Spec map written next to
    # the head (freq_<N>.pt). None: EAGLE-3 takes min(32000, vocab), EAGLE writes no map.
    draft_vocab: int | None = None
    # Width of the head's MLP (config.json intermediate_size). None: the target's. A wider MLP
    # gives the head more capacity; the public formats read the width from config.json, so the
    # engine, SGLang and the EAGLE repo build the wider head as they are.
    intermediate_size: int | None = None
    # EAGLE-3: the head's LM head is the target's (whole vocabulary), frozen and not exported.
    share_lm_head: bool = False
    # A trained head (public format) to start from instead of random weights: fine-tuning. Its
    # config.json fixes the head's shape (vocabulary, MLP width, aux layers).
    init: Path | None = None
    # FR-Spec maps DIR/freq_<N>.pt of the N most frequent response tokens, for either arch.
    token_maps: tuple[int, ...] = ()
    prompts: tuple[Path, ...] = ()  # empty: prompts synthesized by the target itself
    # Token shards (token_shards.py) to train on, the target's features computed per batch
    # (online.py); no prompts, responses or feature shards are made.
    data: Path | None = None
    # With `data`: evaluate tau on these prompts (first user turns) instead of held-back records.
    eval_prompts_file: Path | None = None
    num_prompts: int = 256
    # With prompt files: this many more prompts sampled from the target, added to the files' ones.
    synth_prompts: int = 0
    # Responses per training prompt; more than one needs response_temperature > 0 (each is drawn
    # with its own seed): more of the target's own text from the same prompts.
    responses_per_prompt: int = 1
    eval_prompts: int = 8  # held back from training, decoded with the trained head for tau
    max_new_tokens: int = 256
    response_temperature: float = 0.0  # 0: greedy responses
    max_seq_len: int = 2048  # records (prompt + response) are cut to this many tokens
    # With `data`: only the first N tokens of each answer are labels, and a record ends after its
    # last label (long greedy loops weigh less, and cost less). None: every answer token.
    max_answer_tokens: int | None = None
    epochs: int = 1
    lr: float = 1e-4
    batch_size: int = 4
    ttt_steps: int | None = None  # None: EAGLE-3 7 on CUDA / 3 on CPU; EAGLE 1
    warmup_ratio: float = 0.05
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    save_every: int = 200  # optimizer steps between checkpoints (and one at the end)
    device: str = "auto"
    dtype: str = "auto"  # the target's dtype for data generation and evaluation
    seed: int = 0
    resume: bool = False
    eval_num_steps: int = 3  # draft depth of the tau evaluation (chain, topk 1)
    progress: bool = True
    # Stop after this many optimizer steps as if interrupted (the schedule still spans all epochs);
    # tests use it to exercise --resume.
    halt_after: int | None = None
    # Seconds of training after which the run saves its checkpoint and stops, to be continued with
    # --resume (time-boxed GPU runs).
    time_limit: float | None = None
    max_num_seqs: int | None = None  # data and evaluation engines; None: the engine's default
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # extra EngineConfig fields
    command: str = ""  # the command line, for the report

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise TrainConfigError(f"--arch {self.arch!r}; choose one of {', '.join(ARCHS)}")
        positive = ("num_prompts", "max_new_tokens", "max_seq_len", "epochs", "batch_size",
                    "save_every", "eval_num_steps")
        for name in positive:
            if getattr(self, name) < 1:
                raise TrainConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.responses_per_prompt < 1:
            raise TrainConfigError(f"--responses-per-prompt must be >= 1, got {self.responses_per_prompt}")
        if self.responses_per_prompt > 1 and self.response_temperature == 0:
            raise TrainConfigError("--responses-per-prompt > 1 repeats the same greedy response; "
                                   "pass --temperature > 0 (0.7 is common) to sample them")
        if self.synth_prompts < 0:
            raise TrainConfigError(f"--synth-prompts must be >= 0, got {self.synth_prompts}")
        if self.synth_prompts and not self.prompts:
            raise TrainConfigError("--synth-prompts adds sampled prompts to --prompts files; without "
                                   "files, --num-prompts prompts are sampled from the target already")
        if self.eval_prompts < 0:
            raise TrainConfigError(f"eval_prompts must be >= 0, got {self.eval_prompts}")
        if self.draft_vocab is not None and self.draft_vocab < 1:
            raise TrainConfigError(f"--draft-vocab must be >= 1, got {self.draft_vocab}")
        self._check_intermediate_size()
        if self.share_lm_head and self.arch != "eagle3":
            raise TrainConfigError("--share-lm-head is for EAGLE-3 heads; EAGLE-1/2 heads always "
                                   "use the target's LM head")
        if self.share_lm_head and self.draft_vocab is not None:
            raise TrainConfigError("--share-lm-head proposes from the target's whole vocabulary; "
                                   "drop --draft-vocab (an FR-Spec map cuts it at serving time: "
                                   "--token-maps writes them)")
        self._check_init()
        if any(n < 1 for n in self.token_maps):
            raise TrainConfigError(f"--token-maps sizes must be >= 1, got {list(self.token_maps)}")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise TrainConfigError(f"--max-num-seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_answer_tokens is not None:
            if self.data is None:
                raise TrainConfigError("--max-answer-tokens caps the answers of --data's shards; "
                                       "without --data, --max-new-tokens sets the answer length")
            if self.max_answer_tokens < 1:
                raise TrainConfigError(f"--max-answer-tokens must be >= 1, got {self.max_answer_tokens}")
        if self.time_limit is not None and not self.time_limit > 0:
            raise TrainConfigError(f"--time-limit must be > 0 seconds, got {self.time_limit}")
        if self.ttt_steps is not None and self.ttt_steps < 1:
            raise TrainConfigError(f"--ttt-steps must be >= 1, got {self.ttt_steps}")
        if not self.lr > 0:
            raise TrainConfigError(f"--lr must be > 0, got {self.lr}")
        if not 0 <= self.warmup_ratio < 1:
            raise TrainConfigError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.response_temperature < 0:
            raise TrainConfigError(f"response temperature must be >= 0, got {self.response_temperature}")
        self._check_data()
        if self.max_seq_len <= 2:
            raise TrainConfigError(f"max_seq_len must be > 2, got {self.max_seq_len}")

    def _check_data(self) -> None:
        """--data trains on recorded conversations: the generation options do not apply."""
        if self.data is None:
            if self.eval_prompts_file is not None:
                raise TrainConfigError("--eval-prompts-file goes with --data; without it, "
                                       "--eval-prompts prompts are held back from --prompts")
            return
        clash = [flag for flag, on in (("--prompts", bool(self.prompts)),
                                       ("--synth-prompts", self.synth_prompts > 0),
                                       ("--responses-per-prompt", self.responses_per_prompt > 1))
                 if on]
        if clash:
            raise TrainConfigError(f"--data trains on the conversations of its token shards; "
                                   f"{', '.join(clash)} generate(s) new ones. Fix: drop "
                                   f"{', '.join(clash)}, or drop --data.")

    def _check_init(self) -> None:
        """--init takes the head's shape from its folder: options that would set it again clash."""
        if self.init is None:
            return
        clash = [flag for flag, on in (("--intermediate-size", self.intermediate_size is not None),
                                       ("--draft-vocab", self.draft_vocab is not None
                                        and self.arch == "eagle3")) if on]
        if clash:
            raise TrainConfigError(f"--init {self.init} starts from that head, whose config.json "
                                   f"sets its vocabulary and MLP width; drop {', '.join(clash)}.")

    def _check_intermediate_size(self) -> None:
        """A width the head's Linear layers can have: a positive int (not a float or bool, which
        the CLI never passes but the Python API could, and which would end up in config.json)."""
        n = self.intermediate_size
        if n is None:
            return
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise TrainConfigError(f"--intermediate-size must be a positive integer (the width of "
                                   f"the head's MLP), got {n!r}. Fix: pass N >= 1, or leave it out "
                                   "for the target's intermediate_size.")

    @property
    def algorithm(self) -> str:
        return ALGORITHM[self.arch]

    def resolved_ttt_steps(self, device_type: str) -> int:
        if self.ttt_steps is not None:
            return self.ttt_steps
        if self.arch == "eagle":
            return 1
        return 7 if device_type == "cuda" else 3

    def engine_options(self) -> dict[str, Any]:
        """EngineConfig keywords shared by the data and evaluation engines."""
        opts: dict[str, Any] = {"dtype": self.dtype, "device": self.device, "seed": self.seed}
        if self.max_num_seqs is not None:  # batches that large are graphed too
            opts["max_num_seqs"] = self.max_num_seqs
            opts["cuda_graph_max_bs"] = self.max_num_seqs
        return {**opts, **self.engine_kwargs}
