"""OpenAI request bodies (/v1/completions, /v1/chat/completions) as pydantic models.

Types are strict (a string is not a number, 1.0 is not an int), as OpenAI's API is. One rule for
the fields of a body (and of each chat message): a field the model declares is implemented; a
field in IGNORED_FIELDS changes nothing in the answer and is accepted; any other field is refused
with a 400 that names it, unless it is null or its "off" value in NEUTRAL_VALUES (so clients that
send OpenAI's defaults, e.g. suffix="" or best_of=1, keep working). Value ranges (temperature
>= 0, top_p in (0, 1], ...) are SamplingParams' to check, in one place; the ranges that depend on
the API's own fields are checked here, under their names: the logprobs fields' (chat's
top_logprobs is SamplingParams.logprobs), max_tokens' (>= 1, or 0 with completions' echo), n's
and best_of's, and the logits processing fields' (logit_bias's keys are strings of token ids).
Structured output's fields (structured.py) and chat's tool fields (tool_request.py) become
SamplingParams.grammar: at most one of them per request.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from hotspec.core.logprobs import MAX_LOGPROBS
from hotspec.entrypoints.param_errors import InvalidParameterError, UnsupportedParameterError
from hotspec.entrypoints.structured import StructuredFields
from hotspec.entrypoints.tool_request import ToolCall, ToolFields
from hotspec.sampling_params import GrammarSpec, SamplingParams

Number = Annotated[float, Field(strict=True)]  # strict float still takes ints, not strings

# Fields that only label, store or route a request: accepted, ignored.
IGNORED_FIELDS = frozenset({"user", "metadata", "store", "service_tier", "prompt_cache_key",
                            "safety_identifier", "parallel_tool_calls", "name", "refusal",
                            "annotations"})
# Fields hotspec does not implement, accepted at the values that turn them off.
NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "best_of": (1,), "top_logprobs": (0,), "suffix": ("",), "tools": ([],), "functions": ([],),
    "tool_choice": ("none",), "function_call": ("none",), "modalities": (["text"],),
}
MAX_N = 16  # choices per request (n)
MAX_BIAS = 100.0  # |logit_bias| values, as OpenAI's API
MAX_PENALTY = 2.0  # |presence_penalty| and |frequency_penalty|, as OpenAI's API
_TOKEN_ID = re.compile(r"-?[0-9]+")  # a logit_bias key: ASCII digits only (int() takes more)


def check_logprobs_range(name: str, value: int | None) -> None:
    """A count of alternatives per token: None, or an int in [0, MAX_LOGPROBS]."""
    if value is not None and not 0 <= value <= MAX_LOGPROBS:
        raise InvalidParameterError(name, f"{name} must be an int in [0, {MAX_LOGPROBS}] (the most "
                                    f"likely alternatives per token), got {value}")


def check_penalty(name: str, value: float | None) -> None:
    """presence_penalty or frequency_penalty: None, or a number in [-2, 2]."""
    if value is not None and not -MAX_PENALTY <= value <= MAX_PENALTY:
        raise InvalidParameterError(name, f"{name} must be a number in [-2, 2] (0 = off), got {value}")


def token_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """logit_bias in OpenAI's shape ({"token id": bias in [-100, 100]}) as SamplingParams takes
    it; None when empty. Ids the vocabulary does not hold are the engine's to refuse."""
    if not bias:
        return None
    out: dict[int, float] = {}
    for key, value in bias.items():
        if not _TOKEN_ID.fullmatch(key):
            raise InvalidParameterError("logit_bias", f"logit_bias keys must be token ids (strings "
                                        f"of ints), got {_shown(key)}")
        if int(key) < 0:
            raise InvalidParameterError("logit_bias", f"logit_bias token ids [{int(key)}] are "
                                        "outside the vocabulary (ids are >= 0)")
        if not -MAX_BIAS <= value <= MAX_BIAS:
            raise InvalidParameterError("logit_bias", f"logit_bias values must be numbers in "
                                        f"[-100, 100], got {value} for token {key}")
        out[int(key)] = value
    return out


def choice_params(params: SamplingParams, n: int) -> list[SamplingParams]:
    """One SamplingParams per choice of n: with a seed s, choice i's seed is s + i (the choices
    differ, the answer is reproducible); without one, each request draws its own."""
    if params.seed is None:
        return [params] * n
    return [dataclasses.replace(params, seed=params.seed + i) for i in range(n)]


