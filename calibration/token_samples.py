"""Screen every labelled run's init on more token samples: the measurement noise the fit must see.

A screen reads one sample of N token states, so its features carry sampling noise, and a risk
model can amplify that noise into the predicted edge (issue 13: the edge moved 1.6x between token
samples of one d = 768 model while every mass stayed within 0.02). ``rksp calibrate
--token-samples`` reads these samples to report how far each feature set's held-out edge moves
between them, and ``tests/test_calibration_data.py`` re-measures from them which spectral means
are too noisy for products (``rksp_cli.risk.features.NOISY``). (Fitting on every sample of every
run was tried and not kept: README, "The risk number".)

Each distinct init (model, probe settings and seed) is screened once with ``--spread``'s extra
token samples (seed + k * 1000003, k = 1 .. K-1); every run of that init gets its rows. Resumable
(finished chunks are kept under calibration/token-samples.parts/), 2 workers, 1 thread each.
About 6 minutes on 2 cores for K = 4 (488 inits).

    python calibration/token_samples.py [K]    (make token-samples)
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from rksp_cli.files import atomic_path
from rksp_cli.spec import spec_from_dict

HERE = Path(__file__).parent
RUNS = (HERE / "runs.parquet", HERE / "scale-runs.parquet")
OUT = HERE / "token-samples.parquet"
PARTS = HERE / "token-samples.parts"
CHUNK = 20  # inits per saved part


def _init_id(config: dict[str, Any]) -> str:
    """What fixes a screen's weights and tokens: the model, the probe settings and the seed."""
    return json.dumps({"model": config["model"], "probe": config["probe"]}, sort_keys=True)


def _screen(config: dict[str, Any], samples: int) -> list[dict[str, float]]:
    import torch

    from rksp_cli.risk import RuleBasedRisk
    from rksp_cli.screen import screen

    torch.set_num_threads(1)
    spec = spec_from_dict(config, source="token samples")
    return screen(spec, RuleBasedRisk(), repeats=samples).samples[1:]


def _chunk(args: tuple[int, list[dict[str, Any]], int]) -> int:
    index, configs, samples = args
    rows = []
    for config in configs:
        for k, features in enumerate(_screen(config, samples), start=1):
            rows.append({"init": _init_id(config), "sample": k, **{f"feature.{n}": v for n, v in features.items()}})
    with atomic_path(PARTS / f"{index:04d}.parquet") as tmp:
        pd.DataFrame(rows).to_parquet(tmp, index=False)
    return index


def main() -> None:
    sys.path.insert(0, str(HERE))
    from rescreen import run_config

    samples = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    configs: dict[str, dict[str, Any]] = {}
    keys = []
    for path in RUNS:  # one file at a time: a column only the other file has is not this run's field
        for _, row in pd.read_parquet(path).iterrows():
            config = spec_from_dict(run_config(row), source=f"{path} (run {row['key']})").resolved()
            configs.setdefault(_init_id(config), config)
            keys.append((row["key"], _init_id(config)))
    inits = sorted(configs)
    starts = range(0, len(inits), CHUNK)
    chunks = [(i, [configs[x] for x in inits[s : s + CHUNK]], samples) for i, s in enumerate(starts)]
    PARTS.mkdir(exist_ok=True)
    todo = [c for c in chunks if not (PARTS / f"{c[0]:04d}.parquet").is_file()]
    print(f"{len(keys)} runs, {len(inits)} inits, {samples - 1} more token samples each; "
          f"{len(chunks) - len(todo)} of {len(chunks)} chunks already done")  # fmt: skip
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        for done, index in enumerate(pool.imap_unordered(_chunk, todo), start=1):
            print(f"chunk {index} done ({done}/{len(todo)})", flush=True)
    measured = pd.concat([pd.read_parquet(p) for p in sorted(PARTS.glob("*.parquet"))], ignore_index=True)
    per_run = pd.DataFrame(keys, columns=["key", "init"]).merge(measured, on="init").drop(columns="init")
    with atomic_path(OUT) as tmp:
        per_run.sort_values(["key", "sample"]).to_parquet(tmp, index=False)
    shutil.rmtree(PARTS)
    print(f"wrote {len(per_run)} rows ({per_run['key'].nunique()} runs x {samples - 1} samples) to {OUT}")


if __name__ == "__main__":
    main()
