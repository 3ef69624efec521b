"""The `hotspec` command shows hotspec's INFO messages (the CUDA-graph table at start-up, which head
was loaded) on stderr: without a handler Python would drop them silently."""

from __future__ import annotations

import logging

from hotspec.cli.main import build_parser
from hotspec.logs import setup_logging


def test_info_messages_reach_stderr(capsys):
    try:
        setup_logging(build_parser().parse_args(["generate", "x"]).log_level)
        logging.getLogger("hotspec.runtime").info("CUDA graphs (phase x batch size): table")
        logging.getLogger("hotspec.server").debug("not shown at info")
        err = capsys.readouterr().err
        assert "CUDA graphs (phase x batch size): table" in err
        assert "not shown" not in err
        setup_logging("warning")
        logging.getLogger("hotspec").info("quiet")
        assert "quiet" not in capsys.readouterr().err
    finally:
        logging.getLogger("hotspec").handlers.clear()
        logging.getLogger("hotspec").propagate = True
        logging.getLogger("hotspec").setLevel(logging.NOTSET)
