"""Offline API mirroring vLLM: `LLM(model=...).generate(prompts, SamplingParams(...))`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from hotspec.config import EngineConfig
from hotspec.core.logprobs import TokenLogprob
from hotspec.core.request import Request, RequestStats
from hotspec.engine.engine import Engine
from hotspec.engine.outputs import StepOutput
from hotspec.errors import InvalidRequestError
from hotspec.sampling_params import SamplingParams


@dataclass
class RequestOutput:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]  # generated ids only
    finish_reason: str | None
    stats: RequestStats
    # with SamplingParams.logprobs: one per generated token (core/logprobs.py)
    logprobs: list[TokenLogprob] | None = None
    # with SamplingParams.prompt_logprobs: one per prompt token, the first None
    prompt_logprobs: list[TokenLogprob | None] | None = None


class LLM:
    """Load a model once; generate for batches of prompts, decoded together in one running batch.

    `model=None` runs the embedded default (SmolLM2-135M-Instruct). Every other keyword is an
    EngineConfig field (dtype, speculative_algorithm, speculative_num_steps, ...).
    """

    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        self.engine = Engine(EngineConfig.from_kwargs(model=model, **kwargs))
        self.tokenizer = self.engine.tokenizer

    def generate(self, prompts: str | Sequence[str] | None = None,
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 prompt_token_ids: Sequence[Sequence[int]] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        if (prompts is None) == (prompt_token_ids is None):
            raise InvalidRequestError("give exactly one of prompts or prompt_token_ids")
        if isinstance(prompts, str):
            prompts = [prompts]
        if prompts is not None:
            if self.tokenizer is None:
                raise InvalidRequestError("text prompts need a tokenizer; pass prompt_token_ids")
            texts: list[str | None] = list(prompts)
            ids = [self.tokenizer.encode(p) for p in prompts]
        else:
            ids = [list(p) for p in prompt_token_ids or []]
            texts = [None] * len(ids)
        return self._run(texts, ids, sampling_params, use_tqdm)

    def chat(self, messages: Sequence[Sequence[dict[str, str]]] | Sequence[dict[str, str]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = False) -> list[RequestOutput]:
        if self.tokenizer is None:
            raise InvalidRequestError("chat needs a tokenizer; pass prompt_token_ids to generate")
        convs = cast(Sequence[Sequence[dict[str, str]]],
                     [messages] if messages and isinstance(messages[0], dict) else messages)
        # (tokenize=False: the rendered text; transformers types the result as any of its outputs)
        texts = [cast(str, self.tokenizer.apply_chat_template(list(c), tokenize=False,
                                                              add_generation_prompt=True))
                 for c in convs]
        ids = [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        return self._run(list(texts), ids, sampling_params, use_tqdm)

    def _run(self, texts: list[str | None], ids: list[list[int]],
             params: SamplingParams | Sequence[SamplingParams] | None,
             use_tqdm: bool) -> list[RequestOutput]:
        plist = _broadcast(params, len(ids))
        reqs: list[Request] = []
        try:
            for toks, p in zip(ids, plist):
                reqs.append(self.engine.add_request(toks, p))
        except InvalidRequestError:
            for r in reqs:
                self.engine.abort(r)
            raise
        logprobs: dict[int, list[TokenLogprob]] = {r.rid: [] for r in reqs if r.params.logprobs is not None}
        for outs in self.stream_steps(use_tqdm):
            for o in outs:
                if o.logprobs is not None and o.request.rid in logprobs:
                    logprobs[o.request.rid] += o.logprobs
        return [RequestOutput(r.rid, t, r.prompt_token_ids, r.checker.text if r.checker else "",
                              r.output_token_ids, r.finish_reason, r.stats, logprobs.get(r.rid),
                              (r.prompt_logprobs or [None]) if r.params.prompt_logprobs is not None
                              else None)
                for r, t in zip(reqs, texts)]

    def stream_steps(self, use_tqdm: bool = False) -> Iterator[list[StepOutput]]:
        """Drive the engine until idle, yielding each step's outputs (used by the CLI to stream)."""
        bar = None
        if use_tqdm:
            from tqdm import tqdm
            bar = tqdm(total=len(self.engine.waiting) + len(self.engine.running), unit="req")
        while self.engine.has_unfinished():
            outs = self.engine.step()
            if bar is not None:
                bar.update(sum(o.request.finish_reason is not None for o in outs))
            yield outs
        if bar is not None:
            bar.close()


def _broadcast(params: SamplingParams | Sequence[SamplingParams] | None, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    if len(params) != n:
        raise InvalidRequestError(f"got {len(params)} SamplingParams for {n} prompts")
    return list(params)
