"""What changed between two screens (``rksp screen --json`` outputs), e.g. before and after a PR."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rksp_cli.errors import InputError

HEADLINE = ("stream_growth", "degenerate_layers")  # compared beside every layer-mean feature; the JSON has the rest


def load_screen(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise InputError(f"{path}: no such file (write one with rksp screen --json > {path.name})")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or not {"verdict", "risk", "features", "config"} <= data.keys():
        raise InputError(f"{path}: not an rksp screen result (expected the output of rksp screen --json)")
    return data


@dataclass(frozen=True)
class Change:
    item: str
    before: Any
    after: Any

    @property
    def delta(self) -> float | None:
        if isinstance(self.before, (int, float)) and isinstance(self.after, (int, float)):
            if not isinstance(self.before, bool) and not isinstance(self.after, bool):
                return self.after - self.before
        return None


@dataclass(frozen=True)
class Comparison:
    before: Path
    after: Path
    outcome: list[Change]  # verdict, risk, edge, and every feature
    config: list[Change]  # config fields that differ

    @property
    def verdict_changed(self) -> bool:
        return self.outcome[0].before != self.outcome[0].after


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def compare_screens(before_path: Path, after_path: Path) -> Comparison:
    a, b = load_screen(before_path), load_screen(after_path)
    outcome = [
        Change("verdict", a["verdict"], b["verdict"]),
        Change("risk", a["risk"], b["risk"]),
        Change("lr_edge", a.get("lr_edge"), b.get("lr_edge")),
    ]
    features = [k for k in dict.fromkeys([*a["features"], *b["features"]]) if k in HEADLINE or k.endswith("_mean")]
    outcome += [Change(f"feature.{k}", a["features"].get(k), b["features"].get(k)) for k in features]
    fa, fb = _flat(a["config"]), _flat(b["config"])
    config = [Change(k, fa.get(k), fb.get(k)) for k in dict.fromkeys([*fa, *fb]) if fa.get(k) != fb.get(k)]
    return Comparison(before_path, after_path, outcome, config)