def _is_neutral(name: str, value: Any) -> bool:
    return any(value == off and isinstance(value, bool) == isinstance(off, bool)
               for off in NEUTRAL_VALUES.get(name, ()))


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def refuse_unsupported(model: type[BaseModel], data: dict[str, Any], where: str = "") -> None:
    """The rule above, for `data` about to be validated as `model`; `where` prefixes field paths."""
    bad = [(name, value) for name, value in data.items()
           if name not in model.model_fields and name not in IGNORED_FIELDS and value is not None
           and not _is_neutral(name, value)]
    if bad:
        raise UnsupportedParameterError(where + bad[0][0], "; ".join(
            f"{where}{name} is not supported by this server (got {_shown(value)}); omit it"
            for name, value in bad))


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False


class _SamplingRequest(StructuredFields):
    model_config = ConfigDict(extra="ignore")  # only fields refuse_unsupported let through

    model: StrictStr
    max_tokens: StrictInt | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    top_k: StrictInt | None = None  # extension (vLLM, SGLang)
    min_p: Number | None = None  # extension
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stop_token_ids: list[StrictInt] | None = None  # extension
    ignore_eos: StrictBool = False  # extension
    skip_special_tokens: StrictBool = True  # extension
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    n: StrictInt | None = None  # choices: n engine requests on the same prompt
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    repetition_penalty: Number | None = None  # extension (vLLM)
    logit_bias: dict[StrictStr, Number] | None = None  # {"token id": bias}
    min_tokens: StrictInt | None = None  # extension (vLLM)

    @classmethod
    def refuse_unsupported(cls, data: dict[str, Any]) -> None:
        refuse_unsupported(cls, data)

    def check_supported(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise UnsupportedParameterError("stream_options", "stream_options needs stream=true")
        self.check_max_tokens()
        if self.n is not None and not 1 <= self.n <= MAX_N:
            raise InvalidParameterError("n", f"n must be an int in [1, {MAX_N}] (choices per "
                                        f"request), got {self.n}")
        self.check_logits_processing()

    def check_logits_processing(self) -> None:
        """The penalties' ranges and logit_bias's shape (min_tokens: in sampling_params, where
        max_tokens is known)."""
        check_penalty("presence_penalty", self.presence_penalty)
        check_penalty("frequency_penalty", self.frequency_penalty)
        r = self.repetition_penalty
        if r is not None and not (math.isfinite(r) and r > 0):
            raise InvalidParameterError("repetition_penalty", "repetition_penalty must be a finite "
                                        f"number > 0 (1 = off), got {r}")
        token_bias(self.logit_bias)

    def check_min_tokens(self, max_tokens: int) -> None:
        """min_tokens, when sent, is an int in [0, max_tokens]."""
        m = self.min_tokens
        if m is not None and not 0 <= m <= max_tokens:
            raise InvalidParameterError("min_tokens", f"min_tokens must be an int in [0, "
                                        f"max_tokens={max_tokens}], got {m}")

    @property
    def num_choices(self) -> int:
        """n: the choices of the answer (1 when not sent)."""
        return 1 if self.n is None else self.n

    def check_max_tokens(self) -> None:
        """max_tokens, when sent, is an int >= 1."""
        n = self.requested_max_tokens
        if n is not None and n < 1:
            raise InvalidParameterError("max_tokens", f"max_tokens must be an int >= 1, got {n}")

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def requested_logprobs(self) -> int | None:
        """SamplingParams.logprobs: None (no logprobs) or the alternatives per token."""
        return None

    @property
    def requested_prompt_logprobs(self) -> int | None:
        """SamplingParams.prompt_logprobs: None (the prompt is not scored) or the alternatives."""
        return None

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        """OpenAI's defaults (temperature 1, top_p 1, penalties off) for fields not sent; range
        errors raise InvalidRequestError (InvalidParameterError here, or from SamplingParams)."""
        self.check_supported()
        max_tokens = default_max_tokens if self.requested_max_tokens is None else self.requested_max_tokens
        self.check_min_tokens(max_tokens)
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=-1 if self.top_k is None else self.top_k,
            min_p=0.0 if self.min_p is None else self.min_p,
            seed=self.seed, max_tokens=max_tokens,
            stop=self.stop, stop_token_ids=self.stop_token_ids, ignore_eos=self.ignore_eos,
            skip_special_tokens=self.skip_special_tokens, logprobs=self.requested_logprobs,
            prompt_logprobs=self.requested_prompt_logprobs,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            logit_bias=token_bias(self.logit_bias), min_tokens=self.min_tokens or 0,
            grammar=self.grammar())

    def grammar(self) -> GrammarSpec | None:
        """The one grammar the output must match (structured.py, chat's tool_choice), if any."""
        specs = self.output_grammars()
        if len(specs) > 1:
            names = [spec.field.split(".")[0] for spec in specs]
            raise InvalidParameterError(names[1], f"{' and '.join(names)} each constrain the "
                                        "output; send at most one of them")
        return specs[0] if specs else None


