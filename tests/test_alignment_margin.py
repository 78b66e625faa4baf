"""How near each control came to the spectral-alignment alarm (benchmarks/alignment_margin.py)."""

import math

import pytest

from rksp_cli.monitors import spectral_alignment
from tests.fakes import ALIGNED_LAYER, collapsing_run


@pytest.fixture
def margins(benchmark_script):
    return benchmark_script("alignment_margin")


def test_at_scale_one_the_replay_is_the_shipped_rule(margins, benchmark_script):
    """With the threshold as shipped, the replay alarms where matched_detectors' replay of the rule
    does, or nowhere with it; and the module's threshold is left as it was."""
    shipped = spectral_alignment.GROWTH_Z
    spectral_alignment_alarm = benchmark_script("matched_detectors").spectral_alignment_alarm
    for growth in (0.0, 0.02, 0.3):
        run = collapsing_run(growth)
        alert = margins.first_alarm(run)
        assert (alert.step if alert else None) == spectral_alignment_alarm(run)
    assert margins.first_alarm(collapsing_run(0.3)) is not None and margins.first_alarm(collapsing_run(0.0)) is None
    assert spectral_alignment.GROWTH_Z == shipped


def test_just_under_the_margin_the_scaled_rule_alarms_and_just_over_it_does_not(margins, margin_step):
    run = collapsing_run(0.03)
    share, alert = margins.margin(run)
    assert 0 < share and alert is not None and alert.layer == ALIGNED_LAYER
    assert margins.first_alarm(run, share - margin_step) is not None
    assert margins.first_alarm(run, share + margin_step) is None


def test_faster_growth_is_nearer_and_no_collapse_is_no_margin(margins):
    """The margin grows with sigma_1's growth on a collapsed layer; inputs that stay spread never
    meet the collapse test, however fast sigma_1 grows."""
    shares = [margins.margin(collapsing_run(g))[0] for g in (0.02, 0.04, 0.08)]
    assert shares == sorted(shares) and shares[0] < shares[-1]
    assert margins.margin(collapsing_run(0.3, collapse=False)) == (0.0, None)


def test_the_table_lists_controls_only_closest_first(margins):
    rows = margins.margins([collapsing_run(0.02, "control"), collapsing_run(0.3), collapsing_run(0.3, "failing")])
    assert [r["kind"] for r in rows] == ["control_low_lr", "control"]
    assert rows[0]["margin"] >= 1 > rows[1]["margin"] and rows[0]["layer"] == ALIGNED_LAYER
    assert rows[0]["growth"] == pytest.approx(math.exp(3 * 0.3), rel=1e-6)
    assert "| post_ln_without_warmup control_low_lr 3 | " in margins.markdown(rows)
