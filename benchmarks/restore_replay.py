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

With ``--rule sublayer_ratio``, the same question of `sublayer_ratio`: its rule (``SublayerBurst``,
exact: it reads only the logged branch ratios) with its history kept across a restore, as up to
monitor code 853bd1602ceae5ca (``KEPT``), and rewound, its state brought back with the weights (the
rule as it was at the restored snapshot's step), as shipped since. Kept, a restore to a state in a
stretch of bursts that passed unalarmed against the unsettled history of a run's first checks
scores them again against a later, quieter one: held-out 458's twin was sent back to step 1000 six
times so (``monitors-heldout.md``, seeds 458-459). The table lists each twin whose rollbacks
rewinding changes, with the first change: a rollback it removes (the run would then have gone on as
its ``rollback-once`` twin, if saved, until that twin's next alarm rewound, replayed there too) or
one it adds.

Run: python benchmarks/restore_replay.py [--rule spectral_alignment|sublayer_ratio] [--runs DIR];
seconds, training nothing.
"""

from __future__ import annotations

import argparse
import json
import re
from functools import cache
from pathlib import Path

from matched_detectors import RUNS, activation_fed

from rksp_cli.monitors.spectral_alignment import SignCollapse
from rksp_cli.monitors.sublayer_ratio import FLOOR, SublayerBurst

# The monitor code under which `spectral_alignment` was not told of a restore (all saved twins up to 267).
UNTOLD = frozenset({"c55e6e62ca8c3122"})
# The monitor codes under which `sublayer_ratio` had no floor (the saved twins of 272-289), and those
# under which it kept its history across a restore (every saved twin up to 459).
NO_FLOOR = frozenset({"c55e6e62ca8c3122", "af00547685a45d60"})
KEPT = NO_FLOOR | {"cbb5ca55bcf26c06", "05deb6d05248a0e3", "853bd1602ceae5ca"}
RESTORED = re.compile(r"restored the state of step (\d+)")

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


def _check_exact(path: Path, run: dict, monitor: str, replayed: list[int]) -> None:
    """Refuse a twin whose replay, under the rule it ran with, does not give its saved alarms."""
    saved = {a["step"] for a in run["alerts"] if a["monitor"] == monitor and a["level"] == "alarm"}
    if replayed != sorted(saved):
        raise SystemExit(f"{path.name}: the replay does not give the saved alarms, so it is not exact")


def _once_twin(path: Path) -> dict | None:
    """The twin's ``rollback-once`` run (the first rollback only), if saved."""
    once = path.with_name(path.name.replace("-rollback.json", "-rollback-once.json"))
    return json.loads(once.read_text()) if once.exists() else None


def _name(run: dict) -> str:
    return f"{run['failure']} {run['kind']} {run['seed']}"


def restores(run: dict) -> dict[int, int]:
    """A guarded run's rollbacks: the check that acted, and the step whose state it restored."""
    return {
        a["step"]: int(m[1]) for a in run["actions"] if a["action"] == "rollback" and (m := RESTORED.match(a["what"]))
    }


def sublayer_alarms(run: dict, rewind: bool) -> list[int]:
    """The checks at which `sublayer_ratio`'s rule alarms on a saved guarded run, its history kept
    across each restore (as up to 853bd1602ceae5ca) or rewound to the restored snapshot's step
    (``rewind``, as shipped since)."""
    layers = sorted(
        {k.split("/", 1)[1] for check in run["series"] for k in check["metrics"] if k.startswith("sublayer_ratio/")}
    )
    floor = 0.0 if run.get("monitor_code") in NO_FLOOR else FLOOR
    rule, steps, states, back = SublayerBurst(layers, floor=floor), [], {}, restores(run)
    for check in run["series"]:
        if rule.rescore([(check["step"], check["metrics"])]):
            steps.append(check["step"])
        if rewind and check["step"] in back.values():  # as a guard's snapshot taken at this check holds it
            states[check["step"]] = rule.snapshot()
        if rewind and check["step"] in back:
            rule.restore(states[back[check["step"]]])
    return steps


def first_change(run: dict, kept: list[int], rewound: list[int]) -> tuple[str, int] | None:
    """Where rewinding first changes what the guard did: ("removes", step), a rollback whose every
    alarm it removes, or ("adds", step), a check it alarms at where the run did not act; None where
    it changes nothing. The replay is exact up to there."""
    acted = {a["step"]: a["by"] for a in run["actions"] if a["action"] == "rollback"}
    for step in sorted(acted.keys() | set(rewound)):
        if step in acted and acted[step] == ["sublayer_ratio"] and step not in rewound:
            return "removes", step
        if step not in acted and step in rewound and step not in kept:
            return "adds", step
    return None


def _alignment_table(twins: list[Path]) -> None:
    print("| run | rolled back at | `spectral_alignment` alarms: untold / told | once-twin, told |")
    print("|---|---|---|---|")
    changed = 0
    for path in twins:
        run = json.loads(path.read_text())
        fed = _fed(run["failure"], run["kind"])
        untold, told = alarms(run, False, fed), alarms(run, True, fed)
        _check_exact(path, run, "spectral_alignment", untold if run.get("monitor_code") in UNTOLD else told)
        if untold == told:
            continue
        changed += 1
        once = _once_twin(path)
        after = "not saved" if once is None else _listed(alarms(once, True, fed))
        acted = _listed([a["step"] for a in run["actions"] if a["action"] == "rollback"])
        print(f"| {_name(run)} | {acted} | {_listed(untold)} / {_listed(told)} | {after} |")
    print(f"\n{len(twins)} rollback twins; changed by telling the rule of restores: {changed}")


def _sublayer_table(twins: list[Path]) -> None:
    print(
        "| run | rolled back at | `sublayer_ratio` alarms after the first restore: kept / rewound "
        "| first change | once-twin, rewound |"
    )
    print("|---|---|---|---|---|")
    changed = 0
    for path in twins:
        run = json.loads(path.read_text())
        kept, rewound = sublayer_alarms(run, False), sublayer_alarms(run, True)
        _check_exact(path, run, "sublayer_ratio", kept if run.get("monitor_code") in KEPT else rewound)
        if (change := first_change(run, kept, rewound)) is None:
            continue
        changed += 1
        acted = sorted(restores(run))
        after = "-"  # past an added rollback, or a removed later one, the twin that ran is no guide
        if change[0] == "removes" and change[1] == acted[1]:  # the run goes on as its rollback-once twin
            once = _once_twin(path)
            after = "not saved" if once is None else _listed([s for s in sublayer_alarms(once, True) if s > acted[0]])
        later = (_listed([s for s in alarms if s > acted[0]]) for alarms in (kept, rewound))
        print(f"| {_name(run)} | {_listed(acted)} | {' / '.join(later)} | {' '.join(map(str, change))} | {after} |")
    print(f"\n{len(twins)} rollback twins; changed by rewinding the rule with the weights: {changed}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=RUNS, help="where benchmarks/monitors.py saved the runs")
    parser.add_argument("--rule", choices=("spectral_alignment", "sublayer_ratio"), default="spectral_alignment")
    args = parser.parse_args(argv)
    twins = sorted(args.runs.glob("*-rollback.json"))
    if not twins:
        raise SystemExit(f"no saved rollback twins (*-rollback.json) in {args.runs}")
    (_sublayer_table if args.rule == "sublayer_ratio" else _alignment_table)(twins)


if __name__ == "__main__":
    main()
