"""What to do about a high risk, from measurement only (issue 15).

``rksp_cli/preventions.json`` is written by ``benchmarks/kss_regime.py arms``: for a normalisation
family, every arm's divergences against the baseline's in the same slow-divergence regime, with
Fisher's exact p. A screen recommends an arm for a model of that family only when it diverged at
most half as often as the baseline with p < 0.05, no more than 12% extra time per step and a
final accuracy no worse than the baseline's beyond noise (the issue's bar), and it names the
measured effect. An arm that acts on alarms (``training.guard``) must also have left alone every
control, a run at an lr where the baseline trained (issue 16's "no change to clean runs"): a
guard that fires on healthy runs too lowers everyone's lr, which is not a prevention. Where the
benchmark also checked learning over a longer horizon (``learning``: the arms' runs are too short
to learn the task), an arm must learn no worse than the baseline there too. Where nothing
passed, or nothing was measured for the family, it says so and recommends the one remedy that
always holds: a lower learning rate. No prevention is recommended on belief, KSS included.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

MAX_RATIO, MAX_P, MAX_TIME = 0.5, 0.05, 1.12
NOISE_SE = 2.0  # design choice: "no worse" = not below the baseline by more than 2 standard errors


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
        and _accuracy_no_worse(r, base)
        and _learns_no_worse(r, base)
        and _clean_runs_untouched(r)
    ]
    return sorted(passed, key=lambda r: (r["diverged"] / r["runs"], r["fisher_p"]))


def _learns_no_worse(arm: dict[str, Any], base: dict[str, Any]) -> bool:
    """The longer learning check, where both were measured in it; True where either was not."""
    if "learning" not in arm or "learning" not in base:
        return True
    return _accuracy_no_worse(arm["learning"], base["learning"])


def _clean_runs_untouched(arm: dict[str, Any]) -> bool:
    """True for an arm that does not act on alarms; for one that does, its controls were measured
    and it acted on none of them."""
    if "training.guard" not in arm.get("changes", {}):
        return True
    controls = arm.get("controls")
    return controls is not None and controls.get("guard_acted", 0) == 0


def _accuracy_no_worse(arm: dict[str, Any], base: dict[str, Any]) -> bool:
    """The arm's final accuracy (mean over its trained runs) is not below the baseline's by more than
    NOISE_SE standard errors of the difference. An arm with no trained run fails."""
    if arm["final_accuracy"] is None:
        return False
    if base["final_accuracy"] is None:
        return True
    noise = NOISE_SE * (arm["final_accuracy_se"] ** 2 + base["final_accuracy_se"] ** 2) ** 0.5
    return arm["final_accuracy"] >= base["final_accuracy"] - noise


def advice(norm: str | None, data: dict[str, Any] | None = None, builtin: bool = True) -> str:
    """One sentence for a high-risk screen of a model with normalisation ``norm``; ``builtin``: the
    model is rksp's own GPT, whose ``model.*`` fields can switch an arm on (a transformers model's cannot)."""
    data = measured() if data is None else data
    rows = data.get("families", {}).get(norm) if norm else None
    models = f"models with norm {norm!r}" if norm else "models of this architecture"
    lower = "lower the learning rate below the edge"
    if not rows:
        return f"{lower}; no prevention has been measured for {models} in rksp's benchmark"
    best = helpful(rows)
    base = rows[0]
    if not best:
        tried = ", ".join(r["arm"] for r in rows[1:])
        return (
            f"{lower}; in rksp's benchmark of {models} no prevention halved divergence without a "
            f"cost (baseline {base['diverged']}/{base['runs']} diverged; tried: {tried}; "
            "benchmarks/kss_regime.py)"
        )
    r = best[0]
    also = "".join(f"; {_named(o, builtin)} also passed ({o['diverged']}/{o['runs']})" for o in best[1:])
    caveat = data.get("caveat")  # what the benchmark itself says its measurement cannot show
    return (
        f"{lower}, or use {_named(r, builtin)}: in rksp's benchmark of {models} it diverged in "
        f"{r['diverged']}/{r['runs']} runs against {base['diverged']}/{base['runs']} without "
        f"(Fisher p {r['fisher_p']:.2g}, {100 * (r['time_ratio'] - 1):+.0f}% time per step){also}"
        + (f"; caveat: {caveat}" if caveat else "")
    )


def _named(arm: dict[str, Any], builtin: bool) -> str:
    """The arm's name and, where the benchmark recorded them, the config fields that switch it on."""
    fields = {k: v for k, v in arm.get("changes", {}).items() if builtin or not k.startswith("model.")}
    how = ", ".join(f"{field}: {json.dumps(value)}" for field, value in fields.items())
    return f"{arm['arm']} ({how})" if how else arm["arm"]
