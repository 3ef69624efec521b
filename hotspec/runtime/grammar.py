"""Structured output: grammars (SamplingParams.grammar) compiled by xgrammar, one matcher per
request.

`GrammarCompiler` compiles a GrammarSpec over one tokenizer and vocabulary width (the target's
logits columns), caching by spec; a spec that does not compile is an InvalidRequestError naming
the request field it came from, so servers check requests with it before they reach the engine.
`RequestGrammar` is one request's matcher: the engine advances it over every token the request
emits, and before a step writes into the request's row of the step's token bitmask what may
come next (LogitsState.grammar): one row for a decode step, one per tree node for a speculative
step, each node's row the mask after its path (a node whose path leaves the grammar gets the
full row: it cannot be accepted, since its parent's masked target never picks it).
"""

from __future__ import annotations

import re
import threading
from typing import Any

import torch

from hotspec.errors import InvalidRequestError
from hotspec.sampling_params import GrammarSpec

# xgrammar's C++ messages start with a time, a source line and, for some, a failed check
_CPP_PREFIX = re.compile(r"^(\[[^\]]*\]\s*\S+:\d+:\s*)?(Check failed: .*? is false:\s*)?")


def bitmask_width(vocab: int) -> int:
    """int32 words of one row of a token bitmask over `vocab` columns."""
    return (vocab + 31) // 32


def _xgr() -> Any:
    try:
        import xgrammar
    except ImportError as e:  # pragma: no cover - a dependency of the package
        raise InvalidRequestError("structured output needs xgrammar: pip install xgrammar") from e
    return xgrammar


class GrammarCompiler:
    """Compiles GrammarSpecs over `tokenizer` (a transformers tokenizer) for logits of `vocab`
    columns; thread-safe (servers compile on request threads), cached by spec."""

    def __init__(self, tokenizer: Any, vocab: int, cache_size: int = 256) -> None:
        xgr = _xgr()
        self.vocab = vocab
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
        self._compiler = xgr.GrammarCompiler(self.info, cache_enabled=False)
        self._cache: dict[tuple[str, str], Any] = {}
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def compile(self, spec: GrammarSpec) -> Any:
        """The compiled grammar of `spec` (xgrammar.CompiledGrammar); InvalidRequestError naming
        `spec.field` when it does not compile."""
        key = (spec.kind, spec.value)
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None:
            return hit
        c = self._compiler
        try:
            if spec.kind == "json_object":  # (OpenAI's: an object, not any JSON value)
                compiled = c.compile_json_schema('{"type": "object"}')
            elif spec.kind == "json_schema":
                compiled = c.compile_json_schema(spec.value)
            elif spec.kind == "regex":
                compiled = c.compile_regex(spec.value)
            elif spec.kind == "ebnf":
                compiled = c.compile_grammar(spec.value)
            else:
                compiled = c.compile_structural_tag(spec.value)
        except (RuntimeError, ValueError, TypeError) as e:
            msg = _CPP_PREFIX.sub("", str(e).strip().splitlines()[0] if str(e).strip() else repr(e))
            raise InvalidRequestError(f"{spec.field}: invalid {spec.kind.replace('_', ' ')}: {msg}"
                                      ) from None
        with self._lock:
            if len(self._cache) >= self._cache_size:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = compiled
        return compiled

    def matcher(self, spec: GrammarSpec) -> RequestGrammar:
        return RequestGrammar(self.compile(spec), bitmask_width(self.vocab))


class RequestGrammar:
    """One request's grammar state (a matcher over the tokens it emitted)."""

    def __init__(self, compiled: Any, width: int) -> None:
        self.matcher = _xgr().GrammarMatcher(compiled)
        self.width = width

    @property
    def terminated(self) -> bool:
        """The grammar is complete and its stop token accepted: nothing more may follow."""
        return bool(self.matcher.is_terminated())

    def accept(self, tokens: list[int]) -> int:
        """Advances over `tokens` (emitted in order); returns how many it took: all of them,
        or fewer when it terminated (a stop token) or one left the grammar (it cannot, for a
        token chosen under this matcher's mask; a caller's bug then)."""
        for i, t in enumerate(tokens):
            if self.matcher.is_terminated() or not self.matcher.accept_token(int(t)):
                return i
        return len(tokens)

    def fill(self, out: torch.Tensor, row: int = 0) -> None:
        """The mask of the next token into `out[row]` (`out`: [R, width] int32 on the host)."""
        self.matcher.fill_next_token_bitmask(out, row)

    def fill_after(self, tokens: list[int], out: torch.Tensor, row: int = 0) -> None:
        """The mask after `tokens` (emitted, not read by the matcher yet) into `out[row]`, the
        state left as it was; the full row where they complete the grammar."""
        n = self.accept(tokens)
        if self.terminated or n < len(tokens):
            out[row].fill_(-1)
        else:
            self.fill(out, row)
        if n:
            self.matcher.rollback(n)

    def fill_tree(self, tokens: torch.Tensor, parents: torch.Tensor, out: torch.Tensor) -> None:
        """Masks of a draft tree's nodes into `out` [N, width] (host int32, zeros): node 0 is the
        root (its token already accepted), parents[i] < i for i > 0; row i is the mask after node
        i's path. Where the path leaves the grammar the row stays all zero, which the device reads
        as no mask (LogitsState.process): such a node is never accepted, since its parent's
        masked target never picks it, and a row with nothing allowed would only make NaNs."""
        nxt, sib = _links(tuple(parents.tolist()))
        self.matcher.traverse_draft_tree(nxt, sib, tokens.to(torch.int64), out)


# parents -> (first child, next sibling) of every node, as traverse_draft_tree reads a tree: a
# chain's are the same every step, and building the two tensors cost more than the traversal
_LINKS: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}
_LINKS_MAX = 4096


def _links(parents: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    got = _LINKS.get(parents)
    if got is not None:
        return got
    n = len(parents)
    nxt, sib = [-1] * n, [-1] * n
    last_child: dict[int, int] = {}
    for i, p in enumerate(parents[1:], 1):
        prev = last_child.get(p)
        if prev is None:
            nxt[p] = i
        else:
            sib[prev] = i
        last_child[p] = i
    got = (torch.tensor(nxt), torch.tensor(sib))
    if len(_LINKS) < _LINKS_MAX:
        _LINKS[parents] = got
    return got
