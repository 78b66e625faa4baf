"""The machine a benchmark ran on, for the record beside its numbers."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_model() -> str:
    """'AMD EPYC 7B13' from /proc/cpuinfo, else what platform knows."""
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()
