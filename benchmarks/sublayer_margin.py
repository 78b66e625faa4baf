"""How close each healthy control came to the sub-layer burst alarm (issue 16), from its saved run.

The rule alarms when a branch's ratio passes four tests at one check: ``FOLD`` times its median,
``Z`` robust sd above it, ``JUMP`` times the last check, and at least ``FLOOR`` of its shortcut (from
seed 290 on). A control's margin is the largest s at which the rule with every threshold times s
alarms on it, found by bisection on exact replays (``sublayer_ratio_alerts``): at every check at
least one test stayed under s of its threshold, and at one check all of them reached it (margins
read before seed 290 scaled the first three only). Under 1, the rule as shipped never alarmed on the
run; 1 or more, it did. The table gives where that check was, the branch, and its ratio against its
median and against the last check; under it, a line per failure counts its distinct controls at or
above margins 0.7, 0.8, 0.9 and 1 (``control_margin.py``, shared with ``logit_margin.py``).

Run: python benchmarks/sublayer_margin.py --seeds 222-225 [--runs DIR]; seconds, training nothing.
"""

from __future__ import annotations

from typing import Any

from control_margin import Column, Rule
from matched_detectors import sublayer_ratio_alerts

from rksp_cli.monitors.base import Alert
from rksp_cli.monitors.failures import WatchedRun
from rksp_cli.monitors.sublayer_ratio import FLOOR, FOLD, JUMP, SublayerRatio, Z


def _first(run: WatchedRun, scale: float) -> Alert | None:
    alerts = sublayer_ratio_alerts(run, thresholds=(scale * FOLD, scale * Z, scale * JUMP), floor=scale * FLOOR)
    return alerts[0] if alerts else None


def _jump(run: WatchedRun, alert: Alert) -> float:
    """The branch's ratio at the alert's check over its ratio at the check before."""
    key = f"{SublayerRatio.name}/{alert.layer}"
    ratios = [(c["step"], c["metrics"][key]) for c in run.series if key in c["metrics"]]
    at = next(i for i, (step, _) in enumerate(ratios) if step == alert.step)
    return ratios[at][1] / ratios[at - 1][1]


def _ratios(check: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in check["metrics"].items() if k.startswith(f"{SublayerRatio.name}/")}


RULE = Rule(
    monitor=SublayerRatio.name,
    thresholds="every threshold",
    read=_ratios,
    first=_first,
    layer=Column("branch", "branch", "{}"),
    value=Column("fold", "x its median"),
    ratio=Column("jump", "x the last check"),
    ratio_of=_jump,
)


margin, margins, markdown = RULE.margin, RULE.margins, RULE.markdown


if __name__ == "__main__":
    RULE.main(__doc__)
