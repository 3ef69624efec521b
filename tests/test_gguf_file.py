"""models/gguf_file.py reads what gguf-py's GGUFReader reads, and says what is wrong with a bad
file; models/tokenizer_cache.py converts a GGUF's tokenizer once and reads it back the same."""

from __future__ import annotations

import logging
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from hotspec.errors import ModelLoadError
from hotspec.models import loader, tokenizer_cache
from hotspec.models.gguf_file import GGUFFormatError, read_gguf_file
from hotspec.models.loader import load_checkpoint, load_tokenizer, resolve_model_path


def _write(path: Path) -> Path:
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint8("t.u8", 7)
    w.add_int8("t.i8", -7)
    w.add_uint16("t.u16", 700)
    w.add_int16("t.i16", -700)
    w.add_uint32("t.u32", 70000)
    w.add_int32("t.i32", -70000)
    w.add_float32("t.f32", 1e-5)
    w.add_uint64("t.u64", 2**40)
    w.add_int64("t.i64", -(2**40))
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ✓")
    w.add_array("t.strs", ["a", "", "Ġworld", "你好"])
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 4)).astype(np.float16))
    q8 = rng.standard_normal((2, 64)).astype(np.float32)
    w.add_tensor("q8", gguf.quants.quantize(q8, gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_reads_every_value_and_tensor_as_gguf_py_does(tmp_path: Path) -> None:
    path = _write(tmp_path / "all.gguf")
    ours, theirs = read_gguf_file(path), gguf.GGUFReader(path)
    keys = [k for k in theirs.fields if not k.startswith("GGUF.")]
    assert list(ours.fields) == keys and ours.version == 3
    for k in keys:
        assert ours.fields[k] == theirs.fields[k].contents(), k
        assert ours.types[k] == theirs.fields[k].types[0], k
    assert ours.fields["t.strs"] == ["a", "", "Ġworld", "你好"] and ours.fields["t.bool"] is True
    assert [t.name for t in ours.tensors] == ["f32", "f16", "q8"]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert a.tensor_type == b.tensor_type and a.shape == tuple(int(n) for n in b.shape)
        assert a.data.dtype == b.data.dtype and np.array_equal(a.data, b.data), a.name


def test_a_truncated_or_foreign_file_is_refused_with_the_reason(tmp_path: Path) -> None:
    whole = _write(tmp_path / "all.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:-100])  # the last tensor's bytes are missing
    with pytest.raises(GGUFFormatError, match="'q8'.*truncated"):
        read_gguf_file(cut)
    cut.write_bytes(whole[:200])  # inside the metadata
    with pytest.raises(ModelLoadError, match="ends early.*Fix: re-download"):
        load_checkpoint(cut, torch.float32)
    for at in range(24, 400, 5):  # wherever the metadata stops (strings, arrays, records)
        cut.write_bytes(whole[:at])
        with pytest.raises(GGUFFormatError):
            read_gguf_file(cut)
    cut.write_bytes(b"GGUF" + (1).to_bytes(4, "little") + bytes(40))
    with pytest.raises(GGUFFormatError, match="version 1"):
        read_gguf_file(cut)


def test_a_ggufs_tokenizer_is_converted_once_then_read_from_the_cache(monkeypatch) -> None:
    from transformers import AutoTokenizer

    path = resolve_model_path(None)
    first = load_tokenizer(path)  # (converted here, or by an earlier test of this session)
    assert (tokenizer_cache.cached_folder(path) / "tokenizer.json").is_file()
    calls: list[dict] = []
    real = AutoTokenizer.from_pretrained
    monkeypatch.setattr(AutoTokenizer, "from_pretrained",
                        lambda *a, **kw: calls.append({"args": a, **kw}) or real(*a, **kw))
    loader._load_tokenizer.cache_clear()
    try:
        again = load_tokenizer(path)
    finally:
        loader._load_tokenizer.cache_clear()
    assert calls == [{"args": (str(tokenizer_cache.cached_folder(path)),)}]  # no gguf_file
    text = "Speculative decoding, 123 tokens: héllo <|im_end|>"
    chat = [{"role": "user", "content": "hi"}]
    assert again.encode(text) == first.encode(text) and again.eos_token_id == first.eos_token_id
    assert again.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        first.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)


def test_a_cache_that_cannot_be_written_is_said_once(tmp_path: Path, monkeypatch, caplog) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    monkeypatch.setattr(tokenizer_cache, "_warned", set())

    class Tok:
        def save_pretrained(self, where: str) -> None:
            (Path(where) / "tokenizer.json").write_text("{}")

    with caplog.at_level(logging.WARNING, logger="hotspec.models"):
        for _ in range(2):
            tokenizer_cache._save(Tok(), tokenizer_cache.cache_dir() / "tokenizers" / "x")
    said = [r.getMessage() for r in caplog.records if "could not cache" in r.getMessage()]
    assert len(said) == 1 and "XDG_CACHE_HOME" in said[0]


def test_two_processes_saving_at_once_keep_one_copy(tmp_path: Path, monkeypatch, caplog) -> None:
    """Of two savers that both found no cached copy, the one renaming second keeps quiet."""
    monkeypatch.setattr(tokenizer_cache, "_warned", set())
    folder = tmp_path / "tokenizers" / "x"
    real_replace = tokenizer_cache.os.replace

    class Tok:
        def save_pretrained(self, where: str) -> None:
            (Path(where) / "tokenizer.json").write_text("{}")

    def first_wins(src, dst):  # the other process renames between our check and our rename
        folder.mkdir(parents=True)
        (folder / "tokenizer.json").write_text("{}")
        real_replace(src, dst)

    monkeypatch.setattr(tokenizer_cache.os, "replace", first_wins)
    with caplog.at_level(logging.WARNING, logger="hotspec.models"):
        tokenizer_cache._save(Tok(), folder)
    assert not caplog.records and (folder / "tokenizer.json").is_file()
    assert [p.name for p in folder.parent.iterdir()] == ["x"]  # our copy removed
