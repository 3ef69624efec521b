"""Benchmark prompt files: JSON lines with `category`, `question_id` and the prompt as `turns`
(SpecBench / MT-Bench: the first turn is used), `prompt` (text) or `prompt_token_ids`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hotspec.errors import HotspecError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

DEFAULT_CATEGORY = "all"


@dataclass(frozen=True)
class BenchPrompt:
    question_id: Any
    category: str
    text: str | None  # the first turn, when the record is text
    token_ids: tuple[int, ...] | None  # the record's own prompt_token_ids, used verbatim


def _parse(record: dict[str, Any], where: str, index: int) -> BenchPrompt:
    category = str(record.get("category", DEFAULT_CATEGORY))
    qid = record.get("question_id", record.get("id", index))
    ids = record.get("prompt_token_ids")
    if ids is not None:
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
            raise HotspecError(f"{where}: prompt_token_ids must be a non-empty list of integers")
        return BenchPrompt(qid, category, None, tuple(ids))
    turns = record.get("turns")
    text = turns[0] if isinstance(turns, list) and turns else record.get("prompt")
    if not isinstance(text, str) or not text:
        raise HotspecError(f"{where}: give the prompt as `turns` (a list of strings), `prompt` "
                           "(a string) or `prompt_token_ids` (a list of integers)")
    return BenchPrompt(qid, category, text, None)


def read_bench_prompts(path: str | Path, num_prompts: int | None = None) -> list[BenchPrompt]:
    """The file's prompts; with `num_prompts`, that many taken round-robin over the categories in
    file order, so a subset of a file sorted by category still covers every category."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise HotspecError(f"cannot read the prompt file {path}: {e}") from e
    prompts: list[BenchPrompt] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise HotspecError(f"{path}:{n}: not JSON ({e})") from e
        if not isinstance(record, dict):
            raise HotspecError(f"{path}:{n}: expected a JSON object per line")
        prompts.append(_parse(record, f"{path}:{n}", len(prompts)))
    if not prompts:
        raise HotspecError(f"{path} holds no prompts")
    if num_prompts is None or num_prompts >= len(prompts):
        return prompts
    queues: dict[str, list[BenchPrompt]] = {}
    for p in prompts:
        queues.setdefault(p.category, []).append(p)
    picked: list[BenchPrompt] = []
    while len(picked) < num_prompts:
        for q in queues.values():
            if q and len(picked) < num_prompts:
                picked.append(q.pop(0))
    return picked


def prompt_ids(prompt: BenchPrompt, tokenizer: PreTrainedTokenizerBase | None, chat: bool) -> list[int]:
    """Token ids: the record's own ids verbatim, else the text through the chat template (a user
    turn, generation prompt added) or plainly encoded."""
    if prompt.token_ids is not None:
        return list(prompt.token_ids)
    if tokenizer is None:
        raise HotspecError(f"prompt {prompt.question_id} is text but the engine has no tokenizer "
                           "(--skip-tokenizer-init): give prompt_token_ids in the prompt file")
    assert prompt.text is not None
    if not chat:
        return list(tokenizer.encode(prompt.text))
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}], tokenize=False,
                                         add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))
