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
* **Plain JSON.** Every fitted number is a list of floats: a calibration file is data, never code.
  Scoring needs numpy and pandas alone: it lives in ``scoring.FittedRisk``, which this estimator
  extends with ``fit``, and a calibration file loads into it without scikit-learn.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import minimize
from scipy.special import expit
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from rksp_cli.errors import InputError
from rksp_cli.risk.features import FEATURE_SETS, FOLDS, MONOTONE, SHIPPED, architecture_groups, design
from rksp_cli.risk.scoring import FittedRisk

BOOTSTRAP = 50  # group-bootstrap refits behind the intervals


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


class DivergenceModel(FittedRisk, ClassifierMixin, BaseEstimator):
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

    # --- JSON ------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        params = self.get_params() | {"features": list(self.features)}
        return {"params": params, "fitted": self.fitted_dict()}

    @classmethod
    def _from_params(cls, params: dict[str, Any]) -> DivergenceModel:
        return cls(**params)
