"""From spectral features and training hyperparameters to a risk, a verdict and its main reason.

Risk models read one flat row (``config.*`` and ``feature.*`` keys, see ``screen.screen_row``):

* ``CalibratedRisk``: a fitted ``DivergenceModel`` (``rksp calibrate``), the default whenever a
  calibration file is available. It also predicts the stability edge: the largest learning rate
  whose risk stays under a level (0.2), and it flags configs outside the calibrated range.
* ``RuleBasedRisk``: the RKSP paper's decision rule (Fig. 7) mapped to a number, plus two facts
  the rule misses. Not a calibrated probability, blind to the learning rate, and it inherits the
  paper's Post-LN false positive; every output that uses it says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from rksp_cli.calibrate import Calibration, load_calibration

# Verdict bands on the risk number.
ELEVATED_FROM = 0.2
HIGH_FROM = 0.5
EDGE_LEVEL = 0.2  # the stability edge is the largest lr whose predicted risk stays below this

# The paper's divergence label (section 3.1): a loss above this at any step is divergence.
DIVERGED_LOSS = 50.0

DEFAULT_CALIBRATION = Path(__file__).parent / "default_calibration.json"


@dataclass
class RiskAssessment:
    risk: float  # in [0, 1]; NaN when it cannot be computed (no learning rate)
    verdict: str  # "low" | "elevated" | "high" | "unknown"
    reason: str  # the one main reason, in words
    model: str  # which risk model produced it
    calibrated: bool  # a fitted, calibrated probability (True) or a rule (False)
    notes: list[str] = field(default_factory=list)
    lr_edge: float | None = None  # predicted stable learning-rate edge
    out_of_range: list[str] = field(default_factory=list)  # why the config lies outside the calibration


def format_risk(risk: float | None) -> str:
    """A probability as people read it: two decimals, with the extremes not rounded to certainty."""
    if risk is None or math.isnan(risk):
        return "-"
    return "<0.01" if risk < 0.005 else ">0.99" if risk > 0.995 else f"{risk:.2f}"


def verdict_for(risk: float) -> str:
    if not math.isfinite(risk):
        return "unknown"
    if risk >= HIGH_FROM:
        return "high"
    if risk >= ELEVATED_FROM:
        return "elevated"
    return "low"


class RiskModel(Protocol):
    def assess(self, row: dict[str, Any]) -> RiskAssessment: ...


def _diverged_at_init(row: dict[str, Any]) -> str | None:
    """The paper's label counts step 0: a loss above 50 at init is divergence, not a risk."""
    init_loss = row.get("feature.init_loss")
    if init_loss is not None and (not math.isfinite(init_loss) or init_loss > DIVERGED_LOSS):
        return (
            f"the loss at initialisation ({init_loss:.3g}) already exceeds the divergence threshold {DIVERGED_LOSS:g}"
        )
    return None


class RuleBasedRisk:
    """The paper's rule: safe below M~1 = 0.3, high risk above 0.5, linear in between.

    Risk is 0.1 below 0.3 and 0.9 above 0.5 (neither 0 nor 1: a rule is not certain), with two
    overrides the paper's rule misses (method reference 2.1, weakness 5): an initial loss already
    above the divergence threshold is divergence at step 0, and a stream that is mostly expansive
    with a large spectral radius explodes even though its near-unit mass is low.
    """

    name = "rule-based fallback (RKSP paper Fig. 7); not calibrated, blind to the learning rate"
    low, high = 0.3, 0.5

    def assess(self, row: dict[str, Any]) -> RiskAssessment:
        m = row["feature.near_unit_mass_mean"]
        expansive = row.get("feature.expansive_mass_mean", math.nan)
        rho = row.get("feature.spectral_radius_mean", math.nan)
        notes = ["not a calibrated probability: run `rksp calibrate` on labelled probes for one"]
        if reason := _diverged_at_init(row):
            risk = 1.0
        elif expansive >= 0.8 and rho >= 5:
            risk = 0.9
            reason = (
                f"expansive mass {expansive:.2f} with spectral radius {rho:.1f}: the init scale itself is explosive"
            )
        else:
            risk = 0.1 + 0.8 * min(max((m - self.low) / (self.high - self.low), 0.0), 1.0)
            if m > self.high:
                reason = f"layer-mean near-unit mass {m:.2f} is above {self.high} (paper's high-risk rule)"
            elif m < self.low:
                reason = f"layer-mean near-unit mass {m:.2f} is below {self.low} (paper's safe rule)"
            else:
                reason = (
                    f"layer-mean near-unit mass {m:.2f} is in [{self.low}, {self.high}], where the paper has no rule"
                )
        if row.get("config.model.norm") == "post" and risk >= HIGH_FROM:
            notes.append("Post-LN is a known false positive of this rule: 0 of 69 Post-LN runs diverged in the paper")
        return RiskAssessment(risk, verdict_for(risk), reason, self.name, calibrated=False, notes=notes)


