"""`hotspec distill`: the target answers conversations through hotspec's batched engine, turn by
turn, greedy, and the conversations are kept as token ids (training/token_shards.py).

The conversations (training/sources.py) are shuffled once by the seed and cut into shards of
`shard_size`. The list is saved with the shards (CONVERSATIONS), so a resumed run reads it back
instead of sampling the target's own prompts again. The engine's batch stays full across shards
(`Answerer`): a conversation's next turn is queued the moment its answer ends, and the next
shard's conversations take the rows that the current shard's long conversations leave idle, so no
shard waits for the slowest conversation of the one before. A shard is written atomically, in
order, once all its conversations have ended, so a run stopped anywhere (or at `time_limit`, where
the shards in progress are dropped at once) resumes at the first missing shard. A conversation stops at
its last user turn, at an answer cut by `max_new_tokens`, or when the next prompt would leave
less than MIN_ANSWER tokens of `max_context`. Records identical to an earlier one are dropped.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import random
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from hotspec.core.request import Request
from hotspec.entrypoints.llm import LLM
from hotspec.errors import InvalidRequestError
from hotspec.sampling_params import SamplingParams
from hotspec.training.conversations import ChatIds, Conversation
from hotspec.training.token_shards import (
    TokenRecords,
    load_shard,
    save_shard,
    shard_indices,
    shard_path,
    write_manifest,
)

log = logging.getLogger("hotspec")
MIN_ANSWER = 32  # fewest tokens of room a next turn needs
PLAN = "plan.json"
CONVERSATIONS = "conversations.jsonl.gz"  # the user turns of every conversation, in shard order


@dataclass(frozen=True)
class DistillConfig:
    out: Path
    max_new_tokens: int = 1024
    max_context: int = 4096
    shard_size: int = 512
    seed: int = 0
    time_limit: float | None = None  # seconds: then the run stops, dropping the shards in progress
    max_shards: int | None = None  # distill shards 0..max_shards-1 only (a later run adds more)
    progress: bool = True


def save_conversations(out: Path, convs: list[Conversation]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (CONVERSATIONS + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        for c in convs:
            f.write(json.dumps({"source": c.source, "users": c.users}, ensure_ascii=False) + "\n")
    tmp.replace(out / CONVERSATIONS)


def load_conversations(out: Path) -> list[Conversation] | None:
    """The conversations an earlier run of `out` saved; None when there is none."""
    path = Path(out) / CONVERSATIONS
    if not path.is_file():
        return None
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [Conversation(d["source"], d["users"]) for d in map(json.loads, f)]


def unique(convs: list[Conversation]) -> list[Conversation]:
    """The first conversation of each distinct list of user turns."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for c in convs:
        if tuple(c.users) not in seen:
            seen.add(tuple(c.users))
            out.append(c)
    return out


def shuffled(convs: list[Conversation], seed: int) -> list[Conversation]:
    out = list(convs)
    random.Random(seed).shuffle(out)
    return out


