"""`hotspec <command> --help` documents every option: each line of the help has a description, and
an engine option's description is its EngineConfig field's documentation."""

from __future__ import annotations

import argparse
import re
from dataclasses import fields

import pytest

from hotspec.cli.main import build_parser, main
from hotspec.config import EngineConfig

COMMANDS = ("generate", "serve", "bench", "bench-serve", "distill", "train-draft", "token-map",
            "prune-draft", "assemble-model")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def help_entries(text: str) -> dict[str, str]:
    """{invocation: description} of an argparse help screen: an entry starts on a line indented by
    two spaces; its description follows on that line after two or more spaces, or on the next,
    more indented lines."""
    body = text.split("\n\n", 1)[1]  # past the usage block
    entries: dict[str, str] = {}
    current: str | None = None
    for line in body.splitlines():
        m = re.match(r"^  (\S.*?)(?: {2,}(\S.*))?$", line)
        if m and not line.startswith("   "):
            current = m.group(1)
            entries[current] = m.group(2) or ""
        elif current is not None and line.startswith("   ") and line.strip():
            entries[current] = (entries[current] + " " + line.strip()).strip()
        elif not line.strip() or not line.startswith(" "):
            current = None  # a blank line or a section title ends the entry
    return entries


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_has_a_description(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    entries = help_entries(capsys.readouterr().out)
    parser = subcommands()[command]
    expected = {s for a in parser._actions for s in a.option_strings} | \
        {a.metavar or a.dest for a in parser._actions if not a.option_strings}
    shown = {word.rstrip(",") for inv in entries for word in inv.split() if word.startswith("-")} | \
        {inv for inv in entries if not inv.startswith("-")}
    assert expected <= shown, f"not parsed from the help: {sorted(expected - shown)}"
    undocumented = [inv for inv, desc in entries.items() if len(desc) < 8]
    assert not undocumented, f"options without a description: {undocumented}"


def test_top_level_help() -> None:
    entries = help_entries(build_parser().format_help())
    assert entries["--log-level {debug,info,warning,error}"].startswith("hotspec's log messages")
    assert set(subcommands()) == set(COMMANDS)


def test_engine_help_comes_from_the_config_fields() -> None:
    entries = help_entries(subcommands()["serve"].format_help())
    for f in fields(EngineConfig):
        flag = "--" + f.name.replace("_", "-")
        (desc,) = [d for inv, d in entries.items() if inv.split()[0].rstrip(",") == flag]
        doc = " ".join(f.metadata["help"].split())
        assert desc.startswith(doc), (flag, desc, doc)
        if f.default is not None:  # the default is shown; an unset default is described in words
            assert desc.endswith(")") and "(default: " in desc, (flag, desc)
    assert entries["--block-size BLOCK_SIZE"].endswith("(default: 16)")
    assert entries["--fuse-spec-step, --no-fuse-spec-step"].endswith("(default: on)")


def test_config_documentation_is_present_tense() -> None:
    for f in fields(EngineConfig):
        doc = f.metadata["help"]
        assert not re.search(r"session \d|\d+(\.\d+)? ?ms\b| -> |RESULTS\.md|H200", doc), (f.name, doc)
