"""Calibration files: labelled runs in, a fitted model and its held-out report out, as plain JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from rksp_cli import __version__
from rksp_cli.errors import InputError
from rksp_cli.files import atomic_path
from rksp_cli.risk.features import FOLDS, architecture_groups
from rksp_cli.risk.scoring import FittedRisk
from rksp_cli.sweep import fill_added_later

if TYPE_CHECKING:
    from rksp_cli.risk.estimator import DivergenceModel

KIND = "rksp-divergence-model"
FORMAT = 2  # 2: the monotone model with bootstrap refits (issue 14); 1 was the lr-interaction model

# Training settings that, when every run shares them, bound the calibration: a config that differs
# lies outside it.
FIXED_SETTINGS = ("config.training.optimizer", "config.training.weight_decay", "config.training.grad_clip",
                  "config.training.batch_size", "config.training.betas", "config.model.n_experts",
                  "config.training.z_loss")  # fmt: skip


def read_runs(paths: list[Path], label: str = "label") -> pd.DataFrame:
    """Labelled rows from sweep outputs (Parquet or CSV), concatenated; failed points are dropped,
    and so are runs whose init the screen could not assess (``screen_error``: a forward pass that
    overflows at init): the screen never scores those, so they have no features to fit on."""
    frames = []
    for path in paths:
        if not path.is_file():
            raise InputError(f"{path}: no such file")
        try:
            frame = fill_added_later(pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path))
        except Exception as exc:
            raise InputError(f"{path}: cannot read runs ({type(exc).__name__})") from None
        for col in (label, "config.training.lr"):
            if col not in frame:
                hint = " (the stall label exists for runs probed since issue 14)" if label != "label" else ""
                raise InputError(f"{path}: no {col!r} column; produce runs with `rksp sweep --probe`{hint}")
        for failed in ("error", "screen_error"):
            if failed in frame:
                frame = frame[frame[failed].isna()]
        frames.append(frame.dropna(subset=[label]))
    frame = pd.concat(frames, ignore_index=True)
    where = ", ".join(map(str, paths))
    n_arch = architecture_groups(frame).nunique() if len(frame) else 0
    if n_arch < FOLDS:
        raise InputError(
            f"{where}: {len(frame)} labelled runs of {n_arch} architecture(s); the held-out evaluation groups "
            f"runs by architecture into {FOLDS} folds, so it needs at least {FOLDS}"
        )
    if frame[label].nunique() < 2:
        raise InputError(
            f"{where}: every run has {label} = {int(frame[label].iloc[0])}; a classifier needs runs that "
            "diverged and runs that did not"
        )
    return frame


def read_token_samples(path: Path, frame: pd.DataFrame) -> pd.DataFrame:
    """Each labelled run again per extra token sample of its init, with that sample's features.

    ``path`` holds ``key``, ``sample`` and ``feature.*`` columns (``calibration/token_samples.py``);
    every run that has samples must have the same number, so that every spread is measured alike.
    Runs without any (the GPU-sized runs, too costly to screen again on a CPU) are left out of the
    spread, which says on how many runs it was measured.
    """
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        samples = pd.read_parquet(path)
    except Exception as exc:
        raise InputError(f"{path}: cannot read token samples ({type(exc).__name__})") from None
    features = [c for c in samples.columns if c.startswith("feature.")]
    if "key" not in samples or "sample" not in samples or not features:
        raise InputError(f"{path}: expected key, sample and feature.* columns (calibration/token_samples.py)")
    counts = samples.groupby("key").size().reindex(frame["key"]).fillna(0).astype(int)
    if counts.max() == 0 or counts[counts > 0].nunique() != 1:
        short = int(((counts > 0) & (counts != counts.max())).sum())
        raise InputError(
            f"{path}: {short or len(frame)} of {len(frame)} labelled runs lack some token samples; "
            "rerun calibration/token_samples.py on these runs"
        )
    samples = samples[samples["key"].isin(frame["key"])]
    runs = frame.drop(columns=[c for c in frame.columns if c in features]).set_index("key", drop=False)
    replicates = runs.loc[samples["key"]].reset_index(drop=True)
    return pd.concat([replicates, samples[features].reset_index(drop=True)], axis=1)[frame.columns]


def fixed_settings(frame: pd.DataFrame) -> dict[str, Any]:
    """Training settings every run shares; a config that differs lies outside the calibration."""
    out = {}
    for col in FIXED_SETTINGS:
        if col in frame and frame[col].nunique(dropna=False) == 1:
            value = frame[col].iloc[0]
            out[col.removeprefix("config.")] = None if pd.isna(value) else value
    return out


@dataclass
class Calibration:
    """A fitted model, the settings its runs shared, its lr range and its held-out report."""

    path: Path
    model: FittedRisk  # scoring only: loading a calibration never imports scikit-learn
    fixed_settings: dict[str, Any]
    lr_range: tuple[float, float]
    report: dict[str, Any]


def save_calibration(path: Path, model: DivergenceModel, report: dict[str, Any], frame: pd.DataFrame) -> None:
    """Write the model and its held-out report as one JSON file, atomically."""
    payload = {
        "rksp_version": __version__,
        "kind": KIND,
        "format": FORMAT,
        "model": model.to_dict(),
        "fixed_settings": fixed_settings(frame),
        "lr_range": [float(frame["config.training.lr"].min()), float(frame["config.training.lr"].max())],
        "report": report,
    }
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(payload, indent=1, default=float))


def load_calibration(path: str | Path) -> Calibration:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such calibration file")
    try:
        data = json.loads(path.read_text())
        if data.get("kind") != KIND:
            raise ValueError("not an rksp calibration")
        if data.get("format") != FORMAT:
            found = data.get("format", 1)
            raise ValueError(f"format {found}; this rksp reads format {FORMAT}: refit with `rksp calibrate`")
        model = FittedRisk.from_dict(data["model"])
        lo, hi = data["lr_range"]
        return Calibration(path, model, data.get("fixed_settings", {}), (float(lo), float(hi)), data.get("report", {}))
    except (ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not a valid rksp calibration file ({exc.__class__.__name__}: {exc})") from None
