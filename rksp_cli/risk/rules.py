"""The RKSP paper's decision rule (Fig. 7) as a risk number: the fallback when no calibration exists.

Not a calibrated probability, blind to the learning rate, and it inherits the paper's Post-LN false
positive; every output that uses it says so.
"""

from __future__ import annotations

import math
from typing import Any

from rksp_cli.risk.assessment import HIGH_FROM, RiskAssessment, diverged_at_init, verdict_for


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
        if reason := diverged_at_init(row):
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
