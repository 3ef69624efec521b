"""Plain autoregressive decoding: prefill, then one token per request per step (the `decode`
program, runtime/decode.py, run by the step executor)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from hotspec.core.request import Request
from hotspec.runtime.decode import CausalLM, PlainDecode
from hotspec.runtime.model_runner import ModelRunner
from hotspec.runtime.prefill import Prefilled
from hotspec.runtime.step_executor import StepExecutor
from hotspec.runtime.worker import Worker


class VanillaWorker(Worker):
    def __init__(self, executor: StepExecutor, target: CausalLM, runner: ModelRunner) -> None:
        super().__init__(executor, target, runner)
        self.decode = PlainDecode(executor.graphs, runner, target, executor.max_blocks_per_seq,
                                  executor.carry, logits_state=executor.logits_state)

    @torch.inference_mode()
    def prefill(self, reqs: list[Request], chunks: list[int] | None = None, *,
                meanwhile: Callable[[], None] | None = None) -> list[list[int]]:
        return Prefilled(self, reqs, chunks, meanwhile).advance()

    @torch.inference_mode()
    def launch(self, reqs: list[Request]) -> None:
        self.executor.launch(self.decode, reqs)

    def collect(self) -> tuple[list[Request], list[list[int]]]:
        c = self.executor.collect()
        return c.reqs, c.tokens
