"""Training prompts: rendered for the target (chat template), read from files or synthesized by
the target itself.

Synthesis (no --prompts): the chat template is rendered up to where a user message begins, and the
target samples the user message at temperature 1.0, stopping at its end-of-turn tokens; messages
are deduplicated. A target without a chat template samples free text after BOS; one without a
tokenizer samples token ids after a random first token.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from hotspec.sampling_params import SamplingParams
from hotspec.speculative.token_map_builder import end_of_turn_ids

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from hotspec.entrypoints.llm import LLM

SYNTH_MAX_TOKENS = 64  # longest synthesized user message
_SYNTH_ROUNDS = 8  # sampling rounds before giving up on reaching the requested count
_MARK = "\x00hotspec-user-message\x00"  # stands for the user message when splitting the template


@dataclass(frozen=True)
class Prompt:
    text: str | None  # the user message; None for a token-only prompt (no tokenizer)
    ids: list[int]  # what the target is prompted with: chat template applied, generation prompt on


def has_chat_template(tokenizer: PreTrainedTokenizerBase | None) -> bool:
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def render_prompt(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of one user turn followed by the assistant's generation prompt (as LLM.chat), or
    of the plain text for a model without a chat template."""
    if not has_chat_template(tokenizer):
        return list(tokenizer.encode(text))
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return list(tokenizer.encode(rendered, add_special_tokens=False))


def user_prefix_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Token ids the chat template puts before a user message's text (system turn included);
    without a template, BOS (or nothing)."""
    if not has_chat_template(tokenizer):
        bos = tokenizer.bos_token_id
        return [] if bos is None else [int(bos)]
    rendered = cast(str, tokenizer.apply_chat_template([{"role": "user", "content": _MARK}],
                                                       tokenize=False, add_generation_prompt=False))
    prefix = rendered[: rendered.index(_MARK)]
    return list(tokenizer.encode(prefix, add_special_tokens=False))


def prompts_from_texts(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[Prompt]:
    return [Prompt(t, render_prompt(tokenizer, t)) for t in texts]


def synthesize_prompts(llm: LLM, n: int, seed: int, progress: bool = False) -> list[Prompt]:
    """Up to `n` distinct prompts sampled from the target (temperature 1.0)."""
    tok = llm.tokenizer
    vocab = llm.engine.model_config.vocab_size
    rng = random.Random(seed)
    stops = sorted(set(end_of_turn_ids(tok, vocab)) | llm.engine.eos_token_ids) if tok else None
    prefix = user_prefix_ids(tok) if tok is not None else []
    found: dict[object, Prompt] = {}
    for _ in range(_SYNTH_ROUNDS):
        want = n - len(found)
        if want <= 0:
            break
        m = want + want // 4 + 4  # over-ask: some samples are empty or repeat
        starts = [prefix or [_random_token(rng, vocab, llm.engine.eos_token_ids)] for _ in range(m)]
        params = [SamplingParams(temperature=1.0, max_tokens=SYNTH_MAX_TOKENS, seed=rng.getrandbits(31),
                                 stop_token_ids=stops) for _ in range(m)]
        outs = llm.generate(prompt_token_ids=starts, sampling_params=params, use_tqdm=progress)
        for start, o in zip(starts, outs):
            if tok is None:
                ids = start + [t for t in o.token_ids if t not in llm.engine.eos_token_ids]
                key: object = tuple(ids)
                prompt = Prompt(None, ids)
            else:
                text = o.text.strip()
                if not text:
                    continue
                key = text
                prompt = Prompt(text, render_prompt(tok, text))
            if key not in found and len(found) < n:
                found[key] = prompt
    return list(found.values())


def _random_token(rng: random.Random, vocab: int, avoid: set[int]) -> int:
    while True:
        t = rng.randrange(vocab)
        if t not in avoid:
            return t
