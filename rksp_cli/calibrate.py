"""Fit and check a calibrated divergence model on labelled probe runs.

``DivergenceModel`` is a scikit-learn-style estimator (``fit`` / ``predict_proba``) for
P(diverged | spectral features, training hyperparameters, model size). Its design choices:

* **Linear in engineered features, plus learning-rate interactions.** log10(lr) enters alone and
  multiplied by the main spectral and size features, so each family gets its own LR slope and
  stability edge. A linear model serialises to plain JSON (no pickle: a calibration file is data,
  never code) and is evaluated here with numpy alone.
* **Calibration on grouped out-of-fold scores.** The logistic score is mapped to a probability by
  Platt scaling (``sigmoid``) or isotonic regression fitted on out-of-fold scores, with folds
  grouped by configuration so seeds of one configuration never straddle a fold.
* **No architecture labels by default.** A transformers config of an unfamiliar family has no
  "norm type"; the shipped feature set uses spectra, hyperparameters and size (depth, width, init
  std), which exist for any model. ``evaluate`` reports what labels would add.

``evaluate`` produces the held-out report: grouped-CV AUROC with a bootstrap 95% CI, Brier score,
ECE over 10 bins, a reliability table, and the same figures for the baselines.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rksp_cli import __version__
from rksp_cli.errors import InputError
from rksp_cli.files import atomic_path

# --- feature definitions -----------------------------------------------------------------------
# Each feature is computed from a flat row (config.*, feature.* columns; see ScreenResult.row).

Column = Callable[[pd.DataFrame], pd.Series]


def _col(frame: pd.DataFrame, name: str) -> pd.Series:
    if name in frame:
        return pd.to_numeric(frame[name], errors="coerce").astype(float)
    return pd.Series(np.nan, index=frame.index, dtype=float)


def _log10(frame: pd.DataFrame, name: str, floor: float = 1e-12) -> pd.Series:
    return np.log10(_col(frame, name).clip(lower=floor))


def _init_std(frame: pd.DataFrame) -> pd.Series:
    """config.model.init_std for the built-in GPT, the config's initializer_range otherwise."""
    return _col(frame, "config.model.init_std").fillna(_col(frame, "model.initializer_range"))


BASE_FEATURES: dict[str, Column] = {
    # training hyperparameters
    "log10_lr": lambda f: _log10(f, "config.training.lr"),
    "log1p_warmup": lambda f: np.log1p(_col(f, "config.training.warmup_steps")),
    # size, known for any model
    "n_layers": lambda f: _col(f, "feature.n_layers"),
    "log2_d_model": lambda f: np.log2(_col(f, "feature.d_model")),
    "log10_init_std": lambda f: np.log10(_init_std(f).clip(lower=1e-6)),
    # spectra of the residual stream at init
    "near_unit_mass_mean": lambda f: _col(f, "feature.near_unit_mass_mean"),
    "near_unit_mass_max": lambda f: _col(f, "feature.near_unit_mass_max"),
    "near_unit_mass_min": lambda f: _col(f, "feature.near_unit_mass_min"),
    "near_unit_mass_std": lambda f: _col(f, "feature.near_unit_mass_std"),
    "expansive_mass_mean": lambda f: _col(f, "feature.expansive_mass_mean"),
    "expansive_mass_max": lambda f: _col(f, "feature.expansive_mass_max"),
    "contractive_mass_mean": lambda f: _col(f, "feature.contractive_mass_mean"),
    "gap_mass_mean": lambda f: _col(f, "feature.gap_mass_mean"),
    "log10_rho_mean": lambda f: _log10(f, "feature.spectral_radius_mean"),
    "log10_rho_max": lambda f: _log10(f, "feature.spectral_radius_max"),
    "log10_kappa_mean": lambda f: _col(f, "feature.log10_kappa_mean"),
    "eta_nl_mean": lambda f: _col(f, "feature.eta_nl_mean"),
    "kept_fraction_mean": lambda f: _col(f, "feature.kept_fraction_mean"),
    "log10_stream_growth": lambda f: _log10(f, "feature.stream_growth"),
}
HYPER = ("log10_lr", "log1p_warmup")
SIZE = ("n_layers", "log2_d_model", "log10_init_std")
SPECTRA = tuple(k for k in BASE_FEATURES if k not in HYPER + SIZE)
# log10(lr) times these: the LR slope may differ by family
INTERACT = ("near_unit_mass_mean", "expansive_mass_mean", "log10_rho_mean", "log10_stream_growth", *SIZE)
NORMS = ("none", "pre", "post", "rms", "deepnorm", "subln")

