"""Re-screen every labelled run with the current estimator; labels and training outcomes unchanged.

When the spectra's estimator changes, the risk model must be refitted on features measured the
new way, but the labels (200 training steps each, about 40 minutes for the 800 runs) do not
change: each run's init is rebuilt from its own config and seed and screened again. The estimator
fields of ``probe`` (``rank``, ``residual_tol``) take today's defaults; everything else is the
run's own config. Runs through the sweep machinery, so it is resumable (rerun after an
interruption) and uses 2 workers. About 2 minutes on 2 cores.

    python calibration/rescreen.py [calibration/runs.parquet]    (make rescreen)

Then ``make refit`` refits the shipped model on the updated runs.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from rksp_cli.files import atomic_path
from rksp_cli.spec import ProbeSpec, set_field, spec_from_dict
from rksp_cli.sweep import Point, run_sweep

ESTIMATOR_FIELDS = ("rank", "residual_tol")  # probe fields that choose the estimator: today's defaults
LIST_FIELDS = ("training.betas",)  # stored joined by commas (spec.flatten)


def run_config(row: pd.Series) -> dict[str, Any]:
    """The nested config of one labelled run, from its flat ``config.*`` columns."""
    raw: dict[str, Any] = {}
    for column, value in row.items():
        if not isinstance(column, str) or not column.startswith("config."):
            continue
        name = column.removeprefix("config.")
        if isinstance(value, float) and math.isnan(value):
            value = None
        if name in LIST_FIELDS and isinstance(value, str):
            value = [float(v) for v in value.split(",")]
        set_field(raw, name, value)
    for name in ESTIMATOR_FIELDS:
        raw["probe"][name] = ProbeSpec.model_fields[name].default
    return raw


def main() -> None:
    runs_path = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "runs.parquet")
    runs = pd.read_parquet(runs_path)
    points = []
    for _, row in runs.iterrows():
        spec = spec_from_dict(run_config(row), source=f"{runs_path} (run {row['key']})")
        points.append(Point(row["key"], spec.resolved()))
    work = runs_path.with_name(runs_path.stem + "-rescreen.parquet")
    print(f"re-screening {len(points)} runs into {work} (resumable)")
    screens = run_sweep(points, work, probe=False, workers=2).set_index("key")
    failed = screens["error"].notna().sum()
    if failed:
        raise SystemExit(f"{failed} runs failed to screen; see the error column of {work}")
    # the rebuilt configs equal the recorded ones, but for today's estimator fields and fields added
    # since (at the defaults the runs had, e.g. model.n_experts 0); the run's key and label stay
    screened = [c for c in screens.columns if c.startswith(("feature.", "config."))]
    updated = runs.drop(columns=[c for c in runs.columns if c.startswith(("feature.", "config."))]).set_index("key")
    updated = updated.join(screens[screened])
    with atomic_path(runs_path) as tmp:
        updated.reset_index().to_parquet(tmp, index=False)
    work.unlink()
    work.with_name(work.name + ".journal").unlink()
    print(f"updated the config and features of {len(updated)} runs in {runs_path}")


if __name__ == "__main__":
    main()
