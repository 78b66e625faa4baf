"""How close each healthy control came to the attention-logit growth alarm (issue 16), from its
saved run.

The rule alarms when a layer's largest logit is at least ``LEVEL`` and at least ``GROWTH`` times the
smallest of its previous ``LAG`` checks, on 3 checks in a row. Held-out Pre-LN control 462 drew the
rule's first alarm on a deep control at growth 3 (logits of 179-203 at 3.5-6.4x their low, steps
400-500): a near miss on earlier sets would have said that was coming. A control's margin is the
largest s at which the rule with both thresholds times s alarms on it, found by bisection on exact
replays (the rule reads only the logged logits): under 1, the rule as shipped never alarmed on the
run; 1 or more, it did. The table gives the check where it alarmed at s, the layer, its logit and
that logit against its low; under it, a line per failure counts its distinct controls at or above
margins 0.7, 0.8, 0.9 and 1 (``control_margin.py``, shared with ``sublayer_margin.py``).

Run: python benchmarks/logit_margin.py --seeds 462-463 [--runs DIR]; seconds, training nothing.
"""

from __future__ import annotations

from typing import Any

from control_margin import Column, Rule

from rksp_cli.monitors.attention_logits import GROWTH, LAG, LEVEL, PREFIX, AttentionLogits, growth_alarm
from rksp_cli.monitors.base import Alert
from rksp_cli.monitors.failures import WatchedRun


def _logits(check: dict[str, Any]) -> dict[str, float]:
    """A check's per-layer largest logits, what the rule reads."""
    return {k.removeprefix(PREFIX): v for k, v in check["metrics"].items() if k.startswith(PREFIX)}


def first_alarm(run: WatchedRun, scale: float = 1.0) -> Alert | None:
    """The first alarm of the shipped rule (``attention_logits.growth_alarm``) with its level and
    growth factor times ``scale`` (1: as shipped) on a saved run."""
    rule = growth_alarm(scale * GROWTH)
    rule.level = scale * LEVEL
    for check in run.series:
        for layer, value in _logits(check).items():
            if alert := rule.update(check["step"], layer, value):
                return alert
    return None


def _growth(run: WatchedRun, alert: Alert) -> float:
    """The layer's logit at the alert's check over the smallest of its previous ``LAG`` checks."""
    logits = [(c["step"], v) for c in run.series if (v := _logits(c).get(alert.layer)) is not None]
    at = next(i for i, (step, _) in enumerate(logits) if step == alert.step)
    return logits[at][1] / min(v for _, v in logits[max(0, at - LAG) : at])


RULE = Rule(
    monitor=AttentionLogits.name,
    thresholds="both thresholds",
    read=_logits,
    first=first_alarm,
    layer=Column("layer", "layer", "{}"),
    value=Column("logit", "largest logit", "{:.0f}"),
    ratio=Column("growth", "x its low"),
    ratio_of=_growth,
)


margin, margins, markdown = RULE.margin, RULE.margins, RULE.markdown


if __name__ == "__main__":
    RULE.main(__doc__)
