"""How close each healthy control came to the sub-layer burst alarm (issue 16), from its saved run.

A rule judged only by "no control alarmed" says nothing of how near one came, and a near miss on
one set can be a false alarm on the next. The rule alarms when a branch's ratio passes four tests
at one check: ``FOLD`` times its median, ``Z`` robust sd above it, ``JUMP`` times the last check,
and at least ``FLOOR`` of its shortcut (from seed 290 on). A control's margin is the largest s at
which the rule with every threshold times s alarms on it, found by bisection on exact replays
(``sublayer_ratio_alerts``): at every check at least one test stayed under s of its threshold, and
at one check all of them reached it (margins read before seed 290 scaled the first three only).
Under 1, the rule as shipped never alarmed on the run; 1 or more, it did. The table gives where
that check was, the branch, and its ratio against its median and against the last check; under it,
a line per failure counts its distinct controls at or above margins 0.7, 0.8, 0.9 and 1.

Run: python benchmarks/sublayer_margin.py --seeds 222-225 [--runs DIR]; seconds, training nothing.
"""

from __future__ import annotations

import json
from typing import Any

from matched_detectors import saved_runs, saved_runs_parser, sublayer_ratio_alerts

from rksp_cli.monitors.base import Alert
from rksp_cli.monitors.failures import WatchedRun
from rksp_cli.monitors.sublayer_ratio import FLOOR, FOLD, JUMP, SublayerRatio, Z

CEILING = 4.0  # margins are searched up to this multiple of the shipped thresholds
NEAR = (0.7, 0.8, 0.9, 1.0)  # the summary counts controls at or above each of these margins
TOLERANCE = 1e-4


def _first(run: WatchedRun, scale: float) -> Alert | None:
    alerts = sublayer_ratio_alerts(run, thresholds=(scale * FOLD, scale * Z, scale * JUMP), floor=scale * FLOOR)
    return alerts[0] if alerts else None


def margin(run: WatchedRun) -> tuple[float, Alert | None]:
    """The largest multiple s of every threshold (within ``TOLERANCE``, at most ``CEILING``) at which
    the rule alarms on ``run``, with its first alarm there; (0, None) if it never scores."""
    if (alert := _first(run, CEILING)) is not None:
        return CEILING, alert
    low, high, found = 0.0, CEILING, None
    while high - low > TOLERANCE:
        middle = (low + high) / 2
        if (alert := _first(run, middle)) is not None:
            low, found = middle, alert
        else:
            high = middle
    return low, found


def _jump(run: WatchedRun, alert: Alert) -> float:
    """The branch's ratio at the alert's check over its ratio at the check before."""
    key = f"{SublayerRatio.name}/{alert.layer}"
    ratios = [(c["step"], c["metrics"][key]) for c in run.series if key in c["metrics"]]
    at = next(i for i, (step, _) in enumerate(ratios) if step == alert.step)
    return ratios[at][1] / ratios[at - 1][1]


def _ratios(check: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in check["metrics"].items() if k.startswith(f"{SublayerRatio.name}/")}


def margins(runs: list[WatchedRun]) -> list[dict[str, Any]]:
    """Each control watched by ``sublayer_ratio``, closest first. Two failures that share a control
    (width 64's growth and low precision both train lr 0.01 without the fault) save the same run
    twice; it is one row, naming both, so that one near miss does not read as two. Runs are matched
    on the ratios the rule reads: the rest of a check may differ (the R-Metric counts measured
    step-time stragglers)."""
    rows: list[dict[str, Any]] = []
    seen: dict[tuple[str, int, str], dict[str, Any]] = {}
    for run in runs:
        if run.kind == "failing" or SublayerRatio.name not in run.monitors:
            continue
        same = (run.kind, run.seed, json.dumps([_ratios(c) for c in run.series], sort_keys=True))
        if (twin := seen.get(same)) is not None:
            twin["failure"] += f" / {run.failure}"
            continue
        share, alert = margin(run)
        row = {"failure": run.failure, "kind": run.kind, "seed": run.seed, "margin": round(share, 3)}
        seen[same] = row
        if alert is not None:
            row |= {"step": alert.step, "branch": alert.layer, "fold": alert.value, "jump": _jump(run, alert)}
        rows.append(row)
    return sorted(rows, key=lambda r: -r["margin"])


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| control | margin (share of every threshold) | step | branch | x its median | x the last check |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        where = f"{r['step']} | {r['branch']} | {r['fold']:.2f} | {r['jump']:.2f}" if "step" in r else "- | - | - | -"
        ceiling = ">= " if r["margin"] >= CEILING else ""
        lines.append(f"| {r['failure']} {r['kind']} {r['seed']} | {ceiling}{r['margin']:.2f} | {where} |")
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]]) -> str:
    """Lines under the table, one per failure: how many distinct controls came how near, so that a
    pooled read over many sets does not rest on the closest row alone."""
    lines = []
    for failure in sorted({r["failure"] for r in rows}):
        near = [r["margin"] for r in rows if r["failure"] == failure]
        counts = ", ".join(f">= {at:g}: {sum(m >= at for m in near)}" for at in NEAR)
        lines.append(f"{failure}: {len(near)} controls; margin {counts}")
    return "\n".join(lines)


def main() -> None:
    parser = saved_runs_parser(__doc__)
    args = parser.parse_args()
    paths = saved_runs(args.seeds, args.runs)
    if not paths:
        parser.error(f"no saved runs of seeds {min(args.seeds)}-{max(args.seeds)} under {args.runs}")
    rows = margins([WatchedRun.from_dict(json.loads(p.read_text())) for p in paths])
    if not rows:
        parser.error(f"no control watched by {SublayerRatio.name} among the saved runs of those seeds")
    print(markdown(rows))
    print()
    print(summary(rows))


if __name__ == "__main__":
    main()
