"""When each monitor can first alarm: the README's table is what the rules allow.

A rule that scores a signal against the signal's own history says nothing until that history
exists, and the growth rules wait for a few checks to grow against. Each rule is fed, apart from
its measurement, a signal that turns as extreme as it can from one check on, for every such check;
the earliest alarm over all of them is the first check at which the rule can alarm at all.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from torch import nn

from rksp_cli.monitors.attention_entropy import AttentionSpectralEntropy, UpdateConcentration
from rksp_cli.monitors.attention_logits import growth_alarm
from rksp_cli.monitors.base import Alert, DriftAlarm, GrowthAlarm
from rksp_cli.monitors.output_logits import OutputLogits
from rksp_cli.monitors.r_metric import RMetric
from rksp_cli.monitors.router import RouterHealth
from rksp_cli.monitors.spectral_alignment import SignCollapse
from rksp_cli.monitors.sublayer_ratio import SublayerBurst

README = Path(__file__).resolve().parents[1] / "README.md"
CHECKS = 60  # onsets tried, and checks fed: well past every rule's history
EVERY = 50  # the default check interval, for the table's steps


def _steady(check: int) -> float:
    """A healthy signal's wobble: a spread to score against, never a trend."""
    return 1 + 0.02 * (check % 3)


def _signal(check: int, onset: int, base: float, factor: float) -> float:
    """``base`` with a wobble until ``onset``, then ``factor`` times larger at every check."""
    return base * _steady(check) if check < onset else base * factor ** (check - onset + 1)


def _first(alerts: Iterable[Alert | None]) -> int | None:
    return min((a.step for a in alerts if a is not None and a.level == "alarm"), default=None)


def _sublayer(onset: int) -> int | None:
    feed = ((c, {"sublayer_ratio/b": _signal(c, onset, 0.2, 20)}) for c in range(CHECKS))
    return _first(SublayerBurst(["b"]).rescore(feed))


def _sign_collapse(onset: int) -> int | None:
    feed = (
        (c, {"sa_entropy/L": 0.98 if c < onset else 0.05, "sa_sigma1/L": _signal(c, onset, 1.0, 2)})
        for c in range(CHECKS)
    )
    return _first(SignCollapse().rescore(feed))


def _update_entropy(onset: int) -> int | None:
    # the QK update spans lag_checks intervals, so the first value comes at that check
    lag = inspect.signature(AttentionSpectralEntropy).parameters["lag_checks"].default
    feed = ((c, {"qk_entropy_mean/L": 0.9 * _steady(c) if c < onset else 0.1}) for c in range(lag, CHECKS))
    return _first(UpdateConcentration({"L": 64}).rescore(feed))


def _r_metric(onset: int) -> int | None:
    metric = RMetric(nn.Module())
    for c in range(CHECKS):
        raw = {"lambda": _steady(c), "sigma2": _steady(c), "dloss": 0.01 * _steady(c) if c < onset else 100.0}
        if metric.score(c, raw)[1]:
            return c
    return None


def _per_check(make: Callable[[], GrowthAlarm | DriftAlarm], base: float, factor: float) -> Callable[[int], int | None]:
    """A rule that takes one value a check, built fresh for each onset."""

    def first(onset: int) -> int | None:
        alarm = make()
        return _first(alarm.update(c, "L", _signal(c, onset, base, factor)) for c in range(CHECKS))

    return first


def _router_similarity() -> DriftAlarm:
    health = RouterHealth({"r": nn.Linear(4, 4)})
    health.remove()
    return health.alarms[("r", "similarity")]


def _output_shift() -> GrowthAlarm:
    monitor = OutputLogits(nn.Linear(4, 4))
    monitor.remove()
    return monitor.alarm


RULES = {
    "output_logits": _per_check(_output_shift, 0.01, 100),
    "attention_logits": _per_check(growth_alarm, 1.0, 200),
    "spectral_alignment": _sign_collapse,
    "router": _per_check(_router_similarity, 0.5, 3),
    "sublayer_ratio": _sublayer,
    "r_metric": _r_metric,
    "attention_entropy": _update_entropy,
}


def earliest(first_alarm: Callable[[int], int | None]) -> int | None:
    """The earliest check at which a rule alarms, over every onset of an extreme signal."""
    return min((alarm for onset in range(CHECKS) if (alarm := first_alarm(onset)) is not None), default=None)


def _readme_table() -> dict[str, tuple[int, int]]:
    text = README.read_text()
    start = text.index("| monitor | earliest alarm: check | step at every=50 |")
    rows = re.findall(r"^\| `(\w+)` \| (\d+) \| (\d+) \|$", text[start:].split("\n\n", 1)[0], re.M)
    return {name: (int(check), int(step)) for name, check, step in rows}


@pytest.mark.parametrize("monitor", sorted(RULES))
def test_readme_earliest_alarm_is_what_the_rule_allows(monitor):
    check = earliest(RULES[monitor])
    assert check is not None, f"{monitor}'s rule never alarmed on an extreme signal"
    assert _readme_table()[monitor] == (check, check * EVERY)


def test_the_readme_table_names_every_monitor_once():
    assert sorted(_readme_table()) == sorted(RULES)


def test_a_signal_extreme_from_the_first_check_is_a_baseline_not_an_alarm():
    """Why the earliest alarm needs an onset later than the first check: a history rule takes what
    it first sees as normal, so the search over onsets is what finds its first chance to alarm."""
    assert _sublayer(0) is None and _sign_collapse(0) is None