def distill(llm: LLM, convs: list[Conversation], cfg: DistillConfig) -> dict[str, Any]:
    """Build every missing shard of `convs` (in the order given) under cfg.out; returns the
    manifest, with `complete` False when the time limit stopped it first."""
    if llm.tokenizer is None:
        raise ValueError("distill needs the target's tokenizer (for its chat template)")
    if not convs:
        raise ValueError("no conversations to distill")
    out = Path(cfg.out)
    _check_plan(out, convs, cfg)
    if load_conversations(out) is None:
        save_conversations(out, convs)
    chat = ChatIds(llm.tokenizer)
    vocab = llm.engine.model_config.vocab_size
    n_shards = -(-len(convs) // cfg.shard_size)
    done = set(shard_indices(out))
    seen = {_digest(d, r) for d in (load_shard(shard_path(out, i)) for i in sorted(done))
            for r in range(d.num_records)}
    t0 = time.perf_counter()
    last = n_shards if cfg.max_shards is None else min(n_shards, cfg.max_shards)
    todo = deque(i for i in range(last) if i not in done)
    window = llm.engine.cfg.max_num_seqs + max(8, llm.engine.cfg.max_num_seqs // 8)
    ans = Answerer(llm, chat, cfg.max_new_tokens, cfg.max_context, window)
    chunks: dict[int, list[Conversation]] = {}  # admitted shards not yet written, in order
    ended: set[int] = set()
    stopped = False
    written = 0
    bar = tqdm(total=len(todo), desc="distill", unit="shard", disable=not cfg.progress)
    while True:
        if not stopped and cfg.time_limit is not None and time.perf_counter() - t0 > cfg.time_limit:
            stopped = True  # shards not written by now are dropped whole: a resumed run redoes them
            secs = time.perf_counter() - t0
            log.info("distill: time limit: %d shards written by this run, %d in progress dropped; "
                     "%.0f answer tok/s over the %.0f s", written, len(chunks),
                     ans.answer_tokens / max(secs, 1e-9), secs)
            ans.abort()
            chunks.clear()
        if todo and not stopped and len(ans.pending) < window:  # the next shard queues up
            i = todo.popleft()
            chunks[i] = [Conversation(c.source, list(c.users)) for c in
                         convs[i * cfg.shard_size:(i + 1) * cfg.shard_size]]
            ans.add(i, chunks[i])
        ended.update(ans.step())
        while chunks and next(iter(chunks)) in ended:
            i = next(iter(chunks))
            chunk = chunks.pop(i)
            records = []
            for c in chunk:
                if not c.answers:
                    continue
                rec = chat.record(c)
                key = _key(rec[0])
                if key not in seen:
                    seen.add(key)
                    records.append(rec)
            save_shard(out, i, TokenRecords.build(records, vocab))
            written += 1
            tokens = sum(len(a) for c in chunk for a in c.answers)
            secs = time.perf_counter() - t0
            log.info("distill: shard %d of %d, %d records, %d answer tokens (%.0f answer tok/s "
                     "over the %.0f s so far, shards in progress included)", i + 1, n_shards,
                     len(records), tokens, ans.answer_tokens / max(secs, 1e-9), secs)
            bar.update(1)
        if not ans.busy and not chunks and (stopped or not todo):
            break
    bar.close()
    complete = not todo
    sources: dict[str, int] = {}
    for c in convs:
        sources[c.source] = sources.get(c.source, 0) + 1
    manifest = write_manifest(out, vocab, {"conversations": len(convs), "sources": sources,
                                           "shards_planned": n_shards})
    manifest["complete"] = complete and len(shard_indices(out)) == n_shards
    return manifest


class Answerer:
    """Conversations answered turn by turn, greedy, on one engine. Each conversation belongs to a
    group (a shard). Its next turn is queued the moment its answer ends; new conversations are
    queued while fewer than `window` turns are asked (a little over the engine's rows, so freed
    rows fill at once and a next turn waits behind few others). `step` runs one engine step and
    returns the groups whose conversations have all ended."""

    def __init__(self, llm: LLM, chat: ChatIds, max_new_tokens: int, max_context: int,
                 window: int) -> None:
        self.engine = llm.engine
        self.chat = chat
        self.max_new_tokens = max_new_tokens
        self.max_context = max_context
        self.window = window
        self.pending: deque[tuple[int, Conversation]] = deque()  # not asked yet
        self.asking: dict[int, tuple[int, Conversation, Request]] = {}  # id -> (group, conv, turn)
        self.answer_tokens = 0  # of every answer ended so far
        self.left: dict[int, int] = {}  # group -> its conversations still going
        self.ended: list[int] = []  # groups ended since the last step

    def add(self, group: int, convs: list[Conversation]) -> None:
        self.left[group] = len(convs)
        self.pending.extend((group, c) for c in convs)
        if not convs:
            self.ended.append(group)

    @property
    def busy(self) -> bool:
        return bool(self.pending or self.asking)

    def step(self) -> list[int]:
        while self.pending and len(self.asking) < self.window:
            self._ask(*self.pending.popleft())
        if self.engine.has_unfinished():
            for o in self.engine.step():
                if o.request.finish_reason is not None:
                    self._answered(o.request)
        elif self.asking:  # finished without a step output (aborted): nothing to add
            log.warning("distill: %d turns ended without an answer", len(self.asking))
            for group, _, _ in self.asking.values():
                self._end(group)
            self.asking.clear()
        ended, self.ended = self.ended, []
        return ended

    def abort(self) -> None:
        """Drop every conversation not ended yet: queued ones are forgotten, turns in the engine
        aborted, and the engine runs until nothing of theirs is in flight."""
        self.pending.clear()
        for _, _, req in self.asking.values():
            self.engine.abort(req)
        self.asking.clear()
        while self.engine.has_unfinished():
            self.engine.step()

    def _ask(self, group: int, c: Conversation) -> None:
        prompt = self.chat.prompt(c)
        room = self.max_context - len(prompt)
        if room < MIN_ANSWER:
            self._end(group)
            return
        params = SamplingParams(temperature=0.0, max_tokens=min(self.max_new_tokens, room),
                                detokenize=False)
        try:
            req = self.engine.add_request(prompt, params)
        except InvalidRequestError as e:  # over the engine's own context: the conversation ends
            log.warning("distill: a turn of %d tokens is not asked: %s", len(prompt), e)
            self._end(group)
            return
        self.asking[req.rid] = (group, c, req)

    def _answered(self, req: Request) -> None:
        asked = self.asking.pop(req.rid, None)
        if asked is None:
            return
        group, c, _ = asked
        self.answer_tokens += len(req.output_token_ids)
        if req.output_token_ids and req.finish_reason != "error":
            c.answers.append(list(req.output_token_ids))
            if req.finish_reason == "stop" and len(c.answers) < len(c.users):
                self._ask(group, c)
                return
        self._end(group)

    def _end(self, group: int) -> None:
        self.left[group] -= 1
        if self.left[group] == 0:
            self.ended.append(group)


def answer_all(llm: LLM, chat: ChatIds, convs: list[Conversation], max_new_tokens: int,
               max_context: int) -> None:
    """Fill in each conversation's answers, greedy (one group of an `Answerer`)."""
    ans = Answerer(llm, chat, max_new_tokens, max_context, window=llm.engine.cfg.max_num_seqs)
    ans.add(0, convs)
    while ans.busy:
        ans.step()


def _key(ids: list[int]) -> str:
    return hashlib.sha1(repr(ids).encode()).hexdigest()


def _digest(data: TokenRecords, r: int) -> str:
    return _key([int(t) for t in data.record(r)[0]])


def _check_plan(out: Path, convs: list[Conversation], cfg: DistillConfig) -> None:
    """Shards of an earlier run are kept only for the same conversations and settings."""
    plan = {"conversations": hashlib.sha1("\x01".join("\x02".join(c.users) for c in convs)
                                          .encode()).hexdigest(),
            "count": len(convs), "max_new_tokens": cfg.max_new_tokens,
            "max_context": cfg.max_context, "shard_size": cfg.shard_size}
    path = out / PLAN
    if path.is_file():
        old = json.loads(path.read_text())
        if old != plan:
            changed = sorted(k for k in plan if old.get(k) != plan[k])
            raise ValueError(f"{out} holds shards of another distill run (different "
                             f"{', '.join(changed)}). Fix: run with the same sources and settings "
                             "to resume it, or choose a new --out.")
        return
    if shard_indices(out):
        raise ValueError(f"{out} holds token shards but no {PLAN}. Fix: choose a new --out.")
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan, indent=1) + "\n")
