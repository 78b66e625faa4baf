"""How near each control came to the attention-logit growth alarm (benchmarks/logit_margin.py)."""

import pytest

from rksp_cli.monitors.attention_logits import GROWTH, LAG
from rksp_cli.monitors.failures import WatchedRun
from tests.fakes import saved_run

LAYER = "blocks.1.attn"
WIDTH_64 = ("attention_logit_growth", "low_precision_attention")  # one control run, saved for both


@pytest.fixture
def margins(benchmark_script):
    return benchmark_script("logit_margin")


def control(
    growth: float, kind: str = "control", failure: str = "post_ln_without_warmup", cap: float = 2000.0
) -> WatchedRun:
    """A control checked every 50 steps whose one layer's largest logit starts at 2 and grows
    ``growth``-fold every ``LAG`` checks (so ``growth`` x its low of the last LAG checks) until it
    reaches ``cap``, where it holds; another layer stays at 5."""
    per_check = growth ** (1 / LAG)
    series = [
        {
            "step": 50 * i,
            "metrics": {
                f"attn_logit_max/{LAYER}": min(2.0 * per_check**i, cap),
                "attn_logit_max/blocks.0.attn": 5.0,
                "attn_logit_max": max(min(2.0 * per_check**i, cap), 5.0),  # the all-layer maximum
            },
        }
        for i in range(1, 61)
    ]
    return saved_run(series, "attention_logits", kind, failure, seed=3)


def test_the_margin_is_the_share_of_the_growth_threshold_a_steady_grower_reaches(margins, margin_step):
    """Logits well past the level, growing 3.5x per LAG checks: the growth test binds, at 3.5/3."""
    share, alert = margins.margin(control(3.5))
    assert share == pytest.approx(3.5 / GROWTH, abs=margin_step)
    assert alert is not None and alert.layer == LAYER


def test_just_under_the_margin_the_scaled_rule_alarms_and_just_over_it_does_not(margins, margin_step):
    run = control(2.4)
    share, _ = margins.margin(run)
    assert 0 < share < 1
    assert margins.first_alarm(run, share - margin_step) is not None
    assert margins.first_alarm(run, share + margin_step) is None


def test_at_scale_one_the_replay_is_the_shipped_rule(margins, benchmark_script):
    """``first_alarm`` rebuilds the rule from the module's constants; it must alarm where the
    shipped ``growth_alarm`` does (matched_detectors replays that one), or nowhere with it."""
    attention_logits_alarm = benchmark_script("matched_detectors").attention_logits_alarm
    for growth in (2.0, 3.2, 8.0):
        run = control(growth)
        alert = margins.first_alarm(run)
        assert (alert.step if alert else None) == attention_logits_alarm(run)
    assert margins.first_alarm(control(8.0)) is not None and margins.first_alarm(control(2.0)) is None


def test_logits_that_stay_low_are_as_near_as_their_size_against_the_level(margins, margin_step):
    """Growing 8x but capped at 60, the level binds: 60 / 150 of it."""
    share, _ = margins.margin(control(8.0, cap=60.0))
    assert share == pytest.approx(60.0 / 150.0, abs=margin_step)


def test_the_table_lists_controls_only_closest_first_and_a_shared_control_once(margins):
    shared = [control(2.4, failure=f) for f in WIDTH_64]
    rows = margins.margins([control(1.5), control(3.5, "control_low_lr"), control(3.5, "failing"), *shared])
    assert [r["kind"] for r in rows] == ["control_low_lr", "control", "control"]
    assert [r["failure"] for r in rows][1:] == [" / ".join(WIDTH_64), "post_ln_without_warmup"]
    assert rows[0]["layer"] == LAYER and rows[0]["growth"] == pytest.approx(3.5, rel=0.01)
    assert "| post_ln_without_warmup control_low_lr 3 | 1.17 |" in margins.markdown(rows)
