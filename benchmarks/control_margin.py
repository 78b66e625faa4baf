"""How near each healthy control came to a monitor's alarm rule, from its saved run (issue 16): what
``sublayer_margin.py`` and ``logit_margin.py`` share.

A rule judged only by "no control alarmed" says nothing of how near one came, and a near miss on
one set can be a false alarm on the next. A control's margin is the largest s at which the rule with
its thresholds times s alarms on it, found by bisection on exact replays: under 1, the rule as
shipped never alarmed on the run; 1 or more, it did. The table gives that alarm's check; under it,
a line per failure counts its distinct controls at or above margins 0.7, 0.8, 0.9 and 1, so that a
pooled read over many sets does not rest on the closest row alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from matched_detectors import saved_runs, saved_runs_parser

from rksp_cli.monitors.base import Alert
from rksp_cli.monitors.failures import WatchedRun

CEILING = 4.0  # margins are searched up to this multiple of the shipped thresholds
NEAR = (0.7, 0.8, 0.9, 1.0)  # the summary counts controls at or above each of these margins
TOLERANCE = 1e-4


def largest_scale(first: Callable[[float], Alert | None]) -> tuple[float, Alert | None]:
    """The largest multiple s of a rule's thresholds (within ``TOLERANCE``, at most ``CEILING``) at
    which it alarms, with its first alarm there, by bisection on ``first`` (the rule's first alarm at
    s, replayed); (0, None) if it never scores."""
    if (alert := first(CEILING)) is not None:
        return CEILING, alert
    low, high, found = 0.0, CEILING, None
    while high - low > TOLERANCE:
        middle = (low + high) / 2
        if (alert := first(middle)) is not None:
            low, found = middle, alert
        else:
            high = middle
    return low, found


def controls(
    runs: list[WatchedRun], monitor: str, read: Callable[[dict[str, Any]], Any]
) -> list[tuple[str, WatchedRun]]:
    """The distinct controls watched by ``monitor``, each with the failures it is a control of. Two
    failures that share a control (width 64's growth and low precision both train lr 0.01 without
    the fault) save the same run twice; it is one, named "a / b", so that one near miss does not read
    as two. Runs are matched on what the rule reads of each check (``read``): the rest of a check may
    differ (the R-Metric counts measured step-time stragglers)."""
    seen: dict[tuple[str, int, str], tuple[str, WatchedRun]] = {}
    for run in runs:
        if run.kind == "failing" or monitor not in run.monitors:
            continue
        same = (run.kind, run.seed, json.dumps([read(c) for c in run.series], sort_keys=True))
        failures, kept = seen.get(same, ("", run))
        seen[same] = (f"{failures} / {run.failure}" if failures else run.failure, kept)
    return list(seen.values())


def summary(rows: list[dict[str, Any]]) -> str:
    """Lines under the table, one per failure: how many distinct controls came how near."""
    lines = []
    for failure in sorted({r["failure"] for r in rows}):
        near = [r["margin"] for r in rows if r["failure"] == failure]
        counts = ", ".join(f">= {at:g}: {sum(m >= at for m in near)}" for at in NEAR)
        lines.append(f"{failure}: {len(near)} controls; margin {counts}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Column:
    """A column of the table, describing the check where the rule alarmed: its row key and header."""

    key: str
    header: str
    form: str = "{:.2f}"


@dataclass(frozen=True)
class Rule:
    """An alarm rule as a margin script reads it, and the script's table and command line. The table
    describes the alarm's check: its step, the layer, the alarm's value and a ratio of the rule's
    (``ratio``, read from the run)."""

    monitor: str  # the monitor whose controls are read
    thresholds: str  # which thresholds s scales, for the table's header: "every threshold"
    read: Callable[[dict[str, Any]], Any]  # what the rule reads of a check
    first: Callable[[WatchedRun, float], Alert | None]  # its first alarm with thresholds times s
    layer: Column
    value: Column
    ratio: Column
    ratio_of: Callable[[WatchedRun, Alert], float]

    def margin(self, run: WatchedRun) -> tuple[float, Alert | None]:
        """The largest multiple s of the thresholds at which the rule alarms on ``run``."""
        return largest_scale(lambda scale: self.first(run, scale))

    def margins(self, runs: list[WatchedRun]) -> list[dict[str, Any]]:
        """Each distinct control watched by the rule's monitor, closest first."""
        rows = []
        for failures, run in controls(runs, self.monitor, self.read):
            share, alert = self.margin(run)
            row = {"failure": failures, "kind": run.kind, "seed": run.seed, "margin": round(share, 3)}
            if alert is not None:
                row |= {
                    "step": alert.step,
                    self.layer.key: alert.layer,
                    self.value.key: alert.value,
                    self.ratio.key: self.ratio_of(run, alert),
                }
            rows.append(row)
        return sorted(rows, key=lambda r: -r["margin"])

    def markdown(self, rows: list[dict[str, Any]]) -> str:
        columns = (self.layer, self.value, self.ratio)
        lines = [
            f"| control | margin (share of {self.thresholds}) | step | {' | '.join(c.header for c in columns)} |",
            "|---|---|---|" + "---|" * len(columns),
        ]
        for r in rows:
            cells = [str(r["step"]), *(c.form.format(r[c.key]) for c in columns)] if "step" in r else []
            where = " | ".join(cells or ["-"] * (1 + len(columns)))
            ceiling = ">= " if r["margin"] >= CEILING else ""
            lines.append(f"| {r['failure']} {r['kind']} {r['seed']} | {ceiling}{r['margin']:.2f} | {where} |")
        return "\n".join(lines)

    def main(self, doc: str) -> None:
        """A margin script's command line: its table and summary for the saved runs of ``--seeds``."""
        parser = saved_runs_parser(doc)
        args = parser.parse_args()
        paths = saved_runs(args.seeds, args.runs)
        if not paths:
            parser.error(f"no saved runs of seeds {min(args.seeds)}-{max(args.seeds)} under {args.runs}")
        rows = self.margins([WatchedRun.from_dict(json.loads(p.read_text())) for p in paths])
        if not rows:
            parser.error(f"no control watched by {self.monitor} among the saved runs of those seeds")
        print(self.markdown(rows))
        print()
        print(summary(rows))
