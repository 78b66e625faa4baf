"""The risk stage: screen row -> features -> fitted model -> risk, verdict, edge, intervals.

``features`` turns a row into numbers, ``estimator`` holds the monotone calibrated model,
``evaluation`` measures how it transfers (leave-scale-out, leave-architecture-out,
leave-norm-family-out), ``calibration`` reads and writes calibration files, ``assessment``
scores one row, and ``rules`` is the paper's rule, the fallback when no calibration exists.
"""

from __future__ import annotations

from pathlib import Path

from rksp_cli.risk.assessment import (
    EDGE_LEVEL,
    CalibratedRisk,
    RiskAssessment,
    RiskModel,
    format_risk,
    verdict_for,
)
from rksp_cli.risk.calibration import load_calibration
from rksp_cli.risk.rules import RuleBasedRisk

DEFAULT_CALIBRATION = Path(__file__).parent.parent / "default_calibration.json"

__all__ = [
    "EDGE_LEVEL",
    "CalibratedRisk",
    "RiskAssessment",
    "RiskModel",
    "RuleBasedRisk",
    "default_risk_model",
    "format_risk",
    "verdict_for",
]


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
