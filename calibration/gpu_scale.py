"""Does the risk hold on models larger than any it was fitted on? The GPU-sized runs as a test.

The runs of grids/gpu-scale.yaml (A) and grids/gpu-scale-b.yaml (B), width 512-1024 and 12-24
blocks, were probed on a GPU (`make calibration-gpu`); every CPU-made calibration run is at most
256 wide and 12 deep. Three held-out tests, each AUROC with a group-bootstrap 95% CI (architectures
resampled), the binned ECE and the ECE a perfectly calibrated model would score on the same
predictions (median, 95th percentile):

1. the CPU-fitted model (the calibration's runs.parquet and scale-runs.parquet, the shipped
   feature set): scored on A and B, which nothing was chosen on; beside it, the lr alone;
2. the same model fitted with A as well, scored on the points of B that are not in A, and on
   B's architectures that are not in A;
3. a candidate form written down before these runs existed (README: a depth slope per
   normalisation family), fitted on the CPU runs alone, scored on A and B; it passed, and is
   the shipped form since (``SHIPPED``); the form before it is ``PREVIOUS``.

    python calibration/gpu_scale.py        (seconds; no GPU needed, the runs are tracked)

Writes calibration/gpu-scale.json and prints Markdown.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from rksp_cli.files import atomic_path
from rksp_cli.risk.calibration import read_runs
from rksp_cli.risk.estimator import DivergenceModel
from rksp_cli.risk.evaluation import auroc, calibrated_ece, ece, group_bootstrap_ci
from rksp_cli.risk.features import FEATURE_SETS, SHIPPED, architecture_groups

HERE = Path(__file__).parent
CPU_RUNS = [HERE / "runs.parquet", HERE / "scale-runs.parquet"]
A, B = HERE / "gpu-scale-runs.parquet", HERE / "gpu-scale-b-runs.parquet"


def scores(model: DivergenceModel | None, frame: pd.DataFrame) -> dict:
    """The model's held-out figures on ``frame`` (the lr alone when ``model`` is None)."""
    y = frame["label"].to_numpy(int)
    groups = architecture_groups(frame).to_numpy()
    if model is None:
        p = np.log10(frame["config.training.lr"].to_numpy(float))
        return {"n": len(y), "auroc": auroc(y, p), "auroc_ci95": list(group_bootstrap_ci(y, p, groups))}
    p = model.predict_proba(frame)[:, 1]
    return {
        "n": len(y), "diverged": int(y.sum()), "auroc": auroc(y, p),
        "auroc_ci95": list(group_bootstrap_ci(y, p, groups)), "ece": ece(y, p),
        "ece_if_calibrated": list(calibrated_ece(p)),
    }  # fmt: skip


PREVIOUS = "hyperparameters + size + spectra"  # the shipped form when the GPU runs were made


def fit(frame: pd.DataFrame, features: tuple[str, ...] = FEATURE_SETS[PREVIOUS]) -> DivergenceModel:
    return DivergenceModel(features=features, n_bootstrap=0).fit(frame, frame["label"])


def main() -> None:
    cpu, a, b = read_runs(CPU_RUNS), read_runs([A]), read_runs([B])
    b_new = b[~b["key"].isin(a["key"])]  # B's points that A does not hold too
    both = pd.concat([a, b_new], ignore_index=True)
    b_new_arch = b[~architecture_groups(b).isin(set(architecture_groups(a)))]
    cpu_a = pd.concat([cpu, a], ignore_index=True)
    previous, with_a = fit(cpu), fit(cpu_a)
    depth_form, depth_with_a = fit(cpu, FEATURE_SETS[SHIPPED]), fit(cpu_a, FEATURE_SETS[SHIPPED])
    results = {
        "CPU fit on A": scores(previous, a),
        "CPU fit on B": scores(previous, b),
        "CPU fit on A and B": scores(previous, both),
        "lr alone on A and B": scores(None, both),
        "CPU + A fit on B's new points": scores(with_a, b_new),
        "CPU + A fit on B's new architectures": scores(with_a, b_new_arch),
        "depth per family, CPU fit, on A and B": scores(depth_form, both),
        "depth per family, CPU + A fit, on B's new points": scores(depth_with_a, b_new),
    }
    with atomic_path(HERE / "gpu-scale.json") as tmp:
        tmp.write_text(json.dumps(results, indent=1) + "\n")
    print("| fitted on -> scored on | runs | AUROC [95% CI] | ECE | ECE if calibrated (median, p95) |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        lo, hi = r["auroc_ci95"]
        floor = r.get("ece_if_calibrated")
        calibration = f"{r['ece']:.3f} | {floor[0]:.3f}, {floor[1]:.3f}" if floor else "- | -"
        print(f"| {name} | {r['n']} | {r['auroc']:.3f} [{lo:.3f}, {hi:.3f}] | {calibration} |")
    print(f"\nwrote {HERE / 'gpu-scale.json'}")


if __name__ == "__main__":
    main()
