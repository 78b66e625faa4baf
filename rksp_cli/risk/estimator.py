"""P(diverged | hyperparameters, size, spectra): a monotone logistic model, calibrated, with intervals.

Why this form (issue 14; measurements in the README, "The risk number"):

* **Monotone by construction.** ``MonotoneLogistic`` is a logistic regression whose coefficients
  can be held to a sign: the lr's is >= 0 and warmup's <= 0, and no feature multiplies the lr.
  So risk never falls as the lr rises or the warmup shortens, at any size, and the stability
  edge has a closed form: log10 edge is linear in the other features, a power law in width and
  depth. The old model's lr interactions let the slope change sign at 80 blocks.
* **Calibrated on held-out architectures.** scikit-learn's ``CalibratedClassifierCV`` maps the
  score to a probability (Platt or isotonic) on out-of-fold scores, the folds grouped by
  architecture (everything but lr, warmup and seed), so a calibration never sees the spectra of
  the architecture it scores.
* **Intervals from group-bootstrap refits.** The whole pipeline is refitted on architectures
  resampled with replacement; the spread of their predictions is the interval a screen shows,
  and the one it gates on when it extrapolates.
* **Plain JSON.** Every fitted number is a list of floats: a calibration file is data, never code,
  and scoring needs numpy alone.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import minimize
from scipy.special import expit
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from rksp_cli.errors import InputError
from rksp_cli.risk.features import FEATURE_SETS, MONOTONE, SHIPPED, architecture_groups, design

FOLDS = 5  # grouped cross-validation folds, a group being one architecture
BOOTSTRAP = 50  # group-bootstrap refits behind the intervals
INTERVAL = 0.9  # the central coverage of the reported intervals


class MonotoneLogistic(ClassifierMixin, BaseEstimator):
    """L2-regularised logistic regression with optional sign constraints on its coefficients.

    ``signs[j]`` = +1 holds coefficient j >= 0 (the probability is non-decreasing in feature j),
    -1 holds it <= 0, 0 leaves it free. The objective is scikit-learn's ``LogisticRegression``'s
    (C * log-loss + ||w||^2 / 2, intercept unpenalised), minimised by L-BFGS-B within the bounds.
    """

    def __init__(self, C: float = 1.0, signs: tuple[int, ...] | None = None):
        self.C = C
        self.signs = signs

    def fit(self, X: Any, y: Any) -> MonotoneLogistic:
        X, y = validate_data(self, X, y, dtype=np.float64)
        check_classification_targets(y)
        self.classes_ = np.unique(y)
        if len(self.classes_) != 2:
            raise ValueError(f"MonotoneLogistic needs two classes, got {len(self.classes_)}")
        sign = np.where(y == self.classes_[1], 1.0, -1.0)
        p = X.shape[1]
        signs = np.zeros(p) if self.signs is None else np.asarray(self.signs, dtype=float)
        if signs.shape != (p,):
            raise ValueError(f"signs has {signs.size} entries for {p} features")
        bounds = [(0.0, None) if s > 0 else (None, 0.0) if s < 0 else (None, None) for s in signs] + [(None, None)]

        def objective(w: np.ndarray) -> tuple[float, np.ndarray]:
            margin = sign * (X @ w[:p] + w[p])
            grad_margin = -sign * expit(-margin)  # d log(1 + e^-m) / dz
            value = self.C * np.logaddexp(0.0, -margin).sum() + 0.5 * w[:p] @ w[:p]
            grad = np.append(self.C * (X.T @ grad_margin) + w[:p], self.C * grad_margin.sum())
            return float(value), grad

        result = minimize(objective, np.zeros(p + 1), jac=True, method="L-BFGS-B", bounds=bounds,
                          options={"maxiter": 2000})  # fmt: skip
        self.coef_ = result.x[None, :p]
        self.intercept_ = result.x[p:]
        self.n_iter_ = np.array([result.nit])
        return self

    def decision_function(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        return X @ self.coef_[0] + self.intercept_[0]

    def predict_proba(self, X: Any) -> np.ndarray:
        p = expit(self.decision_function(X))
        return np.column_stack([1.0 - p, p])

    def predict(self, X: Any) -> np.ndarray:
        return self.classes_[(self.decision_function(X) > 0).astype(int)]


class DivergenceModel(ClassifierMixin, BaseEstimator):
    """P(diverged) from flat screen rows: features -> standardise -> ``MonotoneLogistic`` -> calibration.

    ``fit(rows, y, groups)`` takes a DataFrame of ``config.*``/``feature.*`` rows; ``groups``
    (default: one per architecture) keeps an architecture inside one cross-validation fold.
    """

    def __init__(
        self,
        features: tuple[str, ...] = FEATURE_SETS[SHIPPED],
        C: float = 1.0,
        method: str = "sigmoid",
        folds: int = FOLDS,
        n_bootstrap: int = BOOTSTRAP,
        random_state: int = 0,
    ):
        self.features = features
        self.C = C
        self.method = method
        self.folds = folds
        self.n_bootstrap = n_bootstrap
        self.random_state = random_state

    # --- fitting ---------------------------------------------------------------------------------

    def fit(self, X: pd.DataFrame, y: Any, groups: Any = None) -> DivergenceModel:
        y = np.asarray(y, dtype=int)
        if len(np.unique(y)) < 2:
            raise InputError(
                "calibration data: the runs hold one outcome only (every run diverged, or none did); "
                "a classifier needs both: add configurations"
            )
        groups = np.asarray(architecture_groups(X) if groups is None else groups)
        D = design(X, tuple(self.features))
        self.columns_ = [c for c in D.columns if D[c].nunique(dropna=True) > 1]  # constants carry nothing
        D = D[self.columns_]
        self.medians_ = D.median().fillna(0.0).to_numpy()
        Z = D.fillna(dict(zip(self.columns_, self.medians_, strict=True))).to_numpy(float)
        self.means_ = Z.mean(0)
        self.scales_ = np.where(Z.std(0) > 0, Z.std(0), 1.0)
        Z = (Z - self.means_) / self.scales_
        self.ranges_ = {c: [float(D[c].min()), float(D[c].max())] for c in self.columns_}
        self.classes_ = np.array([0, 1])

        self.coef_, self.intercept_, self.calibrator_ = self._fit_once(Z, y, groups)
        rng = np.random.default_rng(self.random_state)
        members = [np.flatnonzero(groups == g) for g in np.unique(groups)]
        self.bootstrap_ = []
        for _ in range(self.n_bootstrap):
            drawn = [members[i] for i in rng.integers(0, len(members), len(members))]
            rows = np.concatenate(drawn)
            relabel = np.repeat(np.arange(len(drawn)), [len(m) for m in drawn])  # a redraw is a new group
            if len(np.unique(y[rows])) < 2:
                continue
            try:
                self.bootstrap_.append(self._fit_once(Z[rows], y[rows], relabel))
            except InputError:
                continue
        return self

    def _fit_once(self, Z: np.ndarray, y: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, float, dict]:
        """One calibrated fit: (coefficients, intercept, calibrator) on standardised features."""
        from sklearn.calibration import CalibratedClassifierCV
        from sklearn.model_selection import GroupKFold

        n_groups = len(np.unique(groups))
        if n_groups < 2:
            raise InputError("calibration data: runs of one architecture only; calibration needs held-out scores")
        splits = list(GroupKFold(n_splits=min(self.folds, n_groups)).split(Z, y, groups))
        if any(len(np.unique(y[train])) < 2 for train, _ in splits):
            raise InputError(
                "calibration data: a cross-validation fold holds one outcome only; add architectures "
                "that diverged and ones that did not"
            )
        signs = tuple(MONOTONE.get(c, 0) for c in self.columns_)
        base = MonotoneLogistic(C=self.C, signs=signs)
        calibrated = CalibratedClassifierCV(base, method=self.method, cv=splits, ensemble=False).fit(Z, y)
        fitted = calibrated.calibrated_classifiers_[0]
        calibrator = fitted.calibrators[0]
        if self.method == "isotonic":
            cal = {"kind": "isotonic", "x": calibrator.X_thresholds_.tolist(), "y": calibrator.y_thresholds_.tolist()}
        else:  # scikit-learn's sigmoid: p = 1 / (1 + exp(a s + b)), so a < 0 when the score means anything
            cal = {"kind": "sigmoid", "a": float(calibrator.a_), "b": float(calibrator.b_)}
            if cal["a"] >= 0:
                raise InputError("calibration data: held-out scores do not rise with divergence; nothing to calibrate")
        return fitted.estimator.coef_[0].copy(), float(fitted.estimator.intercept_[0]), cal

    # --- scoring ---------------------------------------------------------------------------------

    def _standardised(self, X: pd.DataFrame) -> np.ndarray:
        check_is_fitted(self, "coef_")
        D = design(X, tuple(self.features)).reindex(columns=self.columns_)
        Z = D.fillna(dict(zip(self.columns_, self.medians_, strict=True))).to_numpy(float)
        return (Z - self.means_) / self.scales_

    def contributions(self, X: pd.DataFrame) -> np.ndarray:
        """Per row and column: coefficient x standardised value (the score is their sum + intercept)."""
        return self._standardised(X) * self.coef_

    def decision_function(self, X: pd.DataFrame) -> np.ndarray:
        return self._standardised(X) @ self.coef_ + self.intercept_

    def predict_proba(self, X: pd.DataFrame) -> np.ndarray:
        """(n, 2): P(not diverged), P(diverged) per row."""
        p = _calibrate(self.decision_function(X), self.calibrator_)
        return np.column_stack([1.0 - p, p])

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        return (self.predict_proba(X)[:, 1] >= 0.5).astype(int)

    def bootstrap_proba(self, X: pd.DataFrame) -> np.ndarray:
        """(refits, n): P(diverged) per group-bootstrap refit; empty when fitted without refits."""
        Z = self._standardised(X)
        return np.array([_calibrate(Z @ coef + b, cal) for coef, b, cal in self.bootstrap_]).reshape(-1, len(Z))

    def interval(self, X: pd.DataFrame, coverage: float = INTERVAL) -> np.ndarray:
        """(n, 2): the central ``coverage`` interval of P(diverged) over the refits; NaN without refits."""
        return _central(self.bootstrap_proba(X), coverage, len(X))

    def edge(self, X: pd.DataFrame, level: float) -> np.ndarray:
        """Per row, the lr at which P(diverged) reaches ``level``, every other feature held (closed form)."""
        return self._edges(X, level, [(self.coef_, self.intercept_, self.calibrator_)])[0]

    def bootstrap_edges(self, X: pd.DataFrame, level: float) -> np.ndarray:
        """(refits, n): the edge per group-bootstrap refit, so that a comparison between rows (does
        the edge fall from one model to the next?) can be judged refit by refit."""
        return self._edges(X, level, self.bootstrap_)

    def edge_interval(self, X: pd.DataFrame, level: float, coverage: float = INTERVAL) -> np.ndarray:
        """(n, 2): the central ``coverage`` interval of the edge over the refits, in lr."""
        edges = self.bootstrap_edges(X, level)
        return 10 ** _central(np.log10(edges), coverage, len(X)) if len(edges) else _central(edges, coverage, len(X))

    def _edges(self, X: pd.DataFrame, level: float, fits: list) -> np.ndarray:
        if "log10_lr" not in self.columns_:
            return np.full((len(fits), len(X)), math.nan)
        j = self.columns_.index("log10_lr")
        Z = self._standardised(X)
        Z[:, j] = 0.0  # the score without the lr's part: the lr is what we solve for
        out = []
        for coef, b, cal in fits:
            target = _inverse_calibrate(level, cal)
            with np.errstate(divide="ignore", invalid="ignore"):
                z_lr = (target - (Z @ coef + b)) / coef[j]  # coef[j] >= 0 by construction
            out.append(10 ** (self.means_[j] + self.scales_[j] * z_lr))
        return np.array(out).reshape(-1, len(X))

    def out_of_range(self, X: pd.DataFrame, margin: float = 0.1) -> list[str]:
        """Features of the first row outside the fitted range (widened by ``margin`` of its span)."""
        D = design(X.iloc[:1], tuple(self.features))
        flags = []
        for name, (lo, hi) in self.ranges_.items():
            value = float(D[name].iloc[0]) if name in D else math.nan
            pad = margin * (hi - lo)
            if math.isfinite(value) and not (lo - pad <= value <= hi + pad):
                flags.append(f"{name} = {value:.3g} (calibrated {lo:.3g} to {hi:.3g})")
        return flags

    # --- JSON ------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        check_is_fitted(self, "coef_")
        params = self.get_params() | {"features": list(self.features)}
        fitted = {
            "columns": self.columns_, "medians": self.medians_.tolist(), "means": self.means_.tolist(),
            "scales": self.scales_.tolist(), "coef": self.coef_.tolist(), "intercept": self.intercept_,
            "calibrator": self.calibrator_, "ranges": self.ranges_,
            "bootstrap": [{"coef": c.tolist(), "intercept": b, "calibrator": cal} for c, b, cal in self.bootstrap_],
        }  # fmt: skip
        return {"params": params, "fitted": fitted}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DivergenceModel:
        params = dict(data["params"])
        params["features"] = tuple(params["features"])
        model = cls(**params)
        fitted = data["fitted"]
        model.columns_ = list(fitted["columns"])
        model.medians_ = np.asarray(fitted["medians"], dtype=float)
        model.means_ = np.asarray(fitted["means"], dtype=float)
        model.scales_ = np.asarray(fitted["scales"], dtype=float)
        model.coef_ = np.asarray(fitted["coef"], dtype=float)
        model.intercept_ = float(fitted["intercept"])
        model.calibrator_ = dict(fitted["calibrator"])
        model.ranges_ = {k: [float(lo), float(hi)] for k, (lo, hi) in fitted["ranges"].items()}
        model.bootstrap_ = [
            (np.asarray(b["coef"], dtype=float), float(b["intercept"]), dict(b["calibrator"]))
            for b in fitted["bootstrap"]
        ]
        model.classes_ = np.array([0, 1])
        return model


def _calibrate(score: np.ndarray, cal: dict[str, Any]) -> np.ndarray:
    if cal["kind"] == "isotonic":
        return np.interp(score, cal["x"], cal["y"])
    return expit(-(cal["a"] * score + cal["b"]))


def _inverse_calibrate(level: float, cal: dict[str, Any]) -> float:
    """The score at which the calibrated probability reaches ``level`` (+-inf when it never does)."""
    if cal["kind"] == "isotonic":
        x, y = np.asarray(cal["x"]), np.asarray(cal["y"])
        above = np.flatnonzero(y >= level)
        if above.size == 0:
            return math.inf
        return -math.inf if above[0] == 0 and y[0] >= level else float(x[above[0]])
    if cal["a"] == 0:
        return math.inf
    return (math.log((1.0 - level) / level) - cal["b"]) / cal["a"]


def _central(samples: np.ndarray, coverage: float, n: int) -> np.ndarray:
    if samples.size == 0:
        return np.full((n, 2), math.nan)
    tail = 50 * (1 - coverage)
    with np.errstate(invalid="ignore"):
        return np.nanpercentile(samples, [tail, 100 - tail], axis=0).T
