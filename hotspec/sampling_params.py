"""Per-request sampling parameters, named as in vLLM and validated in one place."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from hotspec.core.logprobs import MAX_LOGPROBS
from hotspec.errors import InvalidRequestError

_INT64_END = 2**63  # top_k is a tensor of int64 on the device


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _fail(field: str, value: object, allowed: str) -> InvalidRequestError:
    return InvalidRequestError(f"SamplingParams.{field} must be {allowed}, got {value!r}")


GRAMMAR_KINDS = ("json_object", "json_schema", "regex", "ebnf", "structural_tag")


@dataclass(frozen=True)
class GrammarSpec:
    """A grammar the output must match (structured output, runtime/grammar.py compiles it):
    `json_object` (any JSON object; `value` unused), `json_schema` (`value`: the schema as JSON
    text), `regex`, `ebnf` (GBNF, root rule `root`) or `structural_tag` (xgrammar's JSON).
    `field`: the request field it came from, named in errors (`response_format`, `guided_regex`)."""

    kind: str
    value: str = ""
    field: str = "grammar"

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise InvalidRequestError(f"{self.field}: grammar kind must be one of "
                                      f"{', '.join(GRAMMAR_KINDS)}, got {self.kind!r}")
        if not isinstance(self.value, str) or (self.kind != "json_object" and not self.value):
            raise InvalidRequestError(f"{self.field}: a {self.kind} grammar needs its text")


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request and when to stop.

    Filters apply in the order temperature, top-k, top-p, min-p (as Hugging Face `generate`).
    `top_k` of -1 or 0 disables top-k. `stop` is normalised to a tuple of non-empty strings and
    `stop_token_ids` to a tuple of ints. Stop strings and stop tokens are never part of the text.
    `detokenize=False` (vLLM's field) returns token ids only, no text: the host skips two tokenizer
    calls per token, which matters at large batches; stop strings need the text, so they are refused.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 16
    stop: str | Sequence[str] | None = None
    stop_token_ids: Sequence[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    detokenize: bool = True
    # None: no logprobs; n in [0, 20]: each generated token's logprob and the n most likely tokens
    # at its position (core/logprobs.py: the target's raw distribution)
    logprobs: int | None = None
    # None: none; n in [0, 20]: the logprob of each prompt token after the first (given the ones
    # before it) and the n most likely tokens there (`echo` with logprobs; vLLM's field)
    prompt_logprobs: int | None = None
    # Logits processing, as vLLM applies it, in this order: logit_bias added ({token id: bias in
    # [-100, 100]}), the stop tokens (EOS unless ignore_eos, stop_token_ids) masked while fewer
    # than min_tokens are generated, repetition_penalty over prompt and generated tokens (a
    # positive logit divided by it, a negative one multiplied), presence_penalty (once) and
    # frequency_penalty (per occurrence) subtracted for generated tokens. Logprobs stay the raw
    # distribution's.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Mapping[int, float] | None = None
    min_tokens: int = 0
    # Structured output: every generated token keeps the text a prefix of the grammar's language,
    # and the request stops when the grammar is complete (runtime/grammar.py)
    grammar: GrammarSpec | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        if not _is_real(t) or not math.isfinite(t) or t < 0:
            raise _fail("temperature", t, "a finite number >= 0 (0 = greedy)")
        p = self.top_p
        if not _is_real(p) or not 0 < p <= 1:
            raise _fail("top_p", p, "a number in (0, 1] (1 = off)")
        if not _is_int(self.top_k) or not -1 <= self.top_k < _INT64_END:
            raise _fail("top_k", self.top_k, "an int in [-1, 2**63) (-1 or 0 = off)")
        m = self.min_p
        if not _is_real(m) or not 0 <= m <= 1:
            raise _fail("min_p", m, "a number in [0, 1] (0 = off)")
        if self.seed is not None and not _is_int(self.seed):
            raise _fail("seed", self.seed, "an int or None")
        least = 0 if self.prompt_logprobs is not None else 1  # 0: the prompt scored alone
        if not _is_int(self.max_tokens) or self.max_tokens < least:
            raise _fail("max_tokens", self.max_tokens, f"an int >= {least}")
        for name in ("logprobs", "prompt_logprobs"):
            n = getattr(self, name)
            if n is not None and (not _is_int(n) or not 0 <= n <= MAX_LOGPROBS):
                raise _fail(name, n, f"None or an int in [0, {MAX_LOGPROBS}]")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _is_real(v) or not -2 <= v <= 2:
                raise _fail(name, v, "a number in [-2, 2] (0 = off)")
        r = self.repetition_penalty
        if not _is_real(r) or not math.isfinite(r) or r <= 0:
            raise _fail("repetition_penalty", r, "a finite number > 0 (1 = off)")
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise _fail("min_tokens", self.min_tokens, f"an int in [0, max_tokens={self.max_tokens}]")
        object.__setattr__(self, "logit_bias", _normalise_bias(self.logit_bias))
        for flag in ("ignore_eos", "skip_special_tokens", "detokenize"):
            if not isinstance(getattr(self, flag), bool):
                raise _fail(flag, getattr(self, flag), "a bool")
        # Frozen dataclass: normalised fields are written once, here, before anyone reads them.
        object.__setattr__(self, "stop", _normalise_stop(self.stop))
        object.__setattr__(self, "stop_token_ids", _normalise_stop_token_ids(self.stop_token_ids))
        if self.grammar is not None and not isinstance(self.grammar, GrammarSpec):
            raise _fail("grammar", self.grammar, "a GrammarSpec or None")
        if self.stop and not self.detokenize:
            raise InvalidRequestError("stop strings need the text, but detokenize is False: use "
                                      "stop_token_ids, or detokenize=True")

    @cached_property
    def processes_logits(self) -> bool:
        """Whether any logits processing applies (penalties, logit_bias, min_tokens, a grammar);
        asked of every request at every step, so computed once."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1
                    or self.logit_bias or self.min_tokens or self.grammar is not None)

    @property
    def greedy(self) -> bool:
        """True when sampling reduces to argmax: temperature 0 or top-k of 1."""
        return self.temperature == 0 or self.top_k == 1


def _normalise_bias(bias: Mapping[int, float] | None) -> Mapping[int, float] | None:
    if bias is None:
        return None
    if not isinstance(bias, Mapping) or not all(
            _is_int(k) and k >= 0 and _is_real(v) and -100 <= v <= 100 for k, v in bias.items()):
        raise _fail("logit_bias", bias, "a mapping of token ids >= 0 to numbers in [-100, 100]")
    return dict(bias)  # (a copy: the caller's dict may change; plain, so it pickles)


def _normalise_stop(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    items = (stop,) if isinstance(stop, str) else stop
    if not isinstance(items, Sequence) or not all(isinstance(s, str) and s for s in items):
        raise _fail("stop", stop, "a non-empty string, a list of non-empty strings, or None")
    return tuple(items)


def _normalise_stop_token_ids(ids: Sequence[int] | None) -> tuple[int, ...]:
    if ids is None:
        return ()
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise _fail("stop_token_ids", ids, "a list of ints >= 0, or None")
    if not all(_is_int(i) and i >= 0 for i in ids):
        raise _fail("stop_token_ids", ids, "a list of ints >= 0, or None")
    return tuple(ids)
