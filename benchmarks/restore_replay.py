"""Would `spectral_alignment` set off fewer rollbacks if a restore reset it? (issue 16)

A guard's rollback sets the weights back; `attention_entropy` is told (``restored()``) and
`spectral_alignment` is not. Its alarm asks for 3 collapsed checks in a row and for sigma_1's log
increments to be abnormal against the layer's last 20 checks, so after a restore it may score a
streak that spans the restore, the fall of sigma_1 across it, or the replayed early steps against a
late-training history. This replays the rule (``SignCollapse``, exact: it reads only the logged sign
entropies and sigma_1) on every saved rollback twin, as today and under two candidate ``restored()``:

* ``keep``: the streaks and the increment spanning the restore are dropped; the histories stay;
* ``rebuild``: as ``keep``, and the increment histories start again, as at a run's first check.

The replay is exact up to a twin's first changed alarm: until then the guard acts as it did. Where a
candidate removes an alarm that acted, the run would have gone on as its ``rollback-once`` twin (if
saved) until its next alarm; the candidate is replayed on that twin too, from its one restore on.

Run: python benchmarks/restore_replay.py [--runs DIR]; seconds, training nothing.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from functools import cache
from pathlib import Path

from matched_detectors import RUNS, activation_fed

from rksp_cli.monitors.spectral_alignment import SignCollapse


# The candidates are written here, not as ``SignCollapse.restored()``, so that the monitors' code, and
# with it the fingerprint of the held-out record, stays as it is until one is shipped.
def keep(rule: SignCollapse) -> None:
    """Forget the streaks and the increment that would span the restore; keep the histories."""
    rule.persistence.clear()
    rule._recent_z.clear()
    rule._log_sigma = dict.fromkeys(rule._log_sigma)  # no increment across the restore; not a first check


def rebuild(rule: SignCollapse) -> None:
    """As ``keep``, and start the increment histories again: no score for their first 10 checks."""
    keep(rule)
    rule._growth.clear()


_fed = cache(activation_fed)  # one model built per failure and kind

CANDIDATES: dict[str, Callable[[SignCollapse], None] | None] = {"today": None, "keep": keep, "rebuild": rebuild}


def alarms(run: dict, on_restore: Callable[[SignCollapse], None] | None, fed: frozenset[str]) -> list[int]:
    """The checks at which the rule alarms on a saved guarded run, told of its restores or not."""
    restores = {a["step"] for a in run["actions"] if a["action"] == "rollback"}
    rule, steps = SignCollapse(set(fed)), []
    for check in run["series"]:
        if any(a.level == "alarm" for a in rule.rescore([(check["step"], check["metrics"])])):
            steps.append(check["step"])
        if on_restore is not None and check["step"] in restores:
            on_restore(rule)
    return steps


def _listed(steps: list[int]) -> str:
    return ", ".join(map(str, steps)) or "none"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=RUNS, help="where benchmarks/monitors.py saved the runs")
    args = parser.parse_args(argv)
    twins = sorted(args.runs.glob("*-rollback.json"))
    if not twins:
        raise SystemExit(f"no saved rollback twins (*-rollback.json) in {args.runs}")
    print("| run | rolled back at | `spectral_alignment` alarms: today / keep / rebuild | once-twin: keep / rebuild |")
    print("|---|---|---|---|")
    changed = dict.fromkeys(CANDIDATES, 0)
    for path in twins:
        run = json.loads(path.read_text())
        fed = _fed(run["failure"], run["kind"])
        got = {name: alarms(run, on_restore, fed) for name, on_restore in CANDIDATES.items()}
        saved = {a["step"] for a in run["alerts"] if a["monitor"] == "spectral_alignment" and a["level"] == "alarm"}
        if got["today"] != sorted(saved):
            raise SystemExit(f"{path.name}: the replay does not give the saved alarms, so it is not exact")
        for name in CANDIDATES:
            changed[name] += got[name] != got["today"]
        if got["keep"] == got["today"] == got["rebuild"]:
            continue
        once = path.with_name(path.name.replace("-rollback.json", "-rollback-once.json"))
        after = "not saved"
        if once.exists():
            twin = json.loads(once.read_text())
            after = " / ".join(_listed(alarms(twin, CANDIDATES[c], fed)) for c in ("keep", "rebuild"))
        acted = _listed([a["step"] for a in run["actions"] if a["action"] == "rollback"])
        replayed = " / ".join(_listed(got[c]) for c in CANDIDATES)
        print(f"| {run['failure']} {run['kind']} {run['seed']} | {acted} | {replayed} | {after} |")
    print(f"\n{len(twins)} rollback twins; changed: keep {changed['keep']}, rebuild {changed['rebuild']}")


if __name__ == "__main__":
    main()
