"""The benchmark scripts' exit: bad input (a HotspecError) is one `error:` line and status 2, no
traceback; otherwise main's own return code."""

from __future__ import annotations

import pytest

from hotspec.benchmark.script import run_script
from hotspec.errors import HotspecError


def test_bad_input_is_one_line_and_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    def main() -> int:
        raise HotspecError("cannot read the prompt file p.jsonl")

    with pytest.raises(SystemExit) as e:
        run_script(main)
    assert e.value.code == 2
    assert capsys.readouterr().err == "error: cannot read the prompt file p.jsonl\n"


def test_main_return_code_is_the_exit_status() -> None:
    with pytest.raises(SystemExit) as e:
        run_script(lambda: 0)
    assert e.value.code == 0
