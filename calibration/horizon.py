"""What the 200-step label misses: the 1000-step runs of grids/horizon.yaml, and the shipped risk on them.

Every probe stops at its first diverged step and records it, so a 1000-step run also says whether
a 200-step probe would have labelled it: diverged at a step < 200. This script counts the
divergences that came later, the runs that stalled (mean loss of the last 20 steps no lower than
the first), and scores the shipped risk model against the 1000-step label and against the
200-step one on the same runs (AUROC with a group-bootstrap 95% CI, ECE).

    python calibration/horizon.py [calibration/horizon-runs.parquet]    (make horizon)

Writes calibration/horizon.json and prints Markdown. Seconds, once the runs exist.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from rksp_cli.files import atomic_path
from rksp_cli.risk import DEFAULT_CALIBRATION
from rksp_cli.risk.calibration import load_calibration, read_runs
from rksp_cli.risk.evaluation import auroc, ece, group_bootstrap_ci
from rksp_cli.risk.features import architecture_groups

SHORT = 200  # the calibration's horizon


def main(path: Path) -> None:
    frame = read_runs([path])
    model = load_calibration(DEFAULT_CALIBRATION).model
    p = model.predict_proba(frame)[:, 1]
    groups = architecture_groups(frame).to_numpy()
    long = frame["label"].to_numpy(int)
    short = (frame["diverged_step"].fillna(np.inf) < SHORT).to_numpy(int)
    stalled = frame["label_stall"].to_numpy(int)
    late = int(long.sum() - short.sum())
    result = {
        "runs": len(frame),
        "steps": int(frame["config.training.steps"].iloc[0]),
        "diverged": int(long.sum()),
        "diverged_before_200": int(short.sum()),
        "diverged_after_200": late,
        "stalled": int(stalled.sum()),
        "diverged_step_median": float(frame["diverged_step"].median()),
    }
    for name, y in (("long", long), ("short", short), ("long_or_stalled", np.maximum(long, stalled))):
        if len(np.unique(y)) == 2:
            result[f"auroc_{name}"] = auroc(y, p)
            result[f"auroc_{name}_ci95"] = list(group_bootstrap_ci(y, p, groups))
            result[f"ece_{name}"] = ece(y, p)
    out = path.with_name("horizon.json")
    with atomic_path(out) as tmp:
        tmp.write_text(json.dumps(result, indent=1))
    print(
        f"{result['runs']} runs of {result['steps']} steps: {result['diverged']} diverged, {late} of them after "
        f"step {SHORT} (a {SHORT}-step probe would have called them stable); {result['stalled']} stalled."
    )
    print("\n| shipped risk against | AUROC [95% CI] | ECE |\n|---|---|---|")
    for name, what in (("short", f"the {SHORT}-step label"), ("long", f"the {result['steps']}-step label"),
                       ("long_or_stalled", f"the {result['steps']}-step label or a stall")):  # fmt: skip
        if f"auroc_{name}" in result:
            lo, hi = result[f"auroc_{name}_ci95"]
            print(f"| {what} | {result[f'auroc_{name}']:.3f} [{lo:.3f}, {hi:.3f}] | {result[f'ece_{name}']:.3f} |")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "calibration/horizon-runs.parquet"))
