"""Multi-turn conversations in the target's chat template, with the target's own answers kept as
the exact token ids it generated (never re-tokenized from text).

The template is rendered once per conversation with a marker in place of each assistant answer
and cut at the markers: piece i is the template text (system turn, user turn i, the assistant's
header) before answer i. A conversation's ids are piece 0, answer 0, piece 1, answer 1, ...; the
loss mask is 1 on the answers. An answer ends with the end-of-turn token the target emitted, which
the template repeats at the start of the next piece: that copy is dropped, so the ids are what
the engine saw while it generated the next answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from hotspec.training.prompts import has_chat_template

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_MARK = "\x00hotspec-answer-{}\x00"


@dataclass
class Conversation:
    """User turns to put to the target, one at a time; its answers are filled in by distill."""

    source: str  # where the user turns come from: sharegpt, self, translate, summarize, rag
    users: list[str]
    answers: list[list[int]] = field(default_factory=list)  # the target's ids, one per turn


class ChatIds:
    """Token ids of conversations in one tokenizer's chat template."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tok = tokenizer
        self.chat = has_chat_template(tokenizer)

    def pieces(self, users: list[str]) -> list[list[int]]:
        """The template's ids before each answer: len(users) pieces, the last one ending with the
        generation prompt. Without a chat template, one piece: the first user turn's plain text."""
        if not self.chat:
            return [list(self.tok.encode(users[0]))]
        messages: list[dict[str, str]] = []
        for i, u in enumerate(users):
            messages.append({"role": "user", "content": u})
            if i < len(users) - 1:
                messages.append({"role": "assistant", "content": _MARK.format(i)})
        text = cast(str, self.tok.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=True))
        out = []
        for i in range(len(users) - 1):
            before, sep, text = text.partition(_MARK.format(i))
            if not sep:
                raise ValueError("the chat template does not keep an assistant message as written")
            out.append(before)
        out.append(text)
        return [list(self.tok.encode(p, add_special_tokens=False)) for p in out]

    def join(self, pieces: list[list[int]], answers: list[list[int]]) -> tuple[list[int], list[bool]]:
        """piece 0, answer 0, piece 1, ... (as many answers as given, at most one per piece, and
        the piece after the last answer when there is one), with the loss mask of the answers."""
        if len(answers) > len(pieces):
            raise ValueError(f"{len(answers)} answers for {len(pieces)} user turns")
        ids: list[int] = []
        mask: list[bool] = []
        for i, piece in enumerate(pieces[: len(answers) + 1]):
            if i and answers[i - 1] and piece[:1] == answers[i - 1][-1:]:
                piece = piece[1:]  # the end-of-turn token the answer already ends with
            ids += piece
            mask += [False] * len(piece)
            if i < len(answers):
                ids += answers[i]
                mask += [True] * len(answers[i])
        return ids, mask

    def prompt(self, conv: Conversation) -> list[int]:
        """What the target is prompted with for its next answer: every turn so far, the next
        user turn and the generation prompt."""
        n = len(conv.answers) + 1
        ids, _ = self.join(self.pieces(conv.users[:n]), conv.answers)
        return ids

    def record(self, conv: Conversation) -> tuple[list[int], list[bool]]:
        """The answered part of the conversation as training ids and loss mask."""
        n = len(conv.answers)
        ids, mask = self.join(self.pieces(conv.users[:n]), conv.answers)
        return ids, mask
