"""From spectral features and training hyperparameters to a risk, a verdict and its main reason.

Until a calibration is fitted on labelled runs (``rksp calibrate``), the screen uses
``RuleBasedRisk``: the RKSP paper's own decision rule (Fig. 7) mapped to a number, plus two facts
the rule misses. It is *not* a calibrated probability, it never sees the learning rate, and it
inherits the paper's known false positive on Post-LN; every output that uses it says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

# Verdict bands on the risk number.
ELEVATED_FROM = 0.2
HIGH_FROM = 0.5

# The paper's divergence label (section 3.1): a loss above this at any step is divergence.
DIVERGED_LOSS = 50.0


@dataclass
class RiskAssessment:
    risk: float  # in [0, 1]
    verdict: str  # "low" | "elevated" | "high"
    reason: str  # the one main reason, in words
    model: str  # which risk model produced it
    calibrated: bool  # a fitted, calibrated probability (True) or a rule (False)
    notes: list[str] = field(default_factory=list)


def verdict_for(risk: float) -> str:
    if risk >= HIGH_FROM:
        return "high"
    if risk >= ELEVATED_FROM:
        return "elevated"
    return "low"


class RiskModel(Protocol):
    def assess(self, features: dict[str, float], config: dict[str, Any]) -> RiskAssessment: ...


class RuleBasedRisk:
    """The paper's rule: safe below M~1 = 0.3, high risk above 0.5, linear in between.

    Risk is 0.1 below 0.3 and 0.9 above 0.5 (neither 0 nor 1: a rule is not certain), with two
    overrides the paper's rule misses (method reference 2.1, weakness 5): an initial loss already
    above the divergence threshold is divergence at step 0, and a stream that is mostly expansive
    with a large spectral radius explodes even though its near-unit mass is low.
    """

    name = "rule-based fallback (RKSP paper Fig. 7); not calibrated, blind to the learning rate"
    low, high = 0.3, 0.5

    def assess(self, features: dict[str, float], config: dict[str, Any]) -> RiskAssessment:
        m = features["near_unit_mass_mean"]
        init_loss = features.get("init_loss")
        expansive = features.get("expansive_mass_mean", math.nan)
        rho = features.get("spectral_radius_mean", math.nan)
        notes = ["not a calibrated probability: run `rksp calibrate` on labelled probes for one"]
        if init_loss is not None and (not math.isfinite(init_loss) or init_loss > DIVERGED_LOSS):
            risk = 1.0
            reason = (
                f"the loss at initialisation ({init_loss:.3g}) already exceeds "
                f"the divergence threshold {DIVERGED_LOSS:g}"
            )
        elif expansive >= 0.8 and rho >= 5:
            risk = 0.9
            reason = (
                f"expansive mass {expansive:.2f} with spectral radius {rho:.1f}: the init scale itself is explosive"
            )
        else:
            frac = min(max((m - self.low) / (self.high - self.low), 0.0), 1.0)
            risk = 0.1 + 0.8 * frac
            if m > self.high:
                reason = f"layer-mean near-unit mass {m:.2f} is above {self.high} (paper's high-risk rule)"
            elif m < self.low:
                reason = f"layer-mean near-unit mass {m:.2f} is below {self.low} (paper's safe rule)"
            else:
                reason = (
                    f"layer-mean near-unit mass {m:.2f} lies between {self.low} and {self.high}, "
                    "where the paper gives no rule"
                )
        if config.get("model", {}).get("norm") == "post" and risk >= HIGH_FROM:
            notes.append("Post-LN is a known false positive of this rule: 0 of 69 Post-LN runs diverged in the paper")
        return RiskAssessment(risk, verdict_for(risk), reason, self.name, calibrated=False, notes=notes)
