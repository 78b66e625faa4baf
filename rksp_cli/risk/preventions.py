"""What to do about a high risk, from measurement only (issue 15).

``rksp_cli/preventions.json`` is written by ``benchmarks/kss_regime.py arms``: for a normalisation
family, every arm's divergences against the baseline's in the same slow-divergence regime, with
Fisher's exact p. A screen recommends an arm for a model of that family only when it diverged at
most half as often as the baseline with p < 0.05 and no more than 12% extra time per step (the
issue's bar), and it names the measured effect. Where nothing passed, or nothing was measured
for the family, it says so and recommends the one remedy that always holds: a lower learning
rate. No prevention is recommended on belief, KSS included.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

MAX_RATIO, MAX_P, MAX_TIME = 0.5, 0.05, 1.12


@cache
def measured() -> dict[str, Any]:
    """The shipped measurements ({} when none have been shipped)."""
    path = resources.files("rksp_cli") / "preventions.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def helpful(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The arms that passed against the baseline (the first row), best first."""
    base = rows[0]
    passed = [
        r
        for r in rows[1:]
        if r["diverged"] / r["runs"] <= MAX_RATIO * base["diverged"] / base["runs"]
        and r["fisher_p"] < MAX_P
        and r["time_ratio"] <= MAX_TIME
    ]
    return sorted(passed, key=lambda r: (r["diverged"] / r["runs"], r["fisher_p"]))


def advice(norm: str | None, data: dict[str, Any] | None = None) -> str:
    """One sentence for a high-risk screen of a model with normalisation ``norm``."""
    data = measured() if data is None else data
    rows = data.get("families", {}).get(norm) if norm else None
    models = f"models with norm {norm!r}" if norm else "models of this architecture"
    lower = "lower the learning rate below the edge"
    if not rows:
        return f"{lower}; no prevention has been measured for {models} in rksp's benchmark"
    best = helpful(rows)
    base = rows[0]
    if not best:
        return (
            f"{lower}; in rksp's benchmark of {models} no prevention halved divergence (baseline "
            f"{base['diverged']}/{base['runs']} diverged; KSS included; benchmarks/kss_regime.py)"
        )
    r = best[0]
    return (
        f"{lower}, or use {r['arm']}: in rksp's benchmark of {models} it diverged in "
        f"{r['diverged']}/{r['runs']} runs against {base['diverged']}/{base['runs']} without "
        f"(Fisher p {r['fisher_p']:.2g}, {100 * (r['time_ratio'] - 1):+.0f}% time per step)"
    )
