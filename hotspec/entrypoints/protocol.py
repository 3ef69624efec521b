"""OpenAI request bodies (/v1/completions, /v1/chat/completions) as pydantic models.

Types are strict (a string is not a number, 1.0 is not an int), as OpenAI's API is; unknown fields
are ignored (clients send `user`, `metadata`, ...); fields hotspec does not implement are accepted
only at their neutral value, anything else is a clear 400 rather than a silently different result.
Value ranges (temperature >= 0, max_tokens >= 1, ...) are SamplingParams' to check, in one place.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from hotspec.errors import InvalidRequestError
from hotspec.sampling_params import SamplingParams

Number = Annotated[float, Field(strict=True)]  # strict float still takes ints, not strings


class UnsupportedParameterError(InvalidRequestError):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False


class _SamplingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

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
    n: StrictInt | None = None  # null is OpenAI's default (1)
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    # OpenAI fields without an implementation: accepted at their neutral value only.
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    logit_bias: dict[str, Any] | None = None
    logprobs: Any = None
    top_logprobs: StrictInt | None = None
    best_of: StrictInt | None = None

    def check_supported(self) -> None:
        if self.n not in (None, 1):
            raise UnsupportedParameterError("n", f"n={self.n} is not supported: this server returns "
                                            "exactly one choice per request (n=1)")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if value not in (None, 0):
                raise UnsupportedParameterError(name, f"{name} is not supported (got {value}); omit it or "
                                                "send 0")
        if self.logit_bias:
            raise UnsupportedParameterError("logit_bias", "logit_bias is not supported; omit it")
        if self.logprobs not in (None, False, 0) or self.top_logprobs:
            raise UnsupportedParameterError("logprobs", "logprobs are not supported; omit logprobs")
        if self.best_of not in (None, 1):
            raise UnsupportedParameterError("best_of", f"best_of={self.best_of} is not supported (only 1)")
        if self.stream_options is not None and not self.stream:
            raise UnsupportedParameterError("stream_options", "stream_options needs stream=true")

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        """OpenAI's defaults (temperature 1, top_p 1) for fields not sent; range errors raise
        InvalidRequestError from SamplingParams."""
        self.check_supported()
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=-1 if self.top_k is None else self.top_k,
            min_p=0.0 if self.min_p is None else self.min_p,
            seed=self.seed,
            max_tokens=default_max_tokens if self.requested_max_tokens is None else self.requested_max_tokens,
            stop=self.stop, stop_token_ids=self.stop_token_ids, ignore_eos=self.ignore_eos,
            skip_special_tokens=self.skip_special_tokens)


class CompletionRequest(_SamplingRequest):
    # A string, or token ids (the OpenAI API allows both); a one-element batch of either.
    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]
    echo: StrictBool | None = None
    suffix: StrictStr | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise UnsupportedParameterError("echo", "echo is not supported; omit it")
        if self.suffix:
            raise UnsupportedParameterError("suffix", "suffix is not supported; omit it")

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

    def as_template_input(self) -> dict[str, str]:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": content or ""}


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None  # OpenAI's newer name for max_tokens

    def check_supported(self) -> None:
        super().check_supported()
        if self.max_completion_tokens is not None and self.max_tokens is not None \
                and self.max_completion_tokens != self.max_tokens:
            raise UnsupportedParameterError("max_completion_tokens", "max_tokens and "
                                            "max_completion_tokens differ; send one of them")

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens if self.max_tokens is not None else self.max_completion_tokens
