"""The engine's grammars (structured output, runtime/grammar.py): compiled on the caller's thread
(the offline API: a bad grammar raises from add_request) or, for a serving loop, on a worker
thread while the request waits, so that no step waits for a compile.

A compile takes milliseconds for a JSON schema and tens of them for a regex (xgrammar builds a
token mask cache over the whole vocabulary; the compiler itself, the first time, about 0.2 s),
and on the engine's thread every running stream would stall that long. A request whose grammar
is compiling stays in `waiting` with `grammar_job` set; admission passes it over (the requests
behind it may go first) until the job is done: then it gets its matcher, or, if the compile
failed, it finishes with "error" and the compiler's message (a server checks grammars before
they reach the engine, so this is a guard, not a path a valid request takes).
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from typing import Any

from hotspec.core.request import Request, Status
from hotspec.errors import InvalidRequestError
from hotspec.runtime.grammar import GrammarCompiler, RequestGrammar
from hotspec.sampling_params import SamplingParams


class Grammars:
    """The engine's grammar compiler, built on first use, and its worker thread."""

    def __init__(self, tokenizer: Any, vocab: int) -> None:
        self.tokenizer, self.vocab = tokenizer, vocab
        self._compiler: GrammarCompiler | None = None
        self._lock = threading.Lock()  # (the compiler is built once, by whichever thread is first)
        self._pool: cf.ThreadPoolExecutor | None = None
        # requests whose grammar is compiling: what each step looks at (not every waiting request)
        self.pending: list[Request] = []

    def matcher(self, params: SamplingParams) -> RequestGrammar | None:
        """A matcher for `params.grammar` (None without one), compiled now."""
        if params.grammar is None:
            return None
        if self.tokenizer is None:
            raise InvalidRequestError("structured output needs a tokenizer; this engine was "
                                      "started with skip_tokenizer_init")
        with self._lock:
            if self._compiler is None:
                self._compiler = GrammarCompiler(self.tokenizer, self.vocab)
        return self._compiler.matcher(params.grammar)

    def submit(self, req: Request) -> None:
        """`req`'s matcher, compiled on the worker thread (`req.grammar_job` until `settle`)."""
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(1, thread_name_prefix="hotspec-grammar")
        req.grammar_job = self._pool.submit(self.matcher, req.params)
        self.pending.append(req)

    def settle(self) -> list[Request]:
        """Requests whose compile finished get their matcher; those whose compile failed are
        returned (with `error` set) for the engine to finish. Aborted ones are forgotten."""
        failed = []
        for req in list(self.pending):
            job = req.grammar_job
            if req.status is Status.FINISHED or job is None or job.done():
                self.pending.remove(req)
            if req.status is Status.FINISHED or job is None or not job.done():
                continue
            req.grammar_job = None
            try:
                req.grammar = job.result()
            except Exception as e:  # noqa: BLE001 - any compile failure fails its request alone
                req.error = f"the request's grammar could not be compiled: {e}"
                failed.append(req)
        return failed

    def wait(self, timeout: float) -> None:
        """Until one pending compile finishes, at most `timeout` s (nothing else to do)."""
        jobs = [r.grammar_job for r in self.pending if r.grammar_job is not None]
        if jobs:
            cf.wait(jobs, timeout, return_when=cf.FIRST_COMPLETED)
