"""Does `spectral_alignment` set off fewer rollbacks now that a restore resets it? (issue 16)

A guard's rollback sets the weights back, and the monitors are told (``restored()``). Up to monitor
code c55e6e62ca8c3122, that one included, `spectral_alignment` was not: its alarm asks for 3
collapsed checks in a row and for sigma_1's log increments to be abnormal against the layer's last 20
checks, so after a restore it scored a streak that spanned the restore, the fall of sigma_1 across
it, and the replayed early steps against a late-training history. On the saved rollback twins of
222-263 that set off every later rollback of the two runs sent back to step 0 again and again (257,
262). Two candidates were replayed there; ``SignCollapse.restored()`` ships the one judged on the
twins of 264-267 (``rebuild``: streaks, the increment across the restore and the increment histories
start again). The other, ``keep`` (histories kept), alarmed again on 257's ``rollback-once`` twin and
was not taken.

This replays the rule (``SignCollapse``, exact: it reads only the logged sign entropies and sigma_1)
on every saved rollback twin, untold and told of its restores, and refuses a twin whose replay as it
was run does not give its saved alarms. The replay is exact up to a twin's first changed alarm: until
then the guard acts as it did. Where the told rule removes an alarm that acted, the run would have gone
on as its ``rollback-once`` twin (if saved) until that twin's next alarm, so the told rule is replayed
on that twin too.

Run: python benchmarks/restore_replay.py [--runs DIR]; seconds, training nothing.
"""

from __future__ import annotations

import argparse
import json
from functools import cache
from pathlib import Path

from matched_detectors import RUNS, activation_fed

from rksp_cli.monitors.spectral_alignment import SignCollapse

# The monitor code under which `spectral_alignment` was not told of a restore (all saved twins up to 267).
UNTOLD = frozenset({"c55e6e62ca8c3122"})

_fed = cache(activation_fed)  # one model built per failure and kind


def alarms(run: dict, told: bool, fed: frozenset[str]) -> list[int]:
    """The checks at which the rule alarms on a saved guarded run, told of its restores or not."""
    restores = {a["step"] for a in run["actions"] if a["action"] == "rollback"}
    rule, steps = SignCollapse(set(fed)), []
    for check in run["series"]:
        if any(a.level == "alarm" for a in rule.rescore([(check["step"], check["metrics"])])):
            steps.append(check["step"])
        if told and check["step"] in restores:
            rule.restored()
    return steps


def _listed(steps: list[int]) -> str:
    return ", ".join(map(str, steps)) or "none"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=RUNS, help="where benchmarks/monitors.py saved the runs")
    args = parser.parse_args(argv)
    twins = sorted(args.runs.glob("*-rollback.json"))
    if not twins:
        raise SystemExit(f"no saved rollback twins (*-rollback.json) in {args.runs}")
    print("| run | rolled back at | `spectral_alignment` alarms: untold / told | once-twin, told |")
    print("|---|---|---|---|")
    changed = 0
    for path in twins:
        run = json.loads(path.read_text())
        fed = _fed(run["failure"], run["kind"])
        untold, told = alarms(run, False, fed), alarms(run, True, fed)
        saved = {a["step"] for a in run["alerts"] if a["monitor"] == "spectral_alignment" and a["level"] == "alarm"}
        if (untold if run.get("monitor_code") in UNTOLD else told) != sorted(saved):
            raise SystemExit(f"{path.name}: the replay does not give the saved alarms, so it is not exact")
        if untold == told:
            continue
        changed += 1
        once = path.with_name(path.name.replace("-rollback.json", "-rollback-once.json"))
        after = "not saved"
        if once.exists():
            after = _listed(alarms(json.loads(once.read_text()), True, fed))
        acted = _listed([a["step"] for a in run["actions"] if a["action"] == "rollback"])
        name = f"{run['failure']} {run['kind']} {run['seed']}"
        print(f"| {name} | {acted} | {_listed(untold)} / {_listed(told)} | {after} |")
    print(f"\n{len(twins)} rollback twins; changed by telling the rule of restores: {changed}")


if __name__ == "__main__":
    main()