class CalibratedRisk:
    """A fitted divergence model: calibrated probability, stability edge, out-of-range flags."""

    def __init__(self, calibration: Calibration, edge_level: float = EDGE_LEVEL):
        self.calibration = calibration
        self.edge_level = edge_level
        report = calibration.report
        self.name = f"calibrated on {report.get('n_runs', '?')} labelled runs ({calibration.path.name})"

    def assess(self, row: dict[str, Any]) -> RiskAssessment:
        cal, model = self.calibration, self.calibration.model
        frame = pd.DataFrame([row])
        notes = [f"label: {cal.report['label']}"] if "label" in cal.report else []
        out_of_range = model.out_of_range(frame)
        for setting, value in cal.fixed_settings.items():
            mine = row.get(f"config.{setting}")
            if mine is None:  # a field the config leaves to the model (a transformers MoE): what was measured
                mine = _plain(row.get(f"feature.{setting.rpartition('.')[2]}"))
            mine = ",".join(map(str, mine)) if isinstance(mine, (list, tuple)) else mine
            if mine != value and not (mine is None and value is None):
                out_of_range.append(f"{setting} = {mine} (calibrated only at {_plain(value)})")
        lr = row.get("config.training.lr")
        edge = self.edge(row)
        edge_text = self._edge_text(edge)
        if reason := _diverged_at_init(row):
            risk = 1.0
        elif lr is None:
            risk, reason = math.nan, f"training.lr is not set, so there is no risk to score; {edge_text}"
        else:
            risk = float(model.predict_proba(frame)[0])
            if edge is not None and math.isfinite(edge):
                ratio = lr / edge
                where = f"{_times(ratio)} above" if ratio > 1 else f"{_times(1 / ratio)} below"
                reason = f"lr {lr:.2g} is {where} the predicted edge {edge:.2g} (risk {self.edge_level:g})"
            else:
                reason = f"lr {lr:.2g}; {edge_text}"
            drivers = self.drivers(frame)
            if drivers:
                notes.append(f"main drivers of the score: {', '.join(drivers)}")
        return RiskAssessment(
            risk, verdict_for(risk), reason, self.name, calibrated=True, notes=notes, lr_edge=edge,
            out_of_range=out_of_range,
        )  # fmt: skip

    def risk_curve(self, row: dict[str, Any], points: int = 121) -> tuple[np.ndarray, np.ndarray]:
        """(lr grid over the calibrated range, risk at each lr) for this row's other features."""
        lo, hi = self.calibration.lr_range
        grid = np.logspace(math.log10(lo), math.log10(hi), points)
        frame = pd.DataFrame([row] * points)
        frame["config.training.lr"] = grid
        return grid, self.calibration.model.predict_proba(frame)

    def edge(self, row: dict[str, Any], points: int = 121) -> float | None:
        """The largest lr in the calibrated range whose risk, and every lower lr's, stays under the level.

        Returns None when even the lowest calibrated lr is over the level, and inf when no lr in
        the range reaches it.
        """
        grid, risk = self.risk_curve(row, points)
        over = np.flatnonzero(risk >= self.edge_level)
        if over.size == 0:
            return math.inf
        if over[0] == 0:
            return None
        return float(grid[over[0] - 1])

    def _edge_text(self, edge: float | None) -> str:
        lo, hi = self.calibration.lr_range
        if edge is None:
            return f"every calibrated lr (from {lo:.2g}) is predicted above risk {self.edge_level:g}"
        if math.isinf(edge):
            return f"no calibrated lr (up to {hi:.2g}) reaches risk {self.edge_level:g}"
        return f"predicted edge lr {edge:.2g} (risk {self.edge_level:g})"

    def drivers(self, frame: pd.DataFrame, top: int = 2) -> list[str]:
        """The features pushing this row's score up the most (coefficient x standardised value)."""
        model = self.calibration.model
        contrib = model.contributions(frame)[0]
        order = np.argsort(contrib)[::-1]
        return [model.columns[i] for i in order[:top] if contrib[i] > 0]


def _times(ratio: float) -> str:
    """A ratio people can read: 3.2x, 450x, 1e+300x (never 300 digits)."""
    return f"{ratio:.1f}x" if ratio < 100 else f"{ratio:.3g}x"


def _plain(value: Any) -> Any:
    """16.0 -> 16: settings read back from Parquet come as floats."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def default_risk_model(calibration: str | Path | None = None) -> RiskModel:
    """The shipped calibration (or ``calibration``); the rule-based fallback if there is none.

    ``calibration="none"`` asks for the fallback explicitly.
    """
    if calibration == "none":
        return RuleBasedRisk()
    if calibration is not None:
        return CalibratedRisk(load_calibration(calibration))
    if DEFAULT_CALIBRATION.is_file():
        return CalibratedRisk(load_calibration(DEFAULT_CALIBRATION))
    return RuleBasedRisk()
