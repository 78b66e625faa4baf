"""Whether a level of the largest attention logit separates failing deep Post-LN runs from healthy
controls at more than one width (issue 16), from saved runs.

At width 512 the largest logit of the three failing runs that learned (seeds 7-9) passed 75 before
they failed, and no low-lr control passed 60. A rule chosen on those runs cannot be judged on them,
and a level in logit units is only worth stating for fresh width-512 seeds if it also holds where
the monitors were built: width 128. For each level this counts, per width and kind, the runs whose
largest logit (``attn_logit_max``, every layer) reached it before the run failed (a control: in
its whole run), and for the failing runs how many reached it early enough for the lead bar.

Run: python benchmarks/logit_level.py [--levels 60,75,100] [--seeds 272-341] (every saved seed by
default); seconds, training nothing. `make runs-unpack` puts the saved runs in place, the width-512
ones in benchmarks/results/monitors-wide/.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from matched_detectors import RUNS, bar_met, saved_runs, seed_range

from rksp_cli.monitors.failures import WatchedRun

WIDE_RUNS = RUNS.parent / "monitors-wide"
KEY = "attn_logit_max"  # the largest logit over every layer at a check


def first_reached(run: WatchedRun, level: float) -> int | None:
    """The first check, before the run failed, at which its largest logit was ``level`` or more."""
    failed = run.failed_step
    for check in run.series:
        if failed is not None and check["step"] >= failed:
            return None
        if check["metrics"].get(KEY, 0.0) >= level:
            return check["step"]
    return None


def rows(runs: list[WatchedRun], levels: list[float]) -> list[str]:
    """One markdown row per kind of run and level."""
    out = []
    for kind in sorted({run.kind for run in runs}, key=lambda kind: (kind != "failing", kind)):
        counted = [run for run in runs if run.kind == kind and (run.failed_step is not None) == (kind == "failing")]
        for level in levels:
            reached = [(run, first_reached(run, level)) for run in counted]
            hits = sum(step is not None for _, step in reached)
            bar = "-"
            if kind == "failing":
                leads = [(run.failed_step - step, run.failed_step) for run, step in reached if step is not None]
                bar = str(sum(bar_met(lead, failed) for lead, failed in leads))
            out.append(f"| {runs[0].failure} | {kind} | {len(counted)} | {level:g} | {hits} | {bar} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="60,75,100", help="levels of the largest logit, comma-separated")
    parser.add_argument("--seeds", type=seed_range, default="0-99999", help="width-128 seeds (a range a-b)")
    args = parser.parse_args()
    levels = [float(level) for level in args.levels.split(",")]
    print("| failure | kind | runs counted | level | reached it | lead bar |")
    print("|---|---|---|---|---|---|")
    for folder, seeds, failure in (
        (RUNS, args.seeds, "post_ln_without_warmup"),
        (WIDE_RUNS, set(range(1000)), "post_ln_without_warmup_wide"),
    ):
        paths = [p for p in saved_runs(seeds, folder) if p.name.startswith(f"{failure}-")]
        if not paths:
            raise SystemExit(f"no saved {failure} runs in {folder}")
        print("\n".join(rows([WatchedRun.from_dict(json.loads(Path(p).read_text())) for p in paths], levels)))
    print("(runs counted: failing runs that failed; controls that did not fail themselves)")


if __name__ == "__main__":
    main()
