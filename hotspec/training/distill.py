"""`hotspec distill`: the target answers conversations through hotspec's batched engine, turn by
turn, greedy, and the conversations are kept as token ids (training/token_shards.py).

The conversations (training/sources.py) are shuffled once by the seed and cut into shards of
`shard_size`. The list is saved with the shards (CONVERSATIONS), so a resumed run reads it back
instead of sampling the target's own prompts again. Shard i is built whole (every conversation of
it at turn 0 in one batch, then every one still going at turn 1, ...) and written atomically, so a
run stopped anywhere (or at `time_limit`) resumes at the first missing shard. A conversation stops at
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from hotspec.engine.request import Request
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
    time_limit: float | None = None  # seconds: no new shard starts after this
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
    complete = True
    todo = [i for i in range(n_shards) if i not in done]
    for i in tqdm(todo, desc="distill", unit="shard", disable=not cfg.progress):
        if cfg.time_limit is not None and time.perf_counter() - t0 > cfg.time_limit:
            complete = False
            break
        chunk = [Conversation(c.source, list(c.users)) for c in
                 convs[i * cfg.shard_size:(i + 1) * cfg.shard_size]]
        t_shard = time.perf_counter()
        answer_all(llm, chat, chunk, cfg.max_new_tokens, cfg.max_context)
        secs = time.perf_counter() - t_shard
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
        answer_tokens = sum(len(a) for c in chunk for a in c.answers)
        log.info("distill: shard %d of %d, %d records, %d answer tokens in %.1f s (%.0f tok/s)",
                 i + 1, n_shards, len(records), answer_tokens, secs, answer_tokens / max(secs, 1e-9))
    sources: dict[str, int] = {}
    for c in convs:
        sources[c.source] = sources.get(c.source, 0) + 1
    manifest = write_manifest(out, vocab, {"conversations": len(convs), "sources": sources,
                                           "shards_planned": n_shards})
    manifest["complete"] = complete and len(shard_indices(out)) == n_shards
    return manifest


def answer_all(llm: LLM, chat: ChatIds, convs: list[Conversation], max_new_tokens: int,
               max_context: int) -> None:
    """Fill in each conversation's answers, greedy. Every conversation's first turn is queued at
    once, and a conversation's next turn is queued the moment its answer is done, so the engine's
    batch stays full until the last answers of the chunk."""
    engine = llm.engine
    asking: dict[int, Conversation] = {}  # request id -> its conversation

    def ask(c: Conversation) -> None:
        prompt = chat.prompt(c)
        room = max_context - len(prompt)
        if room < MIN_ANSWER:
            return
        params = SamplingParams(temperature=0.0, max_tokens=min(max_new_tokens, room),
                                detokenize=False)
        try:
            req = engine.add_request(prompt, params)
        except InvalidRequestError as e:  # over the engine's own context: the conversation ends
            log.warning("distill: a turn of %d tokens is not asked: %s", len(prompt), e)
            return
        asking[req.rid] = c

    def answered(req: Request) -> None:
        c = asking.pop(req.rid, None)
        if c is None or not req.output_token_ids or req.finish_reason == "error":
            return
        c.answers.append(list(req.output_token_ids))
        if req.finish_reason == "stop" and len(c.answers) < len(c.users):
            ask(c)

    for c in convs:
        ask(c)
    while engine.has_unfinished():
        for o in engine.step():
            if o.request.finish_reason is not None:
                answered(o.request)
    if asking:  # finished without a step output (aborted): nothing to add
        log.warning("distill: %d turns ended without an answer", len(asking))


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