FEATURE_SETS = {
    "hyperparameters": HYPER,
    "hyperparameters + size": HYPER + SIZE,
    "hyperparameters + spectra": HYPER + SPECTRA,
    "hyperparameters + size + spectra (shipped)": HYPER + SIZE + SPECTRA,
    "hyperparameters + size + spectra + norm labels": HYPER + SIZE + SPECTRA + tuple(f"norm_{n}" for n in NORMS),
}
SHIPPED = "hyperparameters + size + spectra (shipped)"

FOLDS = 5  # grouped cross-validation folds, a group being one configuration

# Training settings the shipped runs hold fixed: a config that differs is outside the calibration.
FIXED_SETTINGS = ("config.training.optimizer", "config.training.weight_decay", "config.training.grad_clip",
                  "config.training.batch_size", "config.training.betas", "config.model.n_experts")  # fmt: skip


def design(frame: pd.DataFrame, features: tuple[str, ...]) -> pd.DataFrame:
    """The named base features of each row, then log10(lr) interactions with those present."""
    out = {}
    for name in features:
        if name.startswith("norm_"):
            out[name] = (frame.get("config.model.norm") == name.removeprefix("norm_")).astype(float)
        else:
            out[name] = BASE_FEATURES[name](frame)
    if "log10_lr" in features:
        for name in INTERACT:
            if name in features:
                out[f"log10_lr*{name}"] = out["log10_lr"] * out[name]
    return pd.DataFrame(out, index=frame.index)


# --- the estimator -----------------------------------------------------------------------------


