"""What each saved run of a held-out set did, in the terms its write-up uses (issue 16).

``benchmarks/monitors-heldout.md`` tells every set run by run: when a run failed, the gradient-norm
surges it threw on the way, which rksp monitor alarmed first and why, what each monitor cost, what a
guarded twin did, and, for a failure no monitor alarmed on, how quiet its signals were. This prints
those facts from the saved runs, so that the record quotes a command rather than a reading by hand.

- A surge is a step whose gradient norm passes ``SURGE`` (or is not finite); steps within ``GAP`` of
  each other are one surge, written as its largest norm and its steps: "220 at 4674-4706".
- The best loss is the lowest trailing ``WINDOW``-step mean, the one the failure label reads.
- A guarded twin is judged on how it ended (``ended_failed``): one that a rollback sent back to an
  early state and that learned again is not a failure, though its loss passed the failure line.
- A monitor's cost is its mean seconds a check over ``DEFAULT_EVERY`` training steps' seconds.
- A run that failed with no rksp alarm before it gets a quiet line: the largest robust z, |value -
  median| / (``MAD_TO_SIGMA`` MAD), of any signal its monitors recorded at its last check before the
  failure, against the ``HISTORY`` checks before that one. Only alarms are saved, so this is how near the
  signals came, not whether a warning fired. A signal whose history is flat (a MAD of 0, such as a
  sign entropy pinned at 0 bit) has no robust scale and is left out rather than scored infinite.

Run: python benchmarks/run_story.py --seeds 386-387 [--runs DIR]; seconds, training nothing.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import textwrap
from pathlib import Path

from matched_detectors import saved_runs_parser
from monitors import acted_steps

from rksp_cli.monitors.base import MAD_TO_SIGMA
from rksp_cli.monitors.failures import DEFAULT_EVERY, WINDOW, WatchedRun

SURGE = 20.0  # the gradient norm the record calls a surge
GAP = 60  # surging steps closer than this are one surge
HISTORY = 20  # checks a quiet line scores the last check against
WIDTH = 80  # the output is read in CI logs
SAVED = re.compile(r"[a-z_0-9]+-[a-z_]+-(?P<seed>\d+)(-[a-z0-9_-]+)?\.json")  # a run, a twin, a retrain


def surges(grad_norms: list[float], threshold: float = SURGE, gap: int = GAP) -> list[tuple[int, int, float]]:
    """(first step, last step, largest norm) of each surge; a non-finite norm counts as infinite."""
    found: list[list[float]] = []
    for step, norm in enumerate(grad_norms):
        norm = norm if math.isfinite(norm) else math.inf
        if norm <= threshold:
            continue
        if found and step - found[-1][1] <= gap:
            found[-1][1], found[-1][2] = step, max(found[-1][2], norm)
        else:
            found.append([step, step, norm])
    return [(int(a), int(b), top) for a, b, top in found]


def best_mean(losses: list[float], window: int = WINDOW) -> float | None:
    """The lowest trailing ``window``-step mean loss; None for a run shorter than the window."""
    if len(losses) < window:
        return None
    means = (statistics.fmean(losses[t - window : t]) for t in range(window, len(losses) + 1))
    return min((m for m in means if math.isfinite(m)), default=None)


def quiet(run: WatchedRun, before: int, history: int = HISTORY) -> tuple[float, str, int] | None:
    """(largest robust z, its signal, the check's step) at the last check at or before ``before``,
    scored against the ``history`` checks before it, flat histories left out; None with too few checks
    or no signal to score."""
    checks = [c for c in run.series if c["step"] <= before]
    if len(checks) < 6:
        return None
    last, past = checks[-1], checks[-history - 1 : -1]
    loudest: tuple[float, str, int] | None = None
    for key, value in last["metrics"].items():
        values = [c["metrics"][key] for c in past if isinstance(c["metrics"].get(key), (int, float))]
        if len(values) < 5 or not isinstance(value, (int, float)):
            continue
        median = statistics.median(values)
        spread = MAD_TO_SIGMA * statistics.median(abs(v - median) for v in values)
        if spread == 0:
            continue  # no scale to score against (see the module docstring)
        z = abs(value - median) / spread
        if loudest is None or z > loudest[0]:
            loudest = (z, key, last["step"])
    return loudest


def _surge_text(found: list[tuple[int, int, float]]) -> str:
    return ", ".join(f"{top:.0f} at {a}" + (f"-{b}" if b > a else "") for a, b, top in found) or "none"


def story(run: WatchedRun) -> list[str]:
    """The run's lines: what happened, its surges, each monitor's first alarm, its costs."""
    failed = run.failed_step
    how = "exploded" if failed is not None and failed == run.exploded_step else "lost"
    outcome = f"failed at {failed} ({how})" if failed is not None else f"did not fail by {len(run.losses)}"
    if run.policy and failed is not None and not run.ended_failed:
        # a twin is judged on how it ended: a restore to an early state sends its loss back up on the way
        before = [step for step in acted_steps(run) if step <= failed]  # an ignored alarm is not an act
        after = f", after acting at {before[-1]}" if before else ""
        outcome = f"did not end failed by {len(run.losses)} (passed the failure line at {failed}{after})"
        failed = None
    best = best_mean(run.losses)
    name = f"{run.failure} {run.kind} {run.seed}" + (f" ({run.policy})" if run.policy else "")
    losses = [f"final {run.final_loss:.2f}"] if math.isfinite(run.final_loss) else []
    losses += [f"best {best:.2f}"] if best is not None else []
    lines = [f"{name}: {'; '.join([outcome, *losses])}"]
    lines.append(f"surges over {SURGE:g}: {_surge_text(surges(run.grad_norms))}")
    for action in run.actions:
        lines.append(f"acted at {action['step']}: {action['action']}, {action['what']} ({', '.join(action['by'])})")
    alarms = sorted((a for a in run.alerts if a.level == "alarm"), key=lambda a: a.step)
    firsts = {a.monitor: a for a in reversed(alarms)}  # each monitor's earliest alarm
    for alert in sorted(firsts.values(), key=lambda a: a.step):
        others = sum(a.monitor == alert.monitor and a.step == alert.step for a in alarms) - 1  # same check
        where = "the model" if alert.layer is None else alert.layer + (f" and {others} more" if others else "")
        lines.append(f"first {alert.monitor} alarm at {alert.step} on {where}: {alert.reason}")
    if failed is not None and not any(a.step <= failed for a in alarms):
        loud = quiet(run, failed)
        lines.append(
            "no rksp alarm before the failure"
            + (f"; at its last check ({loud[2]}) no signal past {loud[0]:.1f} robust sd ({loud[1]})" if loud else "")
        )
    if run.step_seconds > 0 and run.check_seconds:
        costs = {m: 100 * s / (DEFAULT_EVERY * run.step_seconds) for m, s in run.check_seconds.items()}
        lines.append("cost a step: " + ", ".join(f"{m} {c:.2f}%" for m, c in costs.items()))
    return lines


def runs_of(seeds: set[int], folder: Path) -> list[WatchedRun]:
    """The saved watched runs of ``seeds``, guarded twins included (a run retrained past its horizon,
    saved without checks, is not one)."""
    runs = []
    for path in sorted(folder.glob("*.json")):
        if not ((name := SAVED.fullmatch(path.name)) and int(name["seed"]) in seeds):
            continue
        data = json.loads(path.read_text())
        if "alerts" in data:  # a retrain past the horizon saves no checks
            runs.append(WatchedRun.from_dict(data))
    return runs


def main() -> None:
    parser = saved_runs_parser(__doc__)
    args = parser.parse_args()
    runs = runs_of(args.seeds, args.runs)
    if not runs:
        parser.error(f"no saved runs of seeds {min(args.seeds)}-{max(args.seeds)} under {args.runs}")
    for run in runs:
        head, *rest = story(run)
        print(textwrap.fill(head, WIDTH, subsequent_indent="    "))
        for line in rest:
            print(textwrap.fill(line, WIDTH, initial_indent="  ", subsequent_indent="    "))
        print()


if __name__ == "__main__":
    main()
