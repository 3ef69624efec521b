"""FR-Spec token maps: building them from a corpus (`hotspec token-map`) and loading them safely."""

from __future__ import annotations

import functools
import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from hotspec.cli.main import main
from hotspec.errors import ModelLoadError
from hotspec.speculative import corpus
from hotspec.speculative.token_map import load_token_map
from hotspec.speculative.token_map_builder import build_token_map, end_of_turn_ids, save_token_map

VOCAB = 49152  # SmolLM2
IM_END = 2  # SmolLM2's EOS and end-of-turn token, <|im_end|>


@functools.lru_cache(maxsize=1)
def _tokenizer():
    from hotspec.models.default_model import default_model_path
    from hotspec.models.loader import load_tokenizer

    return load_tokenizer(default_model_path())


@pytest.fixture
def tok():
    return _tokenizer()


def _ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def _write_sharegpt(path: Path, convs: list[list[str]], cut: int | None = None) -> None:
    data = [{"id": str(i), "conversations": [{"from": "human" if j % 2 == 0 else "gpt", "value": v}
                                             for j, v in enumerate(turns)]}
            for i, turns in enumerate(convs)]
    text = json.dumps(data, ensure_ascii=False, indent=1)
    path.write_text(text if cut is None else text[:cut], encoding="utf-8")


# --- building ---------------------------------------------------------------------------------

def test_hand_counted_corpus_ranking_forcing_and_coverage(tok, tmp_path: Path) -> None:
    a, sp_a, sp_b, sp_c = _ids(tok, "a")[0], _ids(tok, " a")[0], _ids(tok, " b")[0], _ids(tok, " c")[0]
    f = tmp_path / "c.txt"
    f.write_text("a a a a b b c")  # tokens: a, ' a' x3, ' b' x2, ' c' -> 7 tokens, no EOS
    assert _ids(tok, f.read_text()) == [a, sp_a, sp_a, sp_a, sp_b, sp_b, sp_c]

    r = build_token_map(tok, [f], size=4, progress=False)
    # Top 4 by count, ties to the lower id: ' a'(3), ' b'(2), then the 1-count ones by id;
    # <|im_end|> (count 0) replaces the least frequent of those.
    ones = sorted([a, sp_c])
    assert r.ids == [sp_a, sp_b, ones[0], IM_END]
    assert r.forced == [IM_END] and r.tokens_counted == 7 and r.skipped == 0
    assert r.coverage == pytest.approx(6 / 7)

    r3 = build_token_map(tok, [f], size=3, progress=False)
    assert r3.ids == [sp_a, sp_b, IM_END] and r3.coverage == pytest.approx(5 / 7)


def test_end_of_turn_ids_from_chat_template(tok) -> None:
    assert tok.convert_ids_to_tokens(IM_END) == "<|im_end|>"
    assert end_of_turn_ids(tok, VOCAB) == [IM_END]


def test_eos_already_frequent_is_not_duplicated(tok, tmp_path: Path) -> None:
    f = tmp_path / "c.txt"
    f.write_text("x<|im_end|>y<|im_end|>z<|im_end|> q")  # special tokens in text are tokenized
    r = build_token_map(tok, [f], size=3, progress=False)
    assert r.ids[0] == IM_END and len(r.ids) == len(set(r.ids)) == 3


def test_ranking_matches_independent_count_and_size(tok, tmp_path: Path) -> None:
    text = ("The quick brown fox jumps over the lazy dog. " * 3 + "Hello, world! Hello again.\n"
            "Speculative decoding drafts tokens; the target verifies them.\n")
    f = tmp_path / "doc.md"  # any non-JSON suffix is plain text
    f.write_text(text)
    counts = Counter(_ids(tok, text))
    r = build_token_map(tok, [f], size=20, progress=False)
    assert len(r.ids) == len(set(r.ids)) == 20 and IM_END in r.ids
    expected = sorted(counts, key=lambda i: (-counts[i], i))[:19]
    assert r.ids[:19] == expected
    assert [counts[i] for i in r.ids] == sorted((counts[i] for i in r.ids), reverse=True)
    assert r.tokens_counted == sum(counts.values())
    assert r.coverage == pytest.approx(sum(counts[i] for i in r.ids) / r.tokens_counted)


def test_size_larger_than_vocab_gives_whole_vocab_ranked(tok, tmp_path: Path) -> None:
    f = tmp_path / "c.txt"
    f.write_text(" b b b a")
    r = build_token_map(tok, [f], size=10**6, progress=False)
    assert len(r.ids) == VOCAB and sorted(r.ids) == list(range(VOCAB))
    assert r.ids[:2] == [_ids(tok, " b")[0], _ids(tok, " a")[0]] and r.coverage == 1.0
    assert r.ids[2:10] == [i for i in range(10) if i not in r.ids[:2]][:8]  # zero counts: id order


