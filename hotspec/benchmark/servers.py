"""`hotspec serve` processes for `hotspec bench-serve`: started side by side on free ports, waited
for (/health), checked (the vanilla one must not speculate, the speculative one must), stopped."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import IO, Any

import httpx

from hotspec.config import EngineConfig
from hotspec.errors import HotspecError

SPECULATIVE = tuple(f.name for f in fields(EngineConfig) if f.name.startswith("speculative_"))


def engine_cli_args(values: dict[str, Any]) -> list[str]:
    """The `hotspec serve` options that give EngineConfig fields `values`: each field that differs
    from its default, as the command line spells it (`--no-X` for a false boolean)."""
    out: list[str] = []
    for f in fields(EngineConfig):
        v = values.get(f.name, f.default)
        default = None if f.default is MISSING else f.default
        if v == default:
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(v, bool):
            out.append(flag if v else "--no-" + flag[2:])
        elif isinstance(v, (tuple, list)):
            out += [flag, *map(str, v)]
        elif v is not None:
            out += [flag, str(v)]
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Server:
    name: str
    args: list[str]  # the `hotspec serve` options
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    _log_file: IO[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def start(name: str, args: list[str], log_dir: Path) -> Server:
    """`python -m hotspec serve ARGS --port P` in the background, its output in LOG_DIR/serve_NAME.log."""
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = log_dir / f"serve_{name.replace(' ', '_').replace('/', '-')}.log"
    f = log.open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "hotspec", "serve", *args, "--port", str(port)],
                            stdout=f, stderr=subprocess.STDOUT)
    return Server(name, args, port, proc, log, f)


def wait_healthy(servers: list[Server], timeout: float) -> None:
    """Until every server answers /health; a server that exits or is not up in `timeout` seconds
    raises HotspecError with the end of its log."""
    t0 = time.monotonic()
    for s in servers:
        while True:
            if s.proc.poll() is not None:
                raise HotspecError(f"the {s.name} server (hotspec serve {' '.join(s.args)}) exited "
                                   f"with status {s.proc.returncode}; its log ends:\n{s.log_tail()}")
            try:
                if httpx.get(s.url + "/health", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - t0 > timeout:
                raise HotspecError(f"the {s.name} server was not up after {timeout:g} s "
                                   f"(--start-timeout); its log ends:\n{s.log_tail()}")
            time.sleep(0.5)


def speculates(url: str) -> bool:
    """Whether a server runs speculative decoding (its /metrics has the draft head's figures)."""
    return "hotspec_hot_set_coverage" in httpx.get(url + "/metrics", timeout=10.0).text


def stop(servers: list[Server]) -> None:
    """SIGINT (graceful), then SIGKILL whatever is left after 15 s."""
    for s in servers:
        if s.proc.poll() is None:
            s.proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 15.0
    for s in servers:
        try:
            s.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            s.proc.kill()
            s.proc.wait()
        s._log_file.close()
