"""hotspec: EAGLE speculative decoding with FR-Spec hot-vocabulary draft heads."""

from __future__ import annotations

from hotspec.entrypoints.llm import LLM, RequestOutput
from hotspec.sampling_params import SamplingParams

__all__ = ["LLM", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"
