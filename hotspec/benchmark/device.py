"""Device helpers for timing: synchronise before reading a clock, name the machine."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch


def sync(device: torch.device) -> None:
    """Wait for queued device work, so that a host clock read after it covers that work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU model with its logical CPU and torch thread counts."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} logical CPUs, {torch.get_num_threads()} torch threads"