def test_jsonl_text_and_conversations(tok, tmp_path: Path) -> None:
    f = tmp_path / "c.jsonl"
    records = [
        {"text": "plain text record"},
        {"conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "hello"}]},
        {"messages": [{"role": "user", "content": "what is 2+2"}, {"role": "assistant", "content": "4"}]},
        {"conversation": [{"role": "user", "content": [{"type": "text", "text": "parts"}]}]},
        {"no_text_here": 1},
    ]
    lines = [json.dumps(r) for r in records] + ["", '{"text": "cut off']  # truncated last line
    f.write_text("\n".join(lines) + "\n")
    texts = ["plain text record", "hi there", "hello", "what is 2+2", "4", "parts"]
    r = build_token_map(tok, [f], size=64, progress=False)
    assert r.tokens_counted == sum(len(_ids(tok, t)) for t in texts)
    assert r.skipped == 2  # the record without text and the broken line
    assert r.coverage == 1.0  # fewer distinct tokens than the map holds


def test_sharegpt_json_complete_and_truncated(tok, tmp_path: Path, monkeypatch) -> None:
    convs = [["Héllo wörld, 日本語?", "Bonjour!"], ["second conversation", "reply two"],
             ["third one is cut", "never fully written"]]
    full, cut = tmp_path / "full.json", tmp_path / "cut.json"
    _write_sharegpt(full, convs)
    text = full.read_text(encoding="utf-8")
    _write_sharegpt(cut, convs, cut=text.index("never fully") + 5)
    # Tiny reads: records and multi-byte characters straddle buffer boundaries.
    monkeypatch.setattr(corpus, "_JSON_READ_BYTES", 7)
    n = [sum(len(_ids(tok, t)) for t in turns) for turns in convs]

    r_full = build_token_map(tok, [full], size=64, progress=False)
    assert r_full.tokens_counted == sum(n) and r_full.skipped == 0
    r_cut = build_token_map(tok, [cut], size=64, progress=False)
    assert r_cut.tokens_counted == n[0] + n[1] and r_cut.skipped == 1  # broken tail skipped

    both = build_token_map(tok, [cut, full], size=64, progress=False)
    assert both.tokens_counted == 2 * (n[0] + n[1]) + n[2]


def test_plain_text_streams_in_pieces_that_rebuild_the_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(corpus, "_TEXT_CHUNK_CHARS", 10)
    monkeypatch.setattr(corpus, "_MAX_LINE", 4)
    text = "première ligne\n\nsecond paragraph here\n\n\nthird 日本語 no newline"
    f = tmp_path / "c.txt"
    f.write_text(text, encoding="utf-8")
    seen: list[int] = []
    chunks = list(corpus.iter_text_chunks(f, seen.append))
    assert len(chunks) > 1 and "".join(chunks) == text and sum(seen) == f.stat().st_size


def test_build_refusals(tok, tmp_path: Path) -> None:
    f = tmp_path / "c.txt"
    f.write_text("hello")
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        build_token_map(tok, [f, tmp_path / "nope.txt"], size=8, progress=False)
    with pytest.raises(ValueError, match="too small"):
        build_token_map(tok, [f], size=0, progress=False)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="no text"):
        build_token_map(tok, [empty], size=8, progress=False)


# --- saving and the CLI -----------------------------------------------------------------------

def test_save_loads_with_hotspec_and_plain_torch(tok, tmp_path: Path) -> None:
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"text": "some words and some more words"}) + "\n")
    r = build_token_map(tok, [f], size=32, progress=False)
    out = tmp_path / "maps" / "freq_32.pt"
    sidecar = save_token_map(r, out, "SmolLM2", [f])

    assert load_token_map(out, VOCAB).tolist() == r.ids
    raw = torch.load(out, weights_only=True)
    assert type(raw) is list and raw == r.ids and all(type(i) is int for i in raw)
    assert sidecar == tmp_path / "maps" / "freq_32.pt.json"
    meta = json.loads(sidecar.read_text())
    assert meta["model"] == "SmolLM2" and meta["corpus_files"] == [str(f)]
    assert meta["size"] == 32 and meta["tokens_counted"] == r.tokens_counted
    assert meta["coverage"] == r.coverage and meta["forced"] == [IM_END] and meta["date"]


def test_cli_end_to_end(tmp_path: Path, capsys) -> None:
    f = tmp_path / "c.txt"
    f.write_text("a a a a b b c")
    out = tmp_path / "freq_3.pt"
    assert main(["token-map", "--corpus", str(f), "--size", "3", "--out", str(out),
                 "--no-progress"]) == 0
    line = capsys.readouterr().out.strip()
    assert "\n" not in line and "7 corpus tokens" in line and "71.43%" in line and str(out) in line
    ids = load_token_map(out, VOCAB).tolist()
    assert len(ids) == 3 and ids[-1] == IM_END
    assert json.loads(Path(str(out) + ".json").read_text())["tokens_counted"] == 7


