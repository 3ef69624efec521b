"""`hotspec distill`: multi-turn conversations answered by the target, kept as token ids with the
mask of the target's own tokens; resumable shards; the evaluation set never enters."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from hotspec.cli.main import main as cli_main
from hotspec.models.loader import load_tokenizer, resolve_model_path
from hotspec.training import sources
from hotspec.training.conversations import ChatIds, Conversation
from hotspec.training.token_shards import (
    TokenRecords,
    load_records,
    load_shard,
    save_shard,
    shard_path,
)

SHAREGPT = [
    {"id": "a", "conversations": [
        {"from": "human", "value": "What is the capital of France?"},
        {"from": "gpt", "value": "Paris is the capital of France. It lies on the Seine river."},
        {"from": "human", "value": "And of Germany?"},
        {"from": "gpt", "value": "Berlin."}]},
    {"id": "b", "conversations": [
        {"from": "human", "value": "Write one sentence about rain."},
        {"from": "gpt", "value": "Rain falls softly on the quiet garden in the early morning."}]},
    {"id": "c", "conversations": [
        {"from": "human", "value": "Who played anna in once upon a time?"},
        {"from": "gpt", "value": "Elizabeth Lail."}]},
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(resolve_model_path(None))


def test_chat_ids_equal_the_rendered_conversation(tok):
    """The ids of a conversation (answers kept as ids) are the tokenization of the chat template
    rendered with the answers' text, and the mask covers exactly the answers."""
    chat = ChatIds(tok)
    a0 = tok.encode("Paris.<|im_end|>", add_special_tokens=False)
    a1 = tok.encode("Berlin, of course.<|im_end|>", add_special_tokens=False)
    conv = Conversation("sharegpt", ["Capital of France?", "And of Germany?"], [a0])
    msgs = [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "And of Germany?"}]
    want = tok.encode(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
                      add_special_tokens=False)
    assert chat.prompt(conv) == want
    conv.answers.append(a1)
    ids, mask = chat.record(conv)
    assert ids[: len(want)] == want and ids[len(want):] == a1
    assert [t for t, m in zip(ids, mask) if m] == a0 + a1


def test_token_shards_round_trip_and_errors(tmp_path):
    recs = [([1, 2, 3, 4], [False, False, True, True]), ([5, 6], [True, False])]
    data = TokenRecords.build(recs, vocab_size=100)
    assert data.tokens.dtype == np.uint16 and data.response_tokens == 3
    back = load_shard(save_shard(tmp_path, 0, data))
    assert back.tokens.tolist() == [1, 2, 3, 4, 5, 6] and back.offsets.tolist() == [0, 4, 6]
    assert back.record(1)[1].tolist() == [True, False]
    assert TokenRecords.build(recs, vocab_size=151_936).tokens.dtype == np.uint32
    with pytest.raises(ValueError, match=r"must lie in \[0, 5\)"):
        TokenRecords.build(recs, vocab_size=5)
    with pytest.raises(FileNotFoundError, match="hotspec distill"):
        load_records(tmp_path / "none")


def test_task_prompts_and_exclusion(tmp_path):
    docs = [("The wide river flows slowly through the old town of the valley. " * 12).strip(),
            ("Bees make honey from the nectar of flowers. " * 10).strip(),
            ("Mountains rise above the clouds in winter. " * 10).strip(),
            ("Trains connect the cities of the coast every hour. " * 10).strip()]
    german = ["Ich habe heute keine Zeit, aber wir sehen uns morgen in der Stadt und gehen essen."]
    convs = sources.task_conversations(docs, 9, seed=0, german=german)
    kinds = {c.source for c in convs}
    assert kinds == {"translate", "summarize", "rag"}
    assert all(c.users[0].startswith("Summarize: ") for c in convs if c.source == "summarize")
    assert sources.is_german(german[0]) and not sources.is_german(docs[0])
    ex = tmp_path / "ex.jsonl"
    ex.write_text(json.dumps({"category": "qa", "turns": ["who played ANNA in  once upon a time?"]}) + "\n")
    kept = sources.drop_excluded([Conversation("sharegpt", ["Who played anna in once upon a time?"]),
                                  Conversation("sharegpt", ["Hello"])], sources.excluded_turns([ex]))
    assert [c.users for c in kept] == [["Hello"]]