@dataclass
class DivergenceModel:
    """Regularised logistic regression on ``design`` features, calibrated on grouped out-of-fold scores."""

    features: tuple[str, ...] = HYPER + SIZE + SPECTRA
    C: float = 1.0
    method: str = "sigmoid"  # sigmoid (Platt) | isotonic
    folds: int = FOLDS
    # fitted state: plain numbers, so the model round-trips through JSON
    columns: list[str] = field(default_factory=list)
    medians: list[float] = field(default_factory=list)
    means: list[float] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)
    coef: list[float] = field(default_factory=list)
    intercept: float = 0.0
    calibrator: dict[str, Any] = field(default_factory=dict)
    ranges: dict[str, list[float]] = field(default_factory=dict)

    def fit(self, frame: pd.DataFrame) -> DivergenceModel:
        from sklearn.isotonic import IsotonicRegression
        from sklearn.linear_model import LogisticRegression
        from sklearn.model_selection import GroupKFold

        y = frame["label"].to_numpy(int)
        if len(np.unique(y)) < 2:
            raise InputError(
                "calibration data: a set of runs to fit holds one outcome only (every run diverged, or none "
                "did); a classifier needs both, in every cross-validation fold: add configurations"
            )
        X = design(frame, self.features)
        keep = [c for c in X.columns if X[c].nunique(dropna=True) > 1]  # constant columns carry nothing
        X = X[keep]
        self.columns = keep
        self.medians = X.median().fillna(0.0).tolist()
        Z = X.fillna(dict(zip(keep, self.medians, strict=True))).to_numpy(float)
        self.means, self.scales = Z.mean(0).tolist(), np.where(Z.std(0) > 0, Z.std(0), 1.0).tolist()
        Z = (Z - self.means) / self.scales

        def logistic() -> LogisticRegression:
            return LogisticRegression(C=self.C, max_iter=5000)

        groups = frame["config_id"].to_numpy()
        if len(np.unique(groups)) < 2:
            raise InputError("calibration data: runs of one configuration only; Platt scaling needs held-out scores")
        scores = np.empty(len(y))
        for train, test in GroupKFold(n_splits=min(self.folds, len(np.unique(groups)))).split(Z, y, groups):
            if len(np.unique(y[train])) < 2:
                scores[test] = 0.0
                continue
            scores[test] = logistic().fit(Z[train], y[train]).decision_function(Z[test])
        if self.method == "isotonic":
            iso = IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0).fit(scores, y)
            self.calibrator = {"kind": "isotonic", "x": iso.X_thresholds_.tolist(), "y": iso.y_thresholds_.tolist()}
        else:
            platt = LogisticRegression(C=1e6, max_iter=5000).fit(scores[:, None], y)
            self.calibrator = {"kind": "sigmoid", "a": float(platt.coef_[0, 0]), "b": float(platt.intercept_[0])}
        final = logistic().fit(Z, y)
        self.coef, self.intercept = final.coef_[0].tolist(), float(final.intercept_[0])
        self.ranges = {c: [float(X[c].min()), float(X[c].max())] for c in keep if "*" not in c}
        return self

    def contributions(self, frame: pd.DataFrame) -> np.ndarray:
        """Per row and column: coefficient x standardised value (the logit is their sum + intercept)."""
        X = design(frame, self.features).reindex(columns=self.columns)
        Z = X.fillna(dict(zip(self.columns, self.medians, strict=True))).to_numpy(float)
        return (Z - self.means) / self.scales * np.asarray(self.coef)

    def decision_function(self, frame: pd.DataFrame) -> np.ndarray:
        return self.contributions(frame).sum(1) + self.intercept

    def predict_proba(self, frame: pd.DataFrame) -> np.ndarray:
        """P(diverged) per row (a 1-D array, unlike scikit-learn's two columns)."""
        s = self.decision_function(frame)
        cal = self.calibrator
        if cal["kind"] == "isotonic":
            return np.interp(s, cal["x"], cal["y"])
        return 1.0 / (1.0 + np.exp(-(cal["a"] * s + cal["b"])))

    def out_of_range(self, frame: pd.DataFrame, margin: float = 0.1) -> list[str]:
        """Features of the first row outside the training range (widened by ``margin`` of its span)."""
        X = design(frame.iloc[:1], self.features)
        flags = []
        for name, (lo, hi) in self.ranges.items():
            value = float(X[name].iloc[0])
            pad = margin * (hi - lo)
            if math.isfinite(value) and not (lo - pad <= value <= hi + pad):
                flags.append(f"{name} = {value:.3g} (calibrated {lo:.3g} to {hi:.3g})")
        return flags

    def to_dict(self) -> dict[str, Any]:
        keys = ("features", "C", "method", "folds", "columns", "medians", "means", "scales", "coef", "intercept")
        return {k: getattr(self, k) for k in keys} | {"calibrator": self.calibrator, "ranges": self.ranges}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DivergenceModel:
        data = dict(data)
        data["features"] = tuple(data["features"])
        return cls(**data)


# --- evaluation --------------------------------------------------------------------------------


