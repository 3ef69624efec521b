"""scripts/device_carry.sh: `hide` takes the shipped head out of what the device tool carries
(git's index and a local ignore) without touching the files; `restore` puts both back exactly."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAD = "hotspec/assets/smollm2-eagle3"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def test_hide_then_restore(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / HEAD).mkdir(parents=True)
    (repo / HEAD / "model.safetensors").write_bytes(b"x" * 1000)
    (repo / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "device_carry.sh", repo / "scripts")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")

    subprocess.run(["bash", "scripts/device_carry.sh", "hide"], cwd=repo, check=True, capture_output=True)
    assert HEAD not in _git(repo, "ls-files")  # not carried: neither tracked ...
    assert _git(repo, "status", "--short", "--untracked-files=all").count("??") == 0  # ... nor untracked
    assert (repo / HEAD / "model.safetensors").exists()  # the files themselves stay

    subprocess.run(["bash", "scripts/device_carry.sh", "restore"], cwd=repo, check=True, capture_output=True)
    assert f"{HEAD}/model.safetensors" in _git(repo, "ls-files")
    assert _git(repo, "status", "--short") == ""
    assert HEAD not in (repo / ".git" / "info" / "exclude").read_text()


def test_usage_error(tmp_path: Path) -> None:
    r = subprocess.run(["bash", str(ROOT / "scripts" / "device_carry.sh")], capture_output=True, text=True)
    assert r.returncode == 2 and "usage" in r.stderr
