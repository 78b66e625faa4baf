"""From one flat screen row to a risk, a verdict, its main reason and a stability edge.

``CalibratedRisk`` scores a row with a fitted ``DivergenceModel`` (``rksp calibrate``). Inside the
box the model was fitted in, the risk is a calibrated probability. Outside it (a feature beyond
its fitted range, or a training setting every run held fixed), the output says "extrapolated",
is not called calibrated, and carries the interval of the group-bootstrap refits, whose upper
end is what ``--fail-above`` gates on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pandas as pd

from rksp_cli.risk.calibration import Calibration
from rksp_cli.risk.features import DEPTH_PER_NORM, norm_family

# Verdict bands on the risk number.
ELEVATED_FROM = 0.2
HIGH_FROM = 0.5
EDGE_LEVEL = 0.2  # the stability edge is the lr at which the predicted risk reaches this level

# The paper's divergence label (section 3.1): a loss above this at any step is divergence.
DIVERGED_LOSS = 50.0


@dataclass
class RiskAssessment:
    risk: float  # in [0, 1]; NaN when it cannot be computed (no learning rate)
    verdict: str  # "low" | "elevated" | "high" | "unknown"
    reason: str  # the one main reason, in words
    model: str  # which risk model produced it
    calibrated: bool  # a calibrated probability inside its fitted box (True), or a rule or an extrapolation
    notes: list[str] = field(default_factory=list)
    lr_edge: float | None = None  # predicted stable learning-rate edge
    out_of_range: list[str] = field(default_factory=list)  # why the config lies outside the calibration
    interval: tuple[float, float] | None = None  # 90% interval of the risk over bootstrap refits
    edge_interval: tuple[float, float] | None = None  # the same for the edge

    @property
    def extrapolated(self) -> bool:
        return bool(self.out_of_range)

    @property
    def gated(self) -> tuple[float, str]:
        """The number a gate should compare, and what it is: the interval's top when extrapolated."""
        if self.extrapolated and self.interval is not None and math.isfinite(self.interval[1]):
            return self.interval[1], "upper end of the extrapolation interval"
        return self.risk, "risk"


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


def diverged_at_init(row: dict[str, Any]) -> str | None:
    """The paper's label counts step 0: a loss above 50 at init is divergence, not a risk."""
    init_loss = row.get("feature.init_loss")
    if init_loss is not None and (not math.isfinite(init_loss) or init_loss > DIVERGED_LOSS):
        return (
            f"the loss at initialisation ({init_loss:.3g}) already exceeds the divergence threshold {DIVERGED_LOSS:g}"
        )
    return None


# Design choice: a screen needs more token states per width than this to be scored (see exact_fit).
TOKENS_PER_WIDTH = 4


def fits_exactly(token_states: float, d_model: float) -> bool:
    """Whether N distinct token states span no more than the width: the least-squares fit is exact."""
    return token_states - 1 <= d_model


def exact_fit(row: dict[str, Any]) -> str | None:
    """A sample too small for the width: with N <= d + 1 distinct token states the least-squares
    operator fits them exactly, so the spectra describe the sample rather than the model, in a
    regime no calibration screen was in (issue 13). Measured on Pythia-1B (d = 2048): predicted
    edge 0.0016 at N = 2048, 0.064 at N = 8192, where the smaller Pythias and GPT-2 moved at most
    1.13x between N = 2048 and 8192. The advice asks for ``TOKENS_PER_WIDTH`` states per dimension."""
    n, d = row.get("feature.token_states"), row.get("feature.d_model")
    if n is None or d is None or not (math.isfinite(n) and math.isfinite(d)) or not fits_exactly(n, d):
        return None
    return (
        f"{n:.0f} distinct token states for d={d:.0f}: the DMD fits them exactly, so the spectra describe "
        f"the sample, not the model, and no risk or edge is scored; screen with probe.tokens >= "
        f"{TOKENS_PER_WIDTH * d:.0f} (on a GPU, --device cuda)"
    )


