"""How near each control came to the sub-layer burst alarm (benchmarks/sublayer_margin.py)."""

import pytest

from rksp_cli.monitors.failures import WatchedRun
from rksp_cli.monitors.sublayer_ratio import FLOOR, FOLD, JUMP, Z
from tests.fakes import saved_run

BRANCH = "blocks.3.mlp"
WIDTH_64 = ("attention_logit_growth", "low_precision_attention")  # two blocks, one shared control
WIDTH_64_BRANCH = "blocks.1.mlp"


@pytest.fixture
def margins(benchmark_script):
    return benchmark_script("sublayer_margin")


@pytest.fixture
def common(benchmark_script):
    """What the margin scripts share: the summary."""
    return benchmark_script("control_margin")


def control(
    burst: float,
    kind: str = "control",
    at: int = 25,
    failure: str = "post_ln_without_warmup",
    branch: str = BRANCH,
    level: float = 0.1,
) -> WatchedRun:
    """A deep Pre-LN control (or ``failure``'s) checked every 50 steps whose one branch wiggles
    around ``level`` but for a ``burst``-fold step at check ``at`` (held for the rest of the run)."""
    series = [
        {
            "step": 50 * i,
            "metrics": {f"sublayer_ratio/{branch}": level * (1 + 0.02 * (i % 4)) * (burst if i >= at else 1)},
        }
        for i in range(1, 41)
    ]
    return saved_run(series, "sublayer_ratio", kind, failure, seed=3)


def test_the_margin_is_where_the_scaled_rule_starts_to_alarm(margins, margin_step, benchmark_script):
    """Just under the margin every threshold scaled by it alarms on the run; just over it, none does."""
    sublayer_ratio_alarm = benchmark_script("matched_detectors").sublayer_ratio_alarm
    run = control(1.6)
    share, alert = margins.margin(run)
    assert 0 < share < 1 and alert is not None and alert.step == 1250 and alert.layer == BRANCH
    for scale, alarms in ((share - margin_step, True), (share + margin_step, False)):
        thresholds = (scale * FOLD, scale * Z, scale * JUMP)
        assert (sublayer_ratio_alarm(run, thresholds=thresholds, floor=scale * FLOOR) is not None) is alarms


def test_a_burst_under_the_floor_is_as_near_as_its_size_against_the_floor(margins, margin_step):
    """A 12-fold burst alarms by every other test at any scale up to 2; on a branch at 0.5% of its
    shortcut it reaches 0.0612, so its margin is that share of ``FLOOR``, under 1."""
    share, alert = margins.margin(control(12.0, level=0.005))
    assert share == pytest.approx(0.005 * 1.02 * 12 / FLOOR, abs=margin_step)
    assert alert is not None and alert.step == 1250


def test_a_larger_burst_comes_closer_and_a_false_alarm_reads_at_least_one(margins):
    small, large, alarm = (margins.margin(control(b))[0] for b in (1.3, 1.8, 12.0))
    assert small < large < 1 <= alarm


def test_the_table_lists_controls_only_closest_first(margins):
    rows = margins.margins([control(1.3), control(1.8, "control_low_lr"), control(1.8, "failing")])
    assert [r["kind"] for r in rows] == ["control_low_lr", "control"]
    assert rows[0]["step"] == 1250 and rows[0]["jump"] == pytest.approx(1.8, rel=0.05)
    assert "| post_ln_without_warmup control_low_lr 3 |" in margins.markdown(rows)


def test_a_control_two_failures_share_is_one_row_naming_both(margins):
    """Width 64's growth and low precision save the same control run twice: one near miss, not two."""
    shared = [control(1.8, failure=f, branch=WIDTH_64_BRANCH) for f in WIDTH_64]
    rows = margins.margins([*shared, control(1.3)])
    assert [r["failure"] for r in rows] == [" / ".join(WIDTH_64), "post_ln_without_warmup"]
    assert rows[0]["margin"] > 0 and rows[0]["branch"] == WIDTH_64_BRANCH
    shared[1].series[3]["metrics"]["r_lambda"] = 1.0  # a straggler, measured: still the same run
    rows = margins.margins(shared)
    assert len(rows) == 1 and rows[0]["failure"] == " / ".join(WIDTH_64)
    other = control(1.8, failure=WIDTH_64[1], branch=WIDTH_64_BRANCH)
    other.series[0]["metrics"][f"sublayer_ratio/{WIDTH_64_BRANCH}"] *= 1.01  # a different run: two rows
    assert len(margins.margins([shared[0], other])) == 2


def test_the_summary_counts_distinct_controls_by_margin_per_failure(margins, common):
    deep = [control(b) for b in (1.3, 1.8, 12.0)]
    shared = [control(1.8, failure=f, branch=WIDTH_64_BRANCH) for f in WIDTH_64]
    rows = margins.margins([*deep, *shared])
    near = [r["margin"] for r in rows if r["failure"] == "post_ln_without_warmup"]
    lines = common.summary(rows).splitlines()
    assert lines[0].startswith(" / ".join(WIDTH_64) + ": 1 controls;")
    assert lines[1].startswith("post_ln_without_warmup: 3 controls;") and lines[1].endswith(">= 1: 1")
    for at in common.NEAR:
        assert f">= {at:g}: {sum(m >= at for m in near)}" in lines[1]
