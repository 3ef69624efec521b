"""A request's grammar compiled in the server before the request reaches the engine: one that does
not compile (an invalid JSON schema, regex, EBNF or structural tag) is a 400 naming its field, and
the engine never sees it. One GrammarCompiler per server, built on the first grammar request over
the server's tokenizer and the target's vocabulary width (its logits columns, as the engine's),
compiling on a worker thread (a schema can take milliseconds): the event loop never waits on it.
The compiler caches, so a schema sent again costs a lookup.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hotspec.entrypoints.api_errors import APIError
from hotspec.errors import InvalidRequestError
from hotspec.runtime.grammar import GrammarCompiler
from hotspec.sampling_params import GrammarSpec

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class GrammarCheck:
    """Compiles requests' grammars; `vocab()` gives the logits width, read on first use."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase | None, vocab: Callable[[], int]) -> None:
        self.tokenizer, self.vocab = tokenizer, vocab
        self._compiler: GrammarCompiler | None = None
        self._lock = threading.Lock()

    def compiler(self) -> GrammarCompiler:
        with self._lock:  # two first requests at once build it once
            if self._compiler is None:
                self._compiler = GrammarCompiler(self.tokenizer, self.vocab())
            return self._compiler

    async def check(self, spec: GrammarSpec) -> None:
        """Raises APIError 400 (param: the spec's field) when `spec` does not compile."""
        if self.tokenizer is None:
            raise APIError(400, f"{spec.field}: structured output needs a tokenizer; this server "
                           "runs without one (skip_tokenizer_init)", param=spec.field)
        try:
            await asyncio.to_thread(lambda: self.compiler().compile(spec))
        except InvalidRequestError as e:
            raise APIError(400, str(e), param=spec.field) from None


def checkpoint_vocab_size(model: str | None) -> int:
    """The vocabulary width (`vocab_size`: the LM head's rows) of the checkpoint the engine
    loads for `model`, read from its config alone (config.json, or a GGUF's metadata)."""
    from hotspec.models.loader import locate_checkpoint, resolve_model_path

    kind, location = locate_checkpoint(resolve_model_path(model))
    if kind == "gguf":
        from hotspec.models.gguf_reader import read_gguf_config

        return int(read_gguf_config(location)["vocab_size"])
    return int(json.loads(Path(location, "config.json").read_text())["vocab_size"])
