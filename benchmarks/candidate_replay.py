"""A stated candidate for the sub-layer burst rule, judged on held-out saved runs by exact replay
(issue 16).

A rule change found on the runs it would fix cannot be judged on them. So a candidate is stated in
benchmarks/monitors-log.md before the seeds that judge it are run. This script replays those seeds'
saved runs (benchmarks/results/monitors/) under today's rule and under the candidate. It reports
each control's `sublayer_ratio` alarm and each failing run's first rksp alarm, lead and lead bar
under both.

The candidate stated on 2026-11-27, for seeds 90 on, after Pre-LN controls 86 and 88 alarmed at
step 700: no sub-layer score before 16 checks of history (``MIN_HISTORY`` 10 -> 16). Replay is exact
because the rule reads only each check's logged ratios (``SublayerBurst``). Raising the minimum
history leaves every history as it was and only withholds scores, so each candidate alarm is one of
today's. Every other monitor's alarms are today's (``matched_detectors.monitor_alarms``).
Seconds on one core.
Run: python benchmarks/candidate_replay.py --seeds 90-95 [--min-history 16] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from machine import cpu_model
from matched_detectors import (
    RUNS,
    bar_met,
    first_of,
    lead,
    monitor_alarms,
    saved_runs,
    seed_range,
    sublayer_ratio_alarm,
)

from rksp_cli.errors import InputError
from rksp_cli.files import atomic_path, check_writable
from rksp_cli.monitors.failures import WatchedRun, monitor_code
from rksp_cli.monitors.sublayer_ratio import MIN_HISTORY

CANDIDATE = 16  # the minimum history stated for seeds 90 on


def replay(run: WatchedRun, min_history: int) -> dict[str, Any]:
    """One saved run under today's rules and under the candidate."""
    today = monitor_alarms(run)
    row: dict[str, Any] = {"failure": run.failure, "kind": run.kind, "seed": run.seed, "failed": run.failed_step}
    candidate = (
        today | {"sublayer_ratio": sublayer_ratio_alarm(run, min_history)} if "sublayer_ratio" in today else today
    )
    for rule, alarms in (("today", today), ("candidate", candidate)):
        first = first_of(alarms.values())
        ahead = lead(run.failed_step, first)
        row[rule] = {
            "sublayer_ratio": alarms.get("sublayer_ratio"), "rksp": first, "lead": ahead,
            "lead_bar_met": bar_met(ahead, run.failed_step),
        }  # fmt: skip
    return row


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Controls' alarms and failing runs' lead bars under both rules, and the failing runs whose
    first rksp alarm the candidate moves."""
    controls = [r for r in rows if r["kind"] != "failing"]
    failed = [r for r in rows if r["kind"] == "failing" and r["failed"] is not None]
    out: dict[str, Any] = {"controls": len(controls), "failed": len(failed)}
    for rule in ("today", "candidate"):
        out[rule] = {
            "sublayer_ratio_control_alarms": sum(r[rule]["sublayer_ratio"] is not None for r in controls),
            "rksp_control_alarms": sum(r[rule]["rksp"] is not None for r in controls),
            "lead_bar_met": sum(r[rule]["lead_bar_met"] for r in failed),
        }
    out["failing_runs_moved"] = [
        {"failure": r["failure"], "seed": r["seed"], "today": r["today"]["rksp"], "candidate": r["candidate"]["rksp"]}
        for r in rows
        if r["kind"] == "failing" and r["today"]["rksp"] != r["candidate"]["rksp"]
    ]
    return out


def _step(step: int | None) -> str:
    return "-" if step is None else str(step)


def markdown(rows: list[dict[str, Any]], min_history: int = CANDIDATE) -> str:
    """The runs with a `sublayer_ratio` alarm under today's rule: the only ones the candidate can change."""
    lines = [
        f"| run | failed at | sub-layer alarm: {MIN_HISTORY} / {min_history} checks | rksp's first alarm | lead bar |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        today, cand = r["today"], r["candidate"]
        if today["sublayer_ratio"] is None:
            continue
        bars = "/".join("met" if x["lead_bar_met"] else "-" for x in (today, cand)) if r["failed"] else "-"
        lines.append(
            f"| {r['failure']} {r['kind']} {r['seed']} | {_step(r['failed'])} "
            f"| {_step(today['sublayer_ratio'])} / {_step(cand['sublayer_ratio'])} "
            f"| {_step(today['rksp'])} / {_step(cand['rksp'])} | {bars} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.splitlines()[:2]))
    parser.add_argument("--seeds", type=seed_range, required=True, help="the seeds judged (a range a-b)")
    parser.add_argument("--min-history", type=int, default=CANDIDATE, help="the candidate's checks before a score")
    parser.add_argument("--runs", type=Path, default=RUNS, help="folder of the saved runs")
    parser.add_argument("--out", type=Path, help="results JSON (default: results/monitors-candidate-SEEDS.json)")
    args = parser.parse_args()
    if args.min_history < 1:
        parser.error(f"--min-history {args.min_history}: a rule needs at least 1 check of history")
    out = args.out or RUNS.parent / f"monitors-candidate-{min(args.seeds)}-{max(args.seeds)}.json"
    try:
        check_writable(out, "--out")
    except InputError as exc:
        parser.error(str(exc))
    paths = saved_runs(args.seeds, args.runs)
    if not paths:
        parser.error(f"no saved runs of seeds {min(args.seeds)}-{max(args.seeds)} under {args.runs}")
    runs = [WatchedRun.from_dict(json.loads(p.read_text())) for p in paths]
    today = monitor_code()
    rows = [replay(run, args.min_history) for run in runs]
    results = {
        "machine": cpu_model(),
        "seeds": sorted(args.seeds),
        "min_history": {"today": MIN_HISTORY, "candidate": args.min_history},
        "runs_watched_under_today_s_code": f"{sum(r.monitor_code == today for r in runs)} of {len(runs)}",
        "summary": summary(rows),
        "rows": rows,
    }
    with atomic_path(out) as tmp:
        tmp.write_text(json.dumps(results, indent=1))
    print(markdown(rows, args.min_history))
    print(json.dumps(results["summary"], indent=1))


if __name__ == "__main__":
    main()
