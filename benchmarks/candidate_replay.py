"""A stated candidate for the sub-layer burst rule, judged on held-out saved runs by exact replay
(issue 16).

A rule change found on the runs it would fix cannot be judged on them. So a candidate is stated in
benchmarks/monitors-log.md before the seeds that judge it are run. This script replays those seeds'
saved runs (benchmarks/results/monitors/) under a baseline rule and under the candidate, each a
minimum history of the sub-layer rule. It reports each control's `sublayer_ratio` alarm and each
failing run's first rksp alarm, lead and lead bar under both.

Replay is exact because the rule reads only each check's logged ratios (``SublayerBurst``). Raising
the minimum history leaves every history as it was and only withholds scores, so each alarm of the
longer rule is one of the shorter's. Every other monitor's alarms are today's
(``matched_detectors.monitor_alarms``). Seconds on one core.

Judged so far: on 2026-11-27, after Pre-LN controls 86 and 88 alarmed at step 700, 16 checks of
history for seeds 90 on against the 10 then shipped (``--baseline 10 --min-history 16``); shipped
after 90-95 (``MIN_HISTORY`` 16); the former rule replayed on 96-101 and 102-107, the first
seeds under the new one (``--baseline 16 --min-history 10``).
Run: python benchmarks/candidate_replay.py --seeds 90-95 --min-history N [--baseline N] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
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
from rksp_cli.monitors.failures import WatchedRun
from rksp_cli.monitors.sublayer_ratio import MIN_HISTORY

RULES = ("baseline", "candidate")


def replay(run: WatchedRun, min_history: int, baseline: int = MIN_HISTORY) -> dict[str, Any]:
    """One saved run with the sub-layer rule at the ``baseline`` and at the candidate's minimum history."""
    others = monitor_alarms(run)
    row: dict[str, Any] = {"failure": run.failure, "kind": run.kind, "seed": run.seed, "failed": run.failed_step}
    for rule, checks in zip(RULES, (baseline, min_history), strict=True):
        alarms = (
            others | {"sublayer_ratio": sublayer_ratio_alarm(run, checks)} if "sublayer_ratio" in others else others
        )
        first = first_of(alarms.values())
        ahead = lead(run.failed_step, first)
        row[rule] = {
            "sublayer_ratio": alarms.get("sublayer_ratio"), "rksp": first, "lead": ahead,
            "lead_bar_met": bar_met(ahead, run.failed_step),
        }  # fmt: skip
    return row


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Controls' alarms and failing runs' lead bars under both rules, and the failing runs whose
    first rksp alarm the candidate moves from the baseline's."""
    controls = [r for r in rows if r["kind"] != "failing"]
    failed = [r for r in rows if r["kind"] == "failing" and r["failed"] is not None]
    out: dict[str, Any] = {"controls": len(controls), "failed": len(failed)}
    for rule in RULES:
        out[rule] = {
            "sublayer_ratio_control_alarms": sum(r[rule]["sublayer_ratio"] is not None for r in controls),
            "rksp_control_alarms": sum(r[rule]["rksp"] is not None for r in controls),
            "lead_bar_met": sum(r[rule]["lead_bar_met"] for r in failed),
        }
    out["failing_runs_moved"] = [
        {"failure": r["failure"], "seed": r["seed"]} | {rule: r[rule]["rksp"] for rule in RULES}
        for r in rows
        if r["kind"] == "failing" and r["baseline"]["rksp"] != r["candidate"]["rksp"]
    ]
    return out


def _step(step: int | None) -> str:
    return "-" if step is None else str(step)


def markdown(rows: list[dict[str, Any]], baseline: int, candidate: int) -> str:
    """The runs with a `sublayer_ratio` alarm under the shorter minimum history: the only ones the
    other can change."""
    lines = [
        f"| run | failed at | sub-layer alarm: {baseline} / {candidate} checks | rksp's first alarm | lead bar |",
        "|---|---|---|---|---|",
    ]
    shorter = RULES[0] if baseline <= candidate else RULES[1]
    for r in rows:
        base, cand = r["baseline"], r["candidate"]
        if r[shorter]["sublayer_ratio"] is None:
            continue
        bars = "/".join("met" if x["lead_bar_met"] else "-" for x in (base, cand)) if r["failed"] else "-"
        lines.append(
            f"| {r['failure']} {r['kind']} {r['seed']} | {_step(r['failed'])} "
            f"| {_step(base['sublayer_ratio'])} / {_step(cand['sublayer_ratio'])} "
            f"| {_step(base['rksp'])} / {_step(cand['rksp'])} | {bars} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.splitlines()[:2]))
    parser.add_argument("--seeds", type=seed_range, required=True, help="the seeds judged (a range a-b)")
    parser.add_argument("--min-history", type=int, required=True, help="the candidate's checks before a score")
    parser.add_argument(
        "--baseline", type=int, default=MIN_HISTORY, help=f"the baseline's checks before a score ({MIN_HISTORY})"
    )
    parser.add_argument("--runs", type=Path, default=RUNS, help="folder of the saved runs")
    parser.add_argument("--out", type=Path, help="results JSON (default: results/monitors-candidate-SEEDS.json)")
    args = parser.parse_args()
    for flag, value in (("--min-history", args.min_history), ("--baseline", args.baseline)):
        if value < 1:
            parser.error(f"{flag} {value}: a rule needs at least 1 check of history")
    out = args.out or RUNS.parent / f"monitors-candidate-{min(args.seeds)}-{max(args.seeds)}.json"
    try:
        check_writable(out, "--out")
    except InputError as exc:
        parser.error(str(exc))
    paths = saved_runs(args.seeds, args.runs)
    if not paths:
        parser.error(f"no saved runs of seeds {min(args.seeds)}-{max(args.seeds)} under {args.runs}")
    runs = [WatchedRun.from_dict(json.loads(p.read_text())) for p in paths]
    rows = [replay(run, args.min_history, args.baseline) for run in runs]
    results = {
        "machine": cpu_model(),
        "seeds": sorted(args.seeds),
        "min_history": {"baseline": args.baseline, "candidate": args.min_history},
        "runs_by_monitor_code": dict(Counter(r.monitor_code for r in runs)),
        "summary": summary(rows),
        "rows": rows,
    }
    with atomic_path(out) as tmp:
        tmp.write_text(json.dumps(results, indent=1))
    print(markdown(rows, args.baseline, args.min_history))
    print(json.dumps(results["summary"], indent=1))


if __name__ == "__main__":
    main()
