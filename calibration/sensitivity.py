"""Add Admin's output sensitivity at init to labelled runs probed before probes recorded it.

Every probe records ``baseline.update_sensitivity`` since issue 14 (``probe.update_sensitivity``:
the RMS change of the logits per unit lr of a first Adam step). For runs made before, each run's
init is rebuilt from its own config and seed (the weights are those its probe trained) and the
same function is applied; the labels are unchanged. About 3 minutes for the 920 runs on 2 cores.

    python calibration/sensitivity.py calibration/runs.parquet [more.parquet ...]

Then ``make refit`` reports it as a candidate feature beside the spectra.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import torch
from rescreen import run_config

from rksp_cli.files import atomic_path
from rksp_cli.models import build_subject
from rksp_cli.probe import update_sensitivity
from rksp_cli.spec import spec_from_dict
from rksp_cli.tasks import make_task

COLUMN = "baseline.update_sensitivity"


def backfill(path: Path) -> None:
    runs = pd.read_parquet(path)
    todo = runs.index if COLUMN not in runs else runs.index[runs[COLUMN].isna()]
    values = {}
    for n, i in enumerate(todo):
        spec = spec_from_dict(run_config(runs.loc[i]), source=f"{path} (run {runs.at[i, 'key']})")
        subject = build_subject(spec.model, spec.probe.seed)
        task = make_task(spec.training.task, subject.vocab_size, subject.seq_len)
        values[i] = update_sensitivity(subject.module, task, spec.probe.seed)
        if n % 100 == 0:
            print(f"{path}: {n}/{len(todo)}", flush=True)
    runs[COLUMN] = runs.get(COLUMN, pd.Series(float("nan"), index=runs.index)).astype(float)
    runs.loc[list(values), COLUMN] = list(values.values())
    with atomic_path(path) as tmp:
        runs.to_parquet(tmp, index=False)
    print(f"{path}: {len(values)} runs given {COLUMN}")


if __name__ == "__main__":
    torch.set_num_threads(2)
    for arg in sys.argv[1:] or ["calibration/runs.parquet", "calibration/scale-runs.parquet"]:
        backfill(Path(arg))
