"""Scoring with a fitted divergence model: numpy and pandas only.

What ``DivergenceModel`` (``estimator.py``) fits is a handful of arrays: the standardisation, the
monotone logistic coefficients, a calibrator and the group-bootstrap refits. Scoring a row needs
nothing else, so ``FittedRisk`` holds them and scores, and a calibration file's model loads into
it directly: a screen, which only scores, never imports scikit-learn and SciPy (about 1 s of every
``rksp screen``, measured on a 2-core AMD EPYC). ``DivergenceModel`` is a ``FittedRisk`` that
can also fit, so both score with this one implementation.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from rksp_cli.risk.features import FEATURE_SETS, SHIPPED, design

INTERVAL = 0.9  # the central coverage of the reported intervals


class NotFittedError(ValueError):
    """Scoring asked of a model that was neither fitted nor loaded."""


class FittedRisk:
    """P(diverged) of flat screen rows from fitted arrays: features -> standardise -> linear score ->
    calibrator; intervals and edges from the group-bootstrap refits.

    Fitted attributes (trailing underscores, as scikit-learn names them): ``columns_`` (the design
    columns), ``medians_`` (fill for a missing value), ``means_`` and ``scales_``
    (standardisation), ``ranges_`` (each column's fitted range), ``coef_`` and ``intercept_``,
    ``calibrator_`` (Platt or isotonic, as a dict) and ``bootstrap_`` (refits: coef, intercept,
    calibrator).
    """

    def __init__(self, features: tuple[str, ...] = FEATURE_SETS[SHIPPED]):
        self.features = features

    def _check_fitted(self) -> None:
        if not hasattr(self, "coef_"):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet: call fit, or load a calibration")

    def _standardised(self, X: pd.DataFrame) -> np.ndarray:
        self._check_fitted()
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

    def fitted_dict(self) -> dict[str, Any]:
        """The fitted arrays as plain lists (the ``fitted`` entry of a calibration file's model)."""
        self._check_fitted()
        return {
            "columns": self.columns_, "medians": self.medians_.tolist(), "means": self.means_.tolist(),
            "scales": self.scales_.tolist(), "coef": self.coef_.tolist(), "intercept": self.intercept_,
            "calibrator": self.calibrator_, "ranges": self.ranges_,
            "bootstrap": [{"coef": c.tolist(), "intercept": b, "calibrator": cal} for c, b, cal in self.bootstrap_],
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        """A model from a calibration file's ``{"params": ..., "fitted": ...}`` entry."""
        params = dict(data["params"])
        params["features"] = tuple(params["features"])
        model = cls._from_params(params)
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

    @classmethod
    def _from_params(cls, params: dict[str, Any]) -> Any:
        """An unfitted instance; the estimator's other parameters only matter for fitting."""
        return cls(params["features"])


def _expit(x: np.ndarray) -> np.ndarray:
    """The logistic function, 1 / (1 + e^-x), without overflow warnings (e^1000 is inf, giving 0)."""
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=float)))


def _calibrate(score: np.ndarray, cal: dict[str, Any]) -> np.ndarray:
    if cal["kind"] == "isotonic":
        return np.interp(score, cal["x"], cal["y"])
    return _expit(-(cal["a"] * score + cal["b"]))


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
