"""How close each healthy control came to the spectral-alignment alarm (issue 16), from its saved run.

The rule alarms when a layer's input sign entropy stays under ``ALARM_BITS`` for ``PATIENCE``
checks, the collapse is fresh (at or above ``WARNING_BITS`` within ``FRESH`` checks), and the median
robust z of sigma_1's log increment over those checks is at least ``GROWTH_Z``. Held-out healthy
Post-LN control 480 drew the rule's first alarm on a deep control (``blocks.0.mlp.fc`` at step 3450,
z 4.9): this asks how near the other controls came. Of the three tests only the growth test is
graded (the others are a streak and a window), so a control's margin is the largest s at which the
rule with ``GROWTH_Z`` times s alarms, the collapse and freshness tests as shipped: how far
sigma_1's growth got, as a share of the threshold, on a layer whose inputs had freshly collapsed.
Under 1, the rule as shipped never alarmed on the run; 1 or more, it did; 0, no freshly collapsed
layer's sigma_1 grew at all. Found by bisection on exact replays
(``matched_detectors.spectral_alignment_alerts``). The threshold is a module constant of the
monitor, whose code stays fixed while held-out sets are judged under it, so the replay sets it for
its duration (``unittest.mock.patch``) rather than the monitor growing a parameter. The table gives
the check where the rule alarmed at s, the layer, its sign entropy and sigma_1's growth over the
streak; under it, a line per failure counts its distinct controls at or above margins 0.7, 0.8, 0.9
and 1 (``control_margin.py``).

Run: python benchmarks/alignment_margin.py --seeds 480-481 [--runs DIR]; seconds a run, training nothing.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

from control_margin import Column, Rule
from matched_detectors import spectral_alignment_alerts

from rksp_cli.monitors import spectral_alignment
from rksp_cli.monitors.base import Alert
from rksp_cli.monitors.failures import WatchedRun
from rksp_cli.monitors.spectral_alignment import GROWTH_Z, PATIENCE, SpectralAlignment

READ = ("sa_entropy/", "sa_sigma1/")


def first_alarm(run: WatchedRun, scale: float = 1.0) -> Alert | None:
    """The first alarm of the shipped rule with its growth threshold times ``scale`` (1: as shipped)."""
    with mock.patch.object(spectral_alignment, "GROWTH_Z", scale * GROWTH_Z):
        alerts = spectral_alignment_alerts(run)
    return next((a for a in alerts if a.level == "alarm"), None)


def _read(check: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in check["metrics"].items() if k.startswith(READ)}


def _growth(run: WatchedRun, alert: Alert) -> float:
    """The layer's sigma_1 at the alert's check over its sigma_1 ``PATIENCE`` checks before."""
    key = f"sa_sigma1/{alert.layer}"
    sigmas = [(c["step"], c["metrics"][key]) for c in run.series if key in c["metrics"]]
    at = next(i for i, (step, _) in enumerate(sigmas) if step == alert.step)
    return sigmas[at][1] / sigmas[max(0, at - PATIENCE)][1]


RULE = Rule(
    monitor=SpectralAlignment.name,
    thresholds="the growth threshold",
    read=_read,
    first=first_alarm,
    layer=Column("layer", "layer", "{}"),
    value=Column("entropy", "sign entropy (bit)", "{:.3f}"),
    ratio=Column("growth", f"sigma_1 x {PATIENCE} checks before", "{:.3f}"),
    ratio_of=_growth,
)


margin, margins, markdown = RULE.margin, RULE.margins, RULE.markdown


if __name__ == "__main__":
    RULE.main(__doc__)