def test_cli_several_sizes_write_one_map_each(tmp_path: Path, capsys) -> None:
    """--size A B ...: one count, OUT_DIR/freq_<SIZE>.pt each, every map the one its size alone
    gives; --out names one map, so several sizes with --out are refused before any work."""
    f = tmp_path / "c.txt"
    f.write_text("a a a a b b b c c d")
    alone = {}
    for size in (2, 4):
        out = tmp_path / f"alone_{size}.pt"
        assert main(["token-map", "--corpus", str(f), "--size", str(size), "--out", str(out),
                     "--no-progress"]) == 0
        alone[size] = load_token_map(out, VOCAB).tolist()
    maps = tmp_path / "maps"
    assert main(["token-map", "--corpus", str(f), "--size", "4", "2", "--out-dir", str(maps),
                 "--no-progress"]) == 0
    assert capsys.readouterr().out.count("token map:") == 4  # two alone, two together
    assert load_token_map(maps / "freq_4.pt", VOCAB).tolist() == alone[4]
    assert load_token_map(maps / "freq_2.pt", VOCAB).tolist() == alone[2]
    assert main(["token-map", "--corpus", str(f), "--size", "4", "2", "--out",
                 str(tmp_path / "x.pt"), "--no-progress"]) == 2
    assert "--out-dir" in capsys.readouterr().err and not (tmp_path / "x.pt").exists()


def test_cli_counts_the_response_tokens_of_distilled_shards(tmp_path: Path, capsys) -> None:
    """--data: only the tokens the target wrote count (the mask), never the prompts'."""
    from hotspec.training.token_shards import TokenRecords, save_shard

    records = [([7, 8, 9, 5, 5, 5], [False, False, False, True, True, True]),
               ([7, 7, 7, 7, 6, 5, IM_END], [False, False, False, False, True, True, True])]
    save_shard(tmp_path / "d", 0, TokenRecords.build(records, VOCAB))
    out = tmp_path / "freq_3.pt"
    assert main(["token-map", "--data", str(tmp_path / "d"), "--size", "3", "--out", str(out)]) == 0
    assert "from 6 response tokens" in capsys.readouterr().out
    assert load_token_map(out, VOCAB).tolist() == [5, 2, 6]  # 5 x4; then IM_END and 6 once each
    with pytest.raises(SystemExit):  # one source or the other
        main(["token-map", "--data", str(tmp_path / "d"), "--corpus", "x.txt"])


def test_cli_reports_errors(tmp_path: Path, capsys) -> None:
    assert main(["token-map", "--corpus", str(tmp_path / "missing.txt"), "--out",
                 str(tmp_path / "m.pt"), "--no-progress"]) == 2
    assert "missing.txt" in capsys.readouterr().err and not (tmp_path / "m.pt").exists()
    with pytest.raises(SystemExit):
        main(["token-map", "--corpus", str(tmp_path / "x.txt"), "--size", "0"])


# --- loading ----------------------------------------------------------------------------------

def test_maps_made_elsewhere_load(tmp_path: Path) -> None:
    p = tmp_path / "list.pt"
    torch.save(list(range(100)), p)
    assert load_token_map(p, VOCAB).tolist() == list(range(100))
    t = tmp_path / "tensor.pt"
    torch.save(torch.tensor([5, 3, 9], dtype=torch.int32), t)
    ids = load_token_map(t, VOCAB)
    assert ids.dtype == torch.long and ids.tolist() == [5, 3, 9]


@pytest.mark.parametrize("obj, match", [
    ([0, 1, VOCAB], "outside the target vocabulary"),
    ([-1, 4], "outside the target vocabulary"),
    ([3, 4, 3], "repeats"),
    (torch.tensor([1.0, 2.0]), "1-D integer tensor"),
    (torch.tensor([[1, 2], [3, 4]]), "1-D integer tensor"),
    ({"ids": [1, 2]}, "holds a dict"),
    ([], "empty"),
    ([1, 2.0], "must be an int"),
])
def test_load_refusals(tmp_path: Path, obj, match: str) -> None:
    p = tmp_path / "bad.pt"
    torch.save(obj, p)
    with pytest.raises(ModelLoadError, match=match):
        load_token_map(p, VOCAB)


def test_load_refuses_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_token_map(tmp_path / "freq_32768.pt", VOCAB)


_SIDE_EFFECTS: list[str] = []


def _record_side_effect(what: str) -> list[int]:
    _SIDE_EFFECTS.append(what)
    return [1, 2, 3]


class _Payload:
    """Unpickling this calls _record_side_effect: what a malicious map would do."""

    def __reduce__(self):
        return (_record_side_effect, ("ran while loading",))


def test_load_refuses_pickled_code_without_running_it(tmp_path: Path) -> None:
    p = tmp_path / "evil.pt"
    torch.save(_Payload(), p)
    assert _SIDE_EFFECTS == []
    with pytest.raises(ModelLoadError, match="refused without being run"):
        load_token_map(p, VOCAB)
    assert _SIDE_EFFECTS == []
    # Sanity: an unrestricted load really would run it.
    torch.load(p, weights_only=False)
    assert _SIDE_EFFECTS == ["ran while loading"]
    _SIDE_EFFECTS.clear()
