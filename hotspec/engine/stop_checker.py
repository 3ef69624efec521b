"""Incremental detokenization and stop handling for one request (vLLM semantics).

Text flows through two hold-backs before it is emitted:
  1. token level: tokens whose text is not yet whole (a byte-level BPE token can carry part of a
     UTF-8 character, decoded as U+FFFD) stay undecoded until a later token completes them;
  2. text level: a suffix that is a proper prefix of some stop string stays unemitted until it
     either completes the stop string (it is then cut, with everything after it) or cannot.
Deltas are never retracted, so the concatenated deltas equal `.text` once the request finishes.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, cast

from hotspec.sampling_params import SamplingParams

FinishReason = Literal["stop", "length"]

# Prompt tokens kept as left context for the first output token: some tokenizers (SentencePiece)
# drop a leading space when a decode starts at a word piece. Same value as vLLM.
_PROMPT_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"


class Tokenizer(Protocol):
    # (transformers types decode's result str | list[str]; one id sequence decodes to a str)
    def decode(self, token_ids: list[int], **kwargs: Any) -> str | list[str]: ...


def rust_backend(tokenizer: Tokenizer | None) -> Any:
    """A transformers fast tokenizer's Rust backend (tokenizers.Tokenizer), or None."""
    backend = getattr(tokenizer, "_tokenizer", None)
    return backend if callable(getattr(backend, "decode", None)) else None


class _IncrementalDecoder:
    """Decodes a growing token list in O(window) per token.

    `_ids[_prefix:_read]` is context whose text was already emitted; `_ids[_read:]` is pending.
    The delta is decode(_ids[_prefix:]) minus decode(_ids[_prefix:_read]): decoding with a little
    left context gets word boundaries right, and subtracting its text leaves only the new part.
    """

    def __init__(self, tokenizer: Tokenizer | None, context: list[int], skip_special_tokens: bool) -> None:
        self._tokenizer = tokenizer  # None: token ids only (skip_tokenizer_init), no text
        # A transformers fast tokenizer's decode without clean-up is its Rust backend's decode; the
        # Python wrapper around it costs 4x the decode itself, twice per generated token, on the
        # engine's critical path, so the backend is called directly where there is one.
        self._backend = rust_backend(tokenizer)
        self._skip_special_tokens = skip_special_tokens
        self._ids = list(context)
        self._prefix = 0
        self._read = len(self._ids)

    def add(self, token_id: int) -> None:
        self._ids.append(token_id)

    def decode(self, final: bool) -> str:
        """Text of the pending tokens that is complete now (all of it if `final`)."""
        if self._read == len(self._ids) or self._tokenizer is None:
            return ""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        incomplete = full_text.endswith(_REPLACEMENT_CHAR) or len(full_text) < len(prefix_text)
        if incomplete and not final:
            return ""
        # Emitted tokens become the next context; older ones are dropped to keep the window small.
        del self._ids[: self._read]
        self._read = len(self._ids)
        return full_text[len(prefix_text) :]

    def _decode(self, ids: list[int]) -> str:
        assert self._tokenizer is not None, "decode() returns before _decode without a tokenizer"
        if self._backend is not None:
            return cast(str, self._backend.decode(ids, skip_special_tokens=self._skip_special_tokens))
        # No clean-up: it rewrites spaces depending on the window, so deltas would not add up.
        text = self._tokenizer.decode(
            ids,
            skip_special_tokens=self._skip_special_tokens,
            clean_up_tokenization_spaces=False,
        )
        return cast(str, text)


class _StreamDecoder:
    """The same deltas from the tokenizers library's DecodeStream (a fast tokenizer's Rust
    backend, where DecodeStream takes a prefix: `ids=`): one call a token where
    _IncrementalDecoder makes two and slices in Python (at hundreds of requests a step, this is
    host time of every step). A token that ends inside a character
    waits (the stream gives nothing) until one completes it; a request that finishes meanwhile
    emits it as decoded, U+FFFD and all."""

    def __init__(self, backend: Any, context: list[int], skip_special_tokens: bool) -> None:
        from tokenizers.decoders import DecodeStream

        self._backend, self._skip = backend, skip_special_tokens
        self._stream = DecodeStream(ids=list(context), skip_special_tokens=skip_special_tokens)
        self._new: list[int] = []  # added, not stepped yet
        self._held: list[int] = []  # stepped, their text not complete yet

    @staticmethod
    def make(tokenizer: Tokenizer | None, context: list[int], skip_special_tokens: bool
             ) -> _StreamDecoder | None:
        """One for `tokenizer` if it has a Rust backend and tokenizers a DecodeStream; else None."""
        backend = rust_backend(tokenizer)
        if backend is None:
            return None
        try:
            return _StreamDecoder(backend, context, skip_special_tokens)
        except (ImportError, TypeError):  # older tokenizers: no DecodeStream(ids=...)
            return None

    def add(self, token_id: int) -> None:
        self._new.append(token_id)

    def decode(self, final: bool) -> str:
        """Text of the added tokens that is complete now (all of it if `final`)."""
        out = ""
        for t in self._new:
            piece = self._stream.step(self._backend, t)
            if piece is None:
                self._held.append(t)
            else:
                out += piece
                self._held.clear()
        self._new.clear()
        if final and self._held:
            out += self._backend.decode(self._held, skip_special_tokens=self._skip)
            self._held.clear()
        return out


