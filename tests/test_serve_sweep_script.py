"""benchmarks/serve_sweep.sh (the request-rate sweep of `hotspec serve`) end to end on the CPU with
the default model: both servers come up, the load test passes, the vanilla server really is
vanilla (no tau; with no --model, `hotspec serve` would otherwise speculate with the shipped head,
and the sweep would compare two speculative servers) and the speculative one speculates. A
baseline that speculates is refused before any load is sent."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVE = "--device cpu --dtype float32 --num-kv-blocks 256 --max-model-len 512"
CHAIN = ("--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
         "--speculative-num-draft-tokens 4")
LOAD = ("--num-requests 6 --concurrency 3 --rates inf --min-tokens 2 --max-tokens 8 "
        "--max-prompt-words 20 --disconnect-fraction 0 --verify-greedy 2 --timeout 300 "
        "--drain-timeout 30")


def _two_free_ports() -> int:
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
    raise RuntimeError("no two consecutive free ports")


def _sweep(tmp_path: Path, serve: str, spec: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PY=sys.executable, OUT=str(tmp_path / "out"), LOGDIR=str(tmp_path / "logs"),
               PORT=str(_two_free_ports()), SERVE_ARGS=serve, SPEC_ARGS=spec, LOAD_ARGS=LOAD,
               START_S="300", OMP_NUM_THREADS="1")
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "serve_sweep.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


def test_sweep_compares_vanilla_with_speculative(tmp_path: Path) -> None:
    r = _sweep(tmp_path, SERVE, CHAIN)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "--no-default-head" in r.stdout  # the baseline is started without the shipped head
    out = json.loads((tmp_path / "out" / "serve_sweep.json").read_text())
    assert out["passed"] and all(c["ok"] for c in out["checks"])
    by = {rep["target"]: rep for rep in out["reports"]}
    assert set(by) == {"vanilla", "spec"}
    assert by["vanilla"]["tau_mean"] is None  # no verify pass at all
    assert by["spec"]["tau_mean"] >= 1.0
    assert by["spec"]["greedy_checked"] > 0 and by["spec"]["greedy_mismatched"] == 0


@pytest.mark.parametrize("serve", [SERVE + " " + CHAIN])
def test_a_speculating_baseline_is_refused(tmp_path: Path, serve: str) -> None:
    r = _sweep(tmp_path, serve, "none")
    assert r.returncode == 2, r.stdout[-4000:]
    assert "the vanilla server is speculating" in r.stdout
    assert not (tmp_path / "out" / "serve_sweep.json").exists()