class CalibratedRisk:
    """A fitted divergence model: probability, stability edge, intervals and extrapolation flags."""

    def __init__(self, calibration: Calibration, edge_level: float = EDGE_LEVEL):
        self.calibration = calibration
        self.edge_level = edge_level
        self.name = f"calibrated on {calibration.report.get('n_runs', '?')} labelled runs ({calibration.path.name})"

    def assess(self, row: dict[str, Any]) -> RiskAssessment:
        cal, model = self.calibration, self.calibration.model
        frame = pd.DataFrame([row])
        notes = [f"label: {cal.report['label_description']}"] if "label_description" in cal.report else []
        if set(model.columns_) & set(DEPTH_PER_NORM) and pd.isna(norm_family(frame).iloc[0]):
            notes.append(
                "normalisation family not recognised (neither pre-norm, Post-LN nor none): depth enters "
                "through the slope shared by all families only"
            )
        out_of_range = model.out_of_range(frame) + self._unfitted_settings(row)
        edge = float(model.edge(frame, self.edge_level)[0])
        edge_interval = _pair(model.edge_interval(frame, self.edge_level)[0])
        interval = _pair(model.interval(frame)[0])
        name = self.name if not out_of_range else f"{self.name}; extrapolated"
        lr = row.get("config.training.lr")
        if reason := diverged_at_init(row):
            risk = 1.0
        elif reason := exact_fit(row):
            risk, interval, edge, edge_interval = math.nan, None, math.nan, None
        elif lr is None:
            risk, interval = math.nan, None
            reason = f"training.lr is not set, so there is no risk to score; {self._edge_text(edge)}"
        else:
            risk = float(model.predict_proba(frame)[0, 1])
            if math.isfinite(edge) and edge > 0:
                ratio = lr / edge
                where = f"{_times(ratio)} above" if ratio > 1 else f"{_times(1 / ratio)} below"
                reason = f"lr {lr:.2g} is {where} the predicted edge {edge:.2g} (risk {self.edge_level:g})"
            else:
                reason = f"lr {lr:.2g}; {self._edge_text(edge)}"
            if drivers := self.drivers(frame):
                notes.append(f"main drivers of the score: {', '.join(drivers)}")
        if out_of_range:
            reason = f"extrapolated: {reason}"
        return RiskAssessment(
            risk, verdict_for(risk), reason, name, calibrated=not out_of_range, notes=notes, lr_edge=edge,
            out_of_range=out_of_range, interval=interval, edge_interval=edge_interval,
        )  # fmt: skip

    def _unfitted_settings(self, row: dict[str, Any]) -> list[str]:
        """Training settings every calibration run shared, where this row differs."""
        flags = []
        for setting, value in self.calibration.fixed_settings.items():
            mine = row.get(f"config.{setting}")
            if mine is None:  # a field the config leaves to the model (a transformers MoE): what was measured
                mine = _plain(row.get(f"feature.{setting.rpartition('.')[2]}"))
            mine = ",".join(map(str, mine)) if isinstance(mine, (list, tuple)) else mine
            if mine != value and not (mine is None and value is None):
                flags.append(f"{setting} = {mine} (calibrated only at {_plain(value)})")
        return flags

    def risk_curve(self, row: dict[str, Any], points: int = 121) -> tuple[np.ndarray, np.ndarray]:
        """(lr grid over the calibrated range, risk at each lr) for this row's other features."""
        lo, hi = self.calibration.lr_range
        grid = np.logspace(math.log10(lo), math.log10(hi), points)
        frame = pd.DataFrame([row] * points)
        frame["config.training.lr"] = grid
        return grid, self.calibration.model.predict_proba(frame)[:, 1]

    def edge(self, row: dict[str, Any]) -> float:
        """The lr at which this row's risk reaches the edge level (closed form; may lie outside the lr range)."""
        return float(self.calibration.model.edge(pd.DataFrame([row]), self.edge_level)[0])

    def _edge_text(self, edge: float) -> str:
        if not math.isfinite(edge) or edge <= 0:
            return f"no lr reaches risk {self.edge_level:g} for this model"
        lo, hi = self.calibration.lr_range
        outside = "" if lo <= edge <= hi else f", outside the calibrated lr range {lo:.2g}-{hi:.2g}"
        return f"predicted edge lr {edge:.2g} (risk {self.edge_level:g}{outside})"

    def drivers(self, frame: pd.DataFrame, top: int = 2) -> list[str]:
        """The features pushing this row's score up the most (coefficient x standardised value)."""
        model = self.calibration.model
        contrib = model.contributions(frame)[0]
        order = np.argsort(contrib)[::-1]
        return [model.columns_[i] for i in order[:top] if contrib[i] > 0]


def _pair(values: np.ndarray) -> tuple[float, float] | None:
    lo, hi = (float(v) for v in values)
    return (lo, hi) if math.isfinite(lo) and math.isfinite(hi) else None


def _times(ratio: float) -> str:
    """A ratio people can read: 3.2x, 450x, 1e+300x (never 300 digits)."""
    return f"{ratio:.1f}x" if ratio < 100 else f"{ratio:.3g}x"


def _plain(value: Any) -> Any:
    """16.0 -> 16: settings read back from Parquet come as floats."""
    return int(value) if isinstance(value, float) and value.is_integer() else value