def auroc(y: np.ndarray, score: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    ok = np.isfinite(score)
    y, score = y[ok], score[ok]
    return float(roc_auc_score(y, score)) if len(np.unique(y)) == 2 else math.nan


def bootstrap_ci(y: np.ndarray, score: np.ndarray, n: int = 1000, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    stats = []
    for _ in range(n):
        idx = rng.integers(0, len(y), len(y))
        if len(np.unique(y[idx])) == 2:
            stats.append(auroc(y[idx], score[idx]))
    return (float(np.percentile(stats, 2.5)), float(np.percentile(stats, 97.5))) if stats else (math.nan, math.nan)


def reliability(y: np.ndarray, p: np.ndarray, bins: int = 10) -> list[dict[str, float]]:
    """Equal-width bins of predicted probability: count, mean prediction, observed rate."""
    which = np.minimum((p * bins).astype(int), bins - 1)
    return [
        {"bin": f"{b / bins:.1f}-{(b + 1) / bins:.1f}", "n": int((which == b).sum()),
         "predicted": float(p[which == b].mean()), "observed": float(y[which == b].mean())}
        for b in range(bins) if (which == b).any()
    ]  # fmt: skip


def ece(y: np.ndarray, p: np.ndarray, bins: int = 10) -> float:
    return sum(r["n"] * abs(r["predicted"] - r["observed"]) for r in reliability(y, p, bins)) / len(y)


def grouped_oof(frame: pd.DataFrame, make: Callable[[], DivergenceModel], folds: int = FOLDS) -> np.ndarray:
    """Held-out probabilities: each row predicted by a model fitted without its configuration."""
    from sklearn.model_selection import GroupKFold

    y, groups = frame["label"].to_numpy(int), frame["config_id"].to_numpy()
    p = np.full(len(frame), np.nan)
    for train, test in GroupKFold(n_splits=folds).split(frame, y, groups):
        p[test] = make().fit(frame.iloc[train]).predict_proba(frame.iloc[test])
    return p


def _metrics(y: np.ndarray, score: np.ndarray, family: np.ndarray, probability: bool, n_boot: int) -> dict[str, Any]:
    lo, hi = bootstrap_ci(y, score, n_boot)
    none = family == "none"
    out = {"auroc": auroc(y, score), "auroc_ci95": [lo, hi], "auroc_no_norm": auroc(y[none], score[none])}
    if probability:
        out.update(brier=float(np.mean((score - y) ** 2)), ece=ece(y, score))
    return out


BASELINE_SCORES = {  # score column, is it a probability?
    "raw near-unit mass (paper's score)": ("feature.near_unit_mass_mean", True),
    "spectral radius (mean)": ("feature.spectral_radius_mean", False),
    "initial gradient norm": ("baseline.init_grad_norm", False),
    "gradient norm at step 100": ("baseline.grad_norm_at_k", False),
    "gradient variance, steps 1-100": ("baseline.grad_norm_var_k", False),
    "loss-spike count": ("baseline.loss_spikes", False),
}


def evaluate(frame: pd.DataFrame, method: str = "sigmoid", C: float = 1.0, n_boot: int = 1000) -> dict[str, Any]:
    """The held-out report: every feature set and every baseline, scored on the same runs."""
    y = frame["label"].to_numpy(int)
    family = frame.get("config.model.norm", pd.Series("", index=frame.index)).fillna("").to_numpy()
    rows = {}
    for name, features in FEATURE_SETS.items():
        p = grouped_oof(frame, lambda f=features: DivergenceModel(features=f, method=method, C=C))
        rows[name] = _metrics(y, p, family, True, n_boot)
        if name == SHIPPED:
            rows[name]["reliability"] = reliability(y, p)
            rows[name]["auroc_by_family"] = {f: auroc(y[family == f], p[family == f]) for f in sorted(set(family))}
    for name, (column, is_probability) in BASELINE_SCORES.items():
        score = np.nan_to_num(_col(frame, column).to_numpy(float), nan=np.nan, posinf=1e300)
        rows[name] = _metrics(y, score, family, is_probability, n_boot)
    return {
        "n_runs": len(frame),
        "n_configurations": int(frame["config_id"].nunique()),
        "n_diverged": int(y.sum()),
        "n_no_norm": int((family == "none").sum()),
        "label": _label_description(frame),
        "method": method,
        "models": rows,
        "verdict": _spectra_verdict(rows),
    }


def _label_description(frame: pd.DataFrame) -> str:
    steps = sorted(set(frame.get("config.training.steps", pd.Series(dtype=int)).dropna().astype(int)))
    tasks = sorted(set(frame.get("config.training.task", pd.Series(dtype=str)).dropna()))
    return f"diverged within {', '.join(map(str, steps))} steps of {', '.join(tasks)} (loss > 50 or grad norm > 500)"


def _spectra_verdict(rows: dict[str, dict[str, Any]]) -> str:
    """Say plainly whether the spectra earn their place over hyperparameters and size."""
    with_spectra, without = rows[SHIPPED], rows["hyperparameters + size"]
    gain = with_spectra["auroc"] - without["auroc"]
    brier_gain = without["brier"] - with_spectra["brier"]
    if gain > 0.005 or brier_gain > 0.002:
        return (
            f"spectra help: AUROC {without['auroc']:.3f} -> {with_spectra['auroc']:.3f}, "
            f"Brier {without['brier']:.4f} -> {with_spectra['brier']:.4f} over hyperparameters + size alone"
        )
    return (
        f"spectra add nothing measurable over hyperparameters + size on these runs (AUROC "
        f"{without['auroc']:.3f} vs {with_spectra['auroc']:.3f}, Brier {without['brier']:.4f} vs "
        f"{with_spectra['brier']:.4f})"
    )


# --- files -------------------------------------------------------------------------------------


def read_runs(path: Path) -> pd.DataFrame:
    """Labelled rows from a sweep's Parquet (or CSV) output; failed points are dropped."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    except Exception as exc:
        raise InputError(f"{path}: cannot read runs ({type(exc).__name__})") from None
    for column in ("label", "config_id", "config.training.lr"):
        if column not in frame:
            raise InputError(f"{path}: no {column!r} column; produce runs with `rksp sweep --probe`")
    if "error" in frame:
        frame = frame[frame["error"].isna()]
    frame = frame.dropna(subset=["label"]).reset_index(drop=True)
    n_configs = frame["config_id"].nunique()
    if n_configs < FOLDS:
        raise InputError(
            f"{path}: {len(frame)} labelled runs of {n_configs} configuration(s); the held-out evaluation "
            f"groups runs by configuration into {FOLDS} folds, so it needs at least {FOLDS} configurations"
        )
    if frame["label"].nunique() < 2:
        raise InputError(
            f"{path}: every run has label {int(frame['label'].iloc[0])}; a classifier needs runs that "
            "diverged and runs that did not"
        )
    return frame


def fixed_settings(frame: pd.DataFrame) -> dict[str, Any]:
    """Training settings every run shares; a config that differs lies outside the calibration."""
    out = {}
    for column in FIXED_SETTINGS:
        if column in frame and frame[column].nunique(dropna=False) == 1:
            value = frame[column].iloc[0]
            out[column.removeprefix("config.")] = None if pd.isna(value) else value
    return out


def save_calibration(path: Path, model: DivergenceModel, report: dict[str, Any], frame: pd.DataFrame) -> None:
    """Write the model and its held-out report as one JSON file, atomically."""
    payload = {
        "rksp_version": __version__,
        "kind": "rksp-divergence-model",
        "model": model.to_dict(),
        "fixed_settings": fixed_settings(frame),
        "lr_range": [float(frame["config.training.lr"].min()), float(frame["config.training.lr"].max())],
        "report": report,
    }
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(payload, indent=1, default=float))


@dataclass
class Calibration:
    """A loaded calibration file: the model, its settings and its report."""

    path: Path
    model: DivergenceModel
    fixed_settings: dict[str, Any]
    lr_range: tuple[float, float]
    report: dict[str, Any]


def load_calibration(path: str | Path) -> Calibration:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such calibration file")
    try:
        data = json.loads(path.read_text())
        if data.get("kind") != "rksp-divergence-model":
            raise ValueError("not an rksp calibration")
        model = DivergenceModel.from_dict(data["model"])
        lo, hi = data["lr_range"]
        return Calibration(path, model, data.get("fixed_settings", {}), (float(lo), float(hi)), data.get("report", {}))
    except (ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not a valid rksp calibration file ({exc.__class__.__name__}: {exc})") from None