class CompletionRequest(_SamplingRequest):
    # A string, or token ids (the OpenAI API allows both); a one-element batch of either.
    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]
    logprobs: StrictInt | None = None  # legacy: each token's logprob and the n likeliest tokens
    echo: StrictBool | None = None  # the answer starts with the prompt (and its logprobs)
    best_of: StrictInt | None = None  # only equal to n: no server-side ranking

    def check_supported(self) -> None:
        super().check_supported()
        check_logprobs_range("logprobs", self.logprobs)
        b, n = self.best_of, self.num_choices
        if b is not None and b > n:
            raise UnsupportedParameterError("best_of", f"best_of > n is not supported (got "
                                            f"best_of={b}, n={n}): omit best_of, or send it equal to n")
        if b is not None and b < n:
            raise InvalidParameterError("best_of", f"best_of must be >= n (got best_of={b}, n={n})")

    def check_max_tokens(self) -> None:
        """max_tokens >= 1, or 0 with echo: the prompt alone (what evaluation harnesses send to
        score a prompt)."""
        n = self.max_tokens
        if self.echo and n is not None and n < 0:
            raise InvalidParameterError("max_tokens", f"max_tokens must be an int >= 0 with echo "
                                        f"(0: the prompt alone), got {n}")
        if n == 0 and not self.echo:
            raise InvalidParameterError("max_tokens", "max_tokens must be an int >= 1, got 0 (0 "
                                        "needs echo=true: the answer is the prompt alone)")
        if not self.echo:
            super().check_max_tokens()

    @property
    def requested_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def requested_prompt_logprobs(self) -> int | None:
        """echo with logprobs n: n; echo with max_tokens 0: 0 (the engine generates nothing only
        for a prompt it scores; the answer does not report them); otherwise None."""
        if not self.echo:
            return None
        if self.logprobs is not None:
            return self.logprobs
        return 0 if self.max_tokens == 0 else None

    def single_prompt(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise UnsupportedParameterError("prompt", f"a batch of {len(p)} prompts is not "
                                                "supported: send one prompt per request")
            return p[0]  # type: ignore[return-value]
        return p  # type: ignore[return-value]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: StrictStr | None = None  # a tool message: the call it answers

    def as_template_input(self) -> dict[str, Any]:
        """The message as chat templates read it (Qwen2.5's, Hermes')."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        role = "system" if self.role == "developer" else self.role
        out: dict[str, Any] = {"role": role, "content": content or ""}
        if self.tool_calls:
            out["tool_calls"] = [call.as_template_input() for call in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class ChatCompletionRequest(_SamplingRequest, ToolFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None  # OpenAI's newer name for max_tokens
    logprobs: StrictBool | None = None  # each token's logprob in the answer
    top_logprobs: StrictInt | None = None  # and its n likeliest alternatives (with logprobs)

    @classmethod
    def refuse_unsupported(cls, data: dict[str, Any]) -> None:
        """The rule for the body, each message and each content part (text parts only)."""
        super().refuse_unsupported(data)
        messages = data.get("messages")
        for i, message in enumerate(messages if isinstance(messages, list) else ()):
            if not isinstance(message, dict):
                continue  # a type error: the schema says so
            refuse_unsupported(ChatMessage, message, f"messages.{i}.")
            parts = message.get("content")
            for j, part in enumerate(parts if isinstance(parts, list) else ()):
                if not isinstance(part, dict):
                    continue
                kind = part.get("type")
                if kind is not None and kind != "text":
                    raise UnsupportedParameterError(
                        f"messages.{i}.content.{j}.type", f"messages.{i}.content.{j}: content "
                        f"parts of type {_shown(kind)} are not supported; send text parts")
                refuse_unsupported(TextPart, part, f"messages.{i}.content.{j}.")

    def check_supported(self) -> None:
        super().check_supported()
        if self.max_completion_tokens is not None and self.max_tokens is not None \
                and self.max_completion_tokens != self.max_tokens:
            raise UnsupportedParameterError("max_completion_tokens", "max_tokens and "
                                            "max_completion_tokens differ; send one of them")
        check_logprobs_range("top_logprobs", self.top_logprobs)
        if self.top_logprobs and not self.logprobs:  # 0 is the "off" value: accepted alone
            raise InvalidParameterError("top_logprobs", "top_logprobs needs logprobs=true")
        self.check_tools()

    def output_grammars(self) -> list[GrammarSpec]:
        tools = self.tool_grammar()
        return super().output_grammars() + ([] if tools is None else [tools])

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens if self.max_tokens is not None else self.max_completion_tokens

    @property
    def requested_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