class StopChecker:
    """Turns one request's sampled tokens into text deltas and decides when it finishes.

    Finish reasons: "stop" for EOS (unless `ignore_eos`), a `stop_token_ids` token, or a stop
    string; "length" once `max_tokens` tokens exist. `token_ids` keeps every appended token,
    including the stop token and the one that completed a stop string. A stop token's own text
    appears only with `skip_special_tokens=False`; a stop string and all after it never does.
    """

    def __init__(
        self,
        tokenizer: Tokenizer | None,
        params: SamplingParams,
        eos_token_ids: set[int],
        prompt_token_ids: list[int],
    ) -> None:
        self.params = params
        self.token_ids: list[int] = []
        self.text = ""
        self.finish_reason: FinishReason | None = None
        # What stopped the request, as vLLM reports it: the stop string or token id; None for EOS.
        self.stop_reason: str | int | None = None
        self._stop_strings = cast(tuple[str, ...], params.stop)
        self._listed_stop_token_ids = set(cast(tuple[int, ...], params.stop_token_ids))
        self._stop_token_ids = self._listed_stop_token_ids | (
            set() if params.ignore_eos else set(eos_token_ids)
        )
        # Characters of `.text` already returned as deltas.
        self._emitted = 0
        context = prompt_token_ids[max(0, len(prompt_token_ids) - _PROMPT_CONTEXT_TOKENS) :]
        self._decoder: _StreamDecoder | _IncrementalDecoder = \
            _StreamDecoder.make(tokenizer, context, params.skip_special_tokens) or \
            _IncrementalDecoder(tokenizer, context, params.skip_special_tokens)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def append(self, token_id: int) -> tuple[str, FinishReason | None]:
        """Add one sampled token; return (text safe to emit now, finish reason or None)."""
        if self.finish_reason is not None:
            raise RuntimeError(
                f"request already finished ({self.finish_reason!r}); cannot append token {token_id}"
            )
        self.token_ids.append(token_id)
        finish: FinishReason | None = None
        is_stop_token = token_id in self._stop_token_ids
        if is_stop_token:
            finish = "stop"
            self.stop_reason = token_id if token_id in self._listed_stop_token_ids else None
        elif len(self.token_ids) >= self.params.max_tokens:
            finish = "length"
        if not (is_stop_token and self.params.skip_special_tokens):
            self._decoder.add(token_id)

        piece = self._decoder.decode(final=finish is not None)
        if not self._stop_strings:  # (most requests: no stop string to cut or hold back)
            self.text += piece
            self._emitted = len(self.text)
            self.finish_reason = finish
            return piece, finish
        new_from = len(self.text)
        self.text += piece
        cut = self._find_stop_string(new_from)
        if cut is not None:
            self.text = self.text[:cut]
            finish = "stop"
        emit_to = len(self.text) if finish is not None else len(self.text) - self._held_back()
        delta = self.text[self._emitted : max(emit_to, self._emitted)]
        self._emitted += len(delta)
        self.finish_reason = finish
        return delta, finish

    def _find_stop_string(self, new_from: int) -> int | None:
        """Start of the earliest stop string that ends in text[new_from:], if any.

        Text before `new_from` holds no whole stop string (the request would have finished), so
        a match must start at or after new_from - len(stop) + 1.
        """
        best: int | None = None
        for stop in self._stop_strings:
            at = self.text.find(stop, max(0, new_from - len(stop) + 1))
            if at != -1 and (best is None or at < best):
                best = at
                self.stop_reason = stop
        return best

    def _held_back(self) -> int:
        """Length of the longest suffix of `.text` that is a proper prefix of a stop string."""
        held = 0
        for stop in self._stop_strings:
            for n in range(min(len(stop) - 1, len(self.text)), held, -1):
                if self.text.endswith(stop[:n]):
                    held = n
                    break
        return held