def test_distill_end_to_end_multi_turn_and_resume(tmp_path, tok, capsys):
    """The target answers every user turn with its earlier answers in context; the evaluation
    set's conversation is dropped; a second run with the same arguments resumes (nothing redone),
    with other settings it is refused."""
    sg = tmp_path / "sg.json"
    sg.write_text(json.dumps(SHAREGPT))
    ex = tmp_path / "ex.jsonl"
    ex.write_text(json.dumps({"category": "qa", "turns": ["Who played anna in once upon a time?"]}) + "\n")
    out = tmp_path / "data"
    args = ["distill", "--out", str(out), "--sharegpt", str(sg), "--exclude", str(ex),
            "--max-new-tokens", "12", "--shard-size", "1", "--device", "cpu", "--dtype", "float32",
            "--no-progress"]
    assert cli_main(args) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["conversations"] == 2 and manifest["records"] == 2
    data = load_records(out)
    texts = [tok.decode(data.record(r)[0].tolist()) for r in range(data.num_records)]
    two = [t for t in texts if "And of Germany?" in t]
    assert len(two) == 1 and two[0].count("<|im_start|>assistant") == 2  # both turns answered
    assert all("once upon a time" not in t for t in texts)
    ids, mask = data.record(texts.index(two[0]))
    assert 0 < mask.sum() <= 24 and not mask[0]  # two answers of at most 12 tokens
    stamp = shard_path(out, 0).stat().st_mtime_ns
    assert cli_main(args) == 0
    assert shard_path(out, 0).stat().st_mtime_ns == stamp
    capsys.readouterr()
    assert cli_main([a if a != "12" else "16" for a in args]) == 2
    assert "another distill run (different max_new_tokens)" in capsys.readouterr().err
    assert cli_main(args + ["--max-shards", "0"]) == 2
    assert "--max-shards must be >= 1, got 0" in capsys.readouterr().err


def turn_by_turn(llm, chat: ChatIds, users: list[str], max_tokens: int) -> Conversation:
    """The reference: each user turn answered by its own greedy generate call, the earlier answers
    in context, until the last turn or an answer that did not stop."""
    from hotspec.sampling_params import SamplingParams

    ref = Conversation("t", list(users))
    while len(ref.answers) < len(users):
        out = llm.generate(prompt_token_ids=[chat.prompt(ref)],
                           sampling_params=SamplingParams(temperature=0.0, max_tokens=max_tokens))[0]
        ref.answers.append(list(out.token_ids))
        if out.finish_reason != "stop":
            break
    return ref


def test_streamed_turns_equal_turn_by_turn_generation(tok):
    """answer_all queues a conversation's next turn as soon as its answer ends; every answer is
    still the target's greedy answer to exactly the conversation so far (float32)."""
    from hotspec.entrypoints.llm import LLM
    from hotspec.sampling_params import SamplingParams
    from hotspec.training.distill import answer_all

    llm = LLM(None, device="cpu", dtype="float32", max_num_seqs=2)
    chat = ChatIds(tok)
    users = [["What is the capital of France?", "And of Germany?", "And of Spain?"],
             ["Write one sentence about rain."], ["Name a colour.", "Another one?"]]
    streamed = [Conversation("t", list(u)) for u in users]
    answer_all(llm, chat, streamed, max_new_tokens=10, max_context=4096)
    for u, got in zip(users, streamed):
        assert got.answers == turn_by_turn(llm, chat, u, max_tokens=10).answers and got.answers
    # detokenize=False: the same tokens, no text
    p = chat.prompt(Conversation("t", ["Name a colour."]))
    a, b = (llm.generate(prompt_token_ids=[p], sampling_params=SamplingParams(
        temperature=0.0, max_tokens=8, detokenize=d))[0] for d in (True, False))
    assert a.token_ids == b.token_ids and a.text and b.text == ""


