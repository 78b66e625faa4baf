"""Reading a monitor's JSON-lines log, as ``rksp watch`` does while the job is still writing it."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rksp_cli.errors import InputError

# (label, metric family, how layers combine): the dashboard's one line per signal
HEADLINES: tuple[tuple[str, str, Callable[[list[float]], float]], ...] = (
    ("loss", "loss", max),
    ("spectral alignment: lowest sign entropy (bit)", "sa_entropy_min", min),
    ("sub-layer output / shortcut (highest)", "sublayer_ratio", max),
    ("attention QK-update entropy (lowest layer)", "qk_entropy_mean", min),
    ("attention: largest logit (highest layer)", "attn_logit_max", max),
    ("output log Z (mean over tokens)", "log_z_mean", max),
    ("router token entropy (lowest layer, nats)", "router_entropy", min),
    ("router expert similarity (highest layer)", "router_similarity", max),
    ("R-Metric", "r_metric", max),
)


@dataclass
class MetricsLog:
    path: Path
    monitors: list[str] = field(default_factory=list)
    every: int | None = None
    checks: list[dict] = field(default_factory=list)  # the latest run's check records, in order
    unreadable: int = 0  # malformed lines (a line still being written at the end is not counted)

    def series(self, family: str, combine: Callable[[list[float]], float]) -> list[tuple[int, float]]:
        """(step, value) of one headline over the checks that logged it."""
        points = []
        for record in self.checks:
            if family == "loss":
                values = [record.get("loss")]
            else:
                metrics = record.get("metrics", {})
                values = [v for k, v in metrics.items() if k == family or k.startswith(family + "/")]
            values = [v for v in values if isinstance(v, (int, float))]
            if values:
                points.append((record["step"], combine(values)))
        return points

    def alerts(self) -> list[dict]:
        return [a for record in self.checks for a in record.get("alerts", [])]


def read_log(path: Path) -> MetricsLog:
    """The latest run in ``path`` (a file may hold several: each starts with a ``start`` event)."""
    if not path.is_file():
        raise InputError(f"{path}: no such metrics log (Monitor(..., log=...) writes one)")
    log = MetricsLog(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a metrics log (binary data, not JSON lines)") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or type(exc).__name__})") from None
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            log.unreadable += i < len(lines) - 1  # the last line may be half-written
            continue
        if record.get("event") == "start":
            log.monitors, log.every, log.checks = record.get("monitors", []), record.get("every"), []
        elif isinstance(record.get("step"), int):
            log.checks.append(record)
        else:
            log.unreadable += 1
    return log