def test_shards_stream_through_one_batch_and_match_turn_by_turn(tmp_path, tok):
    """Conversations of several shards share the engine's batch (a later shard's first turns take
    rows an earlier shard's long conversation leaves idle); each shard is still written whole, in
    order, holding the target's greedy answers to exactly its own conversations (float32)."""
    from hotspec.entrypoints.llm import LLM
    from hotspec.training.distill import DistillConfig, distill

    llm = LLM(None, device="cpu", dtype="float32", max_num_seqs=2)
    chat = ChatIds(tok)
    users = [["What is the capital of France?", "And of Germany?", "And of Spain?"],
             ["Write one sentence about rain."], ["Name a colour.", "Another one?"],
             ["Count to three."], ["Say hello.", "Say goodbye."]]
    convs = [Conversation("t", list(u)) for u in users]
    cfg = DistillConfig(out=tmp_path, max_new_tokens=8, shard_size=2, progress=False)
    manifest = distill(llm, convs, replace(cfg, max_shards=2))  # the first two; then the rest
    assert not manifest["complete"] and len(list(tmp_path.glob("tokens_*.npz"))) == 2
    manifest = distill(llm, convs, cfg)
    assert manifest["complete"] and [p.name for p in sorted(tmp_path.glob("tokens_*.npz"))] == \
        ["tokens_00000.npz", "tokens_00001.npz", "tokens_00002.npz"]
    for shard in range(3):
        got = load_shard(shard_path(tmp_path, shard))
        want = [chat.record(turn_by_turn(llm, chat, u, max_tokens=8))[0]
                for u in users[2 * shard:2 * shard + 2]]
        assert [got.record(r)[0].tolist() for r in range(got.num_records)] == want


def test_time_limit_stops_at_once_keeping_whole_shards(tmp_path, tok, monkeypatch):
    """At --time-limit the shards in progress are dropped and the engine is left with nothing in
    flight; the shards written by then are whole, and the same run resumed writes the rest, equal
    to an uninterrupted run's."""
    from hotspec.entrypoints.llm import LLM
    from hotspec.training import distill as distill_mod
    from hotspec.training.distill import Answerer, DistillConfig, distill

    llm = LLM(None, device="cpu", dtype="float32", max_num_seqs=2)
    users = [["What is the capital of France?", "And of Germany?"], ["Say hello."],
             ["Name a colour.", "Another one?"], ["Count to three."], ["Say goodbye."]]
    cfg = DistillConfig(out=tmp_path / "ref", max_new_tokens=6, shard_size=1, progress=False)
    distill(llm, [Conversation("t", list(u)) for u in users], cfg)
    clock = {"steps": 0}  # one second an engine step
    real_step = Answerer.step
    monkeypatch.setattr(Answerer, "step", lambda self: (clock.__setitem__("steps", clock["steps"] + 1),
                                                         real_step(self))[1])
    monkeypatch.setattr(distill_mod.time, "perf_counter", lambda: float(clock["steps"]))
    cut = replace(cfg, out=tmp_path / "cut", time_limit=9.5)
    manifest = distill(llm, [Conversation("t", list(u)) for u in users], cut)
    written = sorted(p.name for p in (tmp_path / "cut").glob("tokens_*.npz"))
    assert not manifest["complete"] and 0 < len(written) < len(users)
    assert written == [f"tokens_{i:05d}.npz" for i in range(len(written))]  # a prefix, in order
    assert clock["steps"] <= 12  # stopped at the limit, not after the shards in progress
    assert not llm.engine.has_unfinished()
    manifest = distill(llm, [Conversation("t", list(u)) for u in users], replace(cut, time_limit=None))
    assert manifest["complete"]
    for i in range(len(users)):
        got, want = (load_shard(shard_path(tmp_path / d, i)) for d in ("cut", "ref"))
        assert [got.record(r)[0].tolist() for r in range(got.num_records)] == \
            [want.record(r)[0].tolist() for r in range(want.num_records)]
