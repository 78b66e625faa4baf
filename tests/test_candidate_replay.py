"""A stated candidate for a monitor's rule, replayed on saved runs (benchmarks/candidate_replay.py)."""

import pytest
import torch

from rksp_cli.monitors.failures import WatchedRun
from tests.fakes import collapsing_run, saved_run

LAYER = "blocks.11.attn"  # a late attention branch of deep Post-LN's Pre-LN control


@pytest.fixture
def candidate(benchmark_script):
    return benchmark_script("candidate_replay")


def watched(failure: str, monitor: str, kind: str, series: list[dict], steps: int, failed_at: int | None) -> WatchedRun:
    """A saved run of ``failure`` watched by ``monitor`` alone, logging ``series``; its loss falls for
    1000 steps and, in a failing run, goes back to its start at ``failed_at``."""
    losses = [5.5 - 2.0 * min(t / 1000, 1.0) for t in range(steps)]
    if failed_at is not None:
        losses[failed_at:] = [5.5] * (steps - failed_at)
    return saved_run(series, monitor, kind, failure, losses)


def run(kind: str, burst_at: int, checks: int = 30, failed_at: int | None = None, burst: float = 10) -> WatchedRun:
    """A run checked every 50 steps whose one branch sits at a ratio of 0.1 (small wiggles) but for
    a ``burst``-fold burst at check ``burst_at``; a failing run's loss collapses at ``failed_at``."""
    series = [
        {"step": 50 * i, "metrics": {f"sublayer_ratio/{LAYER}": 0.1 * (burst if i == burst_at else 1 + 0.01 * (i % 3))}}
        for i in range(1, checks + 1)
    ]
    return watched("post_ln_without_warmup", "sublayer_ratio", kind, series, 50 * checks, failed_at)


def test_the_candidate_withholds_an_early_burst_and_keeps_a_late_one(candidate):
    """A burst at the 12th check scores under a baseline of 10 checks of history, not under 16; one at
    the 25th scores under both, at the same step."""
    history = candidate.KNOBS["min_history"]
    early, late = (
        candidate.replay(run("control", 12), history, 16, 10),
        candidate.replay(run("control", 25), history, 16, 10),
    )
    assert (early["baseline"]["sublayer_ratio"], early["candidate"]["sublayer_ratio"]) == (600, None)
    assert late["baseline"]["sublayer_ratio"] == late["candidate"]["sublayer_ratio"] == 1250


def test_the_baseline_defaults_to_the_shipped_rule(candidate):
    """Without a baseline the replay's is the shipped minimum history: a burst before it is withheld."""
    from rksp_cli.monitors.sublayer_ratio import MIN_HISTORY

    history = candidate.KNOBS["min_history"]
    before, after = (
        candidate.replay(run("control", MIN_HISTORY), history, 1),
        candidate.replay(run("control", MIN_HISTORY + 1), history, 1),
    )
    assert before["baseline"]["sublayer_ratio"] is None and before["candidate"]["sublayer_ratio"] == 50 * MIN_HISTORY
    assert after["baseline"]["sublayer_ratio"] == after["candidate"]["sublayer_ratio"] == 50 * (MIN_HISTORY + 1)


def test_the_summary_counts_control_alarms_and_moved_failing_runs(candidate):
    """A control's early burst is the baseline's false alarm and not the candidate's; a failing run whose only
    alarm was early loses it (moved, and its lead bar with it); one alarmed late keeps both. A control
    that failed itself is no clean run: its burst counts as no false alarm."""
    history = candidate.KNOBS["min_history"]
    rows = [
        candidate.replay(run("control", 12), history, 16, 10),
        candidate.replay(run("control", 12, failed_at=1400), history, 16, 10),
        candidate.replay(run("failing", 12, failed_at=1400), history, 16, 10),
        candidate.replay(run("failing", 20, failed_at=1400), history, 16, 10),
    ]
    s = candidate.summary(rows, history)
    assert (s["controls"], s["failed"]) == (1, 2)
    assert s["baseline"] == {"sublayer_ratio_control_alarms": 1, "rksp_control_alarms": 1, "lead_bar_met": 2}
    assert s["candidate"] == {"sublayer_ratio_control_alarms": 0, "rksp_control_alarms": 0, "lead_bar_met": 1}
    assert s["failing_runs_moved"] == [
        {"failure": "post_ln_without_warmup", "seed": 7, "baseline": 600, "candidate": None}
    ]
    table = candidate.markdown(rows, history, 10, 16)
    assert "| 600 / - |" in table and "met/-" in table and "10 checks / 16 checks" in table


def logit_run(kind: str, logits: list[float], failed_at: int | None = None) -> WatchedRun:
    """A width-64 run checked every 50 steps whose one attention layer logs ``logits`` as its largest
    logit; a failing run's loss collapses at ``failed_at``."""
    series = [
        {"step": 50 * (i + 1), "metrics": {"attn_logit_max/blocks.1.attn": v, "attn_logit_max": v}}
        for i, v in enumerate(logits)
    ]
    return watched("low_precision_attention", "attention_logits", kind, series, 50 * (len(logits) + 6), failed_at)


def test_a_looser_logit_growth_alarms_on_growth_a_tighter_one_lets_pass(candidate):
    """Logits at 2.6-2.9x their low of the last 4 checks, above the level, are growth at 2.5 and not
    at 3 (shipped until seeds 108-113): the candidate alarms at the third such check, the baseline
    not at all. Growth of 5x per check alarms under both, at the same step."""
    growth = candidate.KNOBS["logit_growth"]
    slow = logit_run("failing", [60, 60, 60, 60, 160, 170, 165, 168], failed_at=500)
    fast = logit_run("failing", [60, 60, 60, 60, 300, 1500, 7500, 7500], failed_at=500)
    s, f = candidate.replay(slow, growth, 2.5, 3.0), candidate.replay(fast, growth, 2.5, 3.0)
    assert (s["baseline"]["attention_logits"], s["candidate"]["attention_logits"]) == (None, 350)
    assert f["baseline"]["attention_logits"] == f["candidate"]["attention_logits"] == 350
    table = candidate.markdown([s, f], growth, 3.0, 2.5)
    assert "`attention_logits` alarm: growth 3 / growth 2.5" in table and "| - / 350 |" in table
    assert (s["baseline"]["lead_bar_met"], s["candidate"]["lead_bar_met"]) == (False, True)  # it failed after


def test_the_replayed_shipped_logit_rule_is_the_monitor_s(candidate):
    """The replay's baseline is the monitor's own rule: fed the same logits, the alarm of a live
    ``AttentionLogits`` and the replay's fire at the same check."""
    from rksp_cli.models.gpt import GPT, GPTConfig
    from rksp_cli.monitors.attention_entropy import find_attention
    from rksp_cli.monitors.attention_logits import AttentionLogits

    for logits in ([60, 60, 60, 60, 200, 700, 2400, 9000], [60, 60, 60, 60, 160, 170, 165, 168]):
        alarm = AttentionLogits(find_attention(GPT(GPTConfig(n_layers=1)))).alarm
        steps = [50 * (i + 1) for i, v in enumerate(logits) if alarm.update(50 * (i + 1), "blocks.0.attn", v)]
        replayed = candidate.replay(logit_run("failing", logits), candidate.KNOBS["logit_growth"], 3.0)
        assert replayed["baseline"]["attention_logits"] == (steps[0] if steps else None)


def r_run(kind: str, losses: list[float]) -> WatchedRun:
    """A run checked every 50 steps by a live R-Metric (gradients that never change), ``losses[i]``
    its loss through check i's 50 steps, saved with its logged components as a watched run is."""
    from torch import nn

    from rksp_cli.monitors.r_metric import RMetric

    model = nn.Linear(2, 2)
    model.weight.grad, model.bias.grad = torch.ones(2, 2), torch.ones(2)
    metric = RMetric(model)
    per_step = [loss for loss in losses for _ in range(50)]
    series = [{"step": s, "metrics": metric.check(s, per_step[s])[0]} for s in range(0, len(per_step), 50)]
    return saved_run(series, "r_metric", kind, losses=per_step)


def test_the_r_metric_candidate_withholds_a_fall_and_keeps_a_rise(candidate):
    """After a noisy plateau, a loss drop far below its recent mean is the |dL| rule's alarm and not
    the rises-only rule's (the false alarm of Pre-LN 161); a rise as far above it is both rules'."""
    knob = candidate.KNOBS["r_rises_only"]
    plateau = [3.0 + 0.01 * ((7 * t) % 5) for t in range(40)]
    fall = candidate.replay(r_run("control", [*plateau, 2.0, 2.0]), knob, True, baseline=False)
    rise = candidate.replay(r_run("failing", [*plateau, 4.0, 4.0]), knob, True, baseline=False)
    assert (fall["baseline"]["r_metric"], fall["candidate"]["r_metric"]) == (2000, None)
    assert rise["baseline"]["r_metric"] == rise["candidate"]["r_metric"] == 2000
    shipped = candidate.r_metric_alarm
    assert (shipped(r_run("control", [*plateau, 2.0, 2.0])), knob.shipped) == (None, True)  # the monitor's rule
    table = candidate.markdown([fall, rise], knob, False, True)
    assert "`r_metric` alarm: |dL| / rises only" in table and "| 2000 / - |" in table


def entropy_run(kind: str, dips: dict[int, list[int]], checks: int = 70) -> WatchedRun:
    """A run checked every 50 steps whose attention layers' QK-update entropies sit near 0.8 and fall
    15% at the checks ``dips`` lists for a block."""
    series = [
        {
            "step": 50 * t,
            "metrics": {
                f"qk_entropy_mean/blocks.{b}.attn": 0.68 if t in dips.get(b, ()) else 0.8 * (1 + 0.01 * ((7 * t) % 5))
                for b in range(12)
            },
        }
        for t in range(checks)
    ]
    return watched("post_ln_without_warmup", "attention_entropy", kind, series, 50 * checks, None)


def test_the_entropy_candidate_withholds_a_lone_layer_and_keeps_a_joined_one(candidate):
    """One block's three-check dip is the shipped rule's alarm and not the corroborated rule's (the
    false alarm of Pre-LN 172); two blocks dipping together are both rules' alarm."""
    knob = candidate.KNOBS["ae_corroborate"]
    lone = candidate.replay(entropy_run("control", {3: [60, 61, 62]}), knob, 2)
    both = candidate.replay(entropy_run("control", {3: [60, 61, 62], 4: [60, 61, 62]}), knob, 2)
    assert (lone["baseline"]["attention_entropy"], lone["candidate"]["attention_entropy"]) == (3100, None)
    assert both["baseline"]["attention_entropy"] == both["candidate"]["attention_entropy"] == 3100
    assert knob.shipped == 1  # judged on 174-179 and never shipped without the lone exemption
    table = candidate.markdown([lone, both], knob, 1, 2)
    assert "`attention_entropy` alarm: 1 layer(s) / 2 layer(s)" in table and "| 3100 / - |" in table


def test_the_alone_fall_rule_lets_only_a_deep_lone_fall_alarm(candidate):
    """A lone block's 15% dip alarms under every rule up to a 15% fall, as under the one-layer rule
    (fall 0) and the shipped one (10%); at 20% it waits for a second block."""
    knob = candidate.KNOBS["ae_alone_fall"]
    lone = entropy_run("control", {3: [60, 61, 62]})
    assert candidate.attention_entropy_alarm(lone) == 3100  # the shipped rule
    deep, shallow = (candidate.replay(lone, knob, fall, baseline=0.0) for fall in (0.1, 0.2))
    assert deep["baseline"]["attention_entropy"] == deep["candidate"]["attention_entropy"] == 3100
    assert (shallow["baseline"]["attention_entropy"], shallow["candidate"]["attention_entropy"]) == (3100, None)
    assert knob.shipped == 0.1  # judged on 180-185 and shipped from 186 on
    assert "`attention_entropy` alarm: alone at 0% / alone at 20%" in candidate.markdown([shallow], knob, 0.0, 0.2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--min-history", "0"], "--min-history 0: a rule needs a whole number"),
        (["--min-history", "2.5"], "--min-history 2.5: a rule needs a whole number"),
        (["--logit-growth", "1"], "--logit-growth 1: a growth factor is a number above 1"),
        (["--logit-growth", "2.5", "--baseline", "x"], "--baseline x: a growth factor is a number above 1"),
        (["--min-history", "10", "--logit-growth", "2.5"], "not allowed with argument"),
        (["--r-rises-only", "maybe"], "--r-rises-only maybe: say yes or no"),
        (["--ae-corroborate", "0"], "--ae-corroborate 0: a rule needs a whole number of layers"),
        (["--ae-alone-fall", "1.5"], "--ae-alone-fall 1.5: a fall is a fraction of the median, from 0 to 1"),
        (["--ae-alone-fall", "x"], "--ae-alone-fall x: a fall is a fraction of the median, from 0 to 1"),
        (["--sublayer-floor", "-0.1"], "--sublayer-floor -0.1: a floor is a ratio of branch to shortcut"),
        (["--sublayer-floor", "inf"], "--sublayer-floor inf: a floor is a ratio of branch to shortcut"),
        (["--alignment-growth-scale", "0"], "--alignment-growth-scale 0: a scale is a positive number"),
    ],
)
def test_bad_knob_values_are_one_line_and_exit_2(candidate, monkeypatch, capsys, args, message):
    monkeypatch.setattr("sys.argv", ["candidate_replay.py", "--seeds", "0-1", *args])
    with pytest.raises(SystemExit) as exc:
        candidate.main()
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_the_scale_moves_the_sublayer_thresholds_together(candidate):
    """A burst to 2.7x the branch's usual ratio (and 2.7x the last check) is short of the fold of 3
    that seeds 60-217 ask and over 0.85 of it; one to 3.3x passes both. Never shipped, the knob's
    baseline is that rule: without one, each run's alarm is the one seeds 60-217 got."""
    scale = candidate.KNOBS["sublayer_scale"]
    short, clear = run("control", 20, burst=2.7), run("control", 20, burst=3.3)
    for r in (short, clear):
        former = candidate.sublayer_ratio_alarm(r, thresholds=candidate.SUBLAYER_60_217)
        assert candidate.replay(r, scale, 0.85)["baseline"]["sublayer_ratio"] == former
    short, clear = candidate.replay(short, scale, 0.85, 1.0), candidate.replay(clear, scale, 0.85, 1.0)
    assert (short["baseline"]["sublayer_ratio"], short["candidate"]["sublayer_ratio"]) == (None, 1000)
    assert clear["baseline"]["sublayer_ratio"] == clear["candidate"]["sublayer_ratio"] == 1000


def test_the_fold_and_z_scale_keeps_the_jump_test(candidate):
    """A branch at 1.5x its usual ratio, then 2.7x at the next check: past 0.85 of the fold and z
    tests, and a jump of 1.8x, which the 0.85 scale of all three passes and the jump test of 2x kept
    by the fold-and-z knob does not. A lone burst to 2.7x passes both; the shipped value replays
    today's rule."""
    fold_z, scale = candidate.KNOBS["sublayer_fold_z_scale"], candidate.KNOBS["sublayer_scale"]
    lone = run("control", 20, burst=2.7)
    stepped = run("control", 20, burst=2.7)
    stepped.series[18]["metrics"][f"sublayer_ratio/{LAYER}"] = 0.15  # the check before the burst
    for r in (lone, stepped):
        assert candidate.replay(r, fold_z, 0.85)["baseline"]["sublayer_ratio"] == candidate.sublayer_ratio_alarm(r)
    assert candidate.replay(lone, fold_z, 0.85, 1.0)["candidate"]["sublayer_ratio"] == 1000
    assert candidate.replay(stepped, scale, 0.85, 1.0)["candidate"]["sublayer_ratio"] == 1000
    assert candidate.replay(stepped, fold_z, 0.85, 1.0)["candidate"]["sublayer_ratio"] is None


def test_the_floor_silences_a_burst_of_a_small_branch_and_keeps_a_large_one(candidate):
    """A branch at 0.4% of its shortcut bursts tenfold to 4% at the 20th check (width-64 control 272's
    kind), then a hundredfold to 40% at the 26th: with no floor (the rule until seed 289) the first
    alarms; under the floor of 0.1, shipped since, it does not, and the second still does, at its
    own check."""
    floor = candidate.KNOBS["sublayer_floor"]
    assert floor.shipped == 0.1
    small = run("control", 20)
    for check in small.series:
        check["metrics"][f"sublayer_ratio/{LAYER}"] *= 0.04
    small.series[25]["metrics"][f"sublayer_ratio/{LAYER}"] = 0.4
    replayed = candidate.replay(small, floor, 0.1, baseline=0.0)
    assert replayed["baseline"]["sublayer_ratio"] == candidate.sublayer_ratio_alarm(small, floor=0.0) == 1000
    assert replayed["candidate"]["sublayer_ratio"] == candidate.sublayer_ratio_alarm(small) == 1300
    large = candidate.replay(run("control", 20), floor, 0.1, baseline=0.0)  # 0.1 bursting to 1.0
    assert large["baseline"]["sublayer_ratio"] == large["candidate"]["sublayer_ratio"] == 1000


def test_the_alignment_scale_withholds_growth_short_of_it_and_keeps_a_surge(candidate, benchmark_script, margin_step):
    """A collapsed layer whose sigma_1 grew to a share s of the growth threshold alarms under the
    threshold times just under s and not just over it (the candidate stated for 482 on is 1.25); a
    surge alarms under both, at the same check. At the shipped 1, the replay is the monitor's."""
    knob = candidate.KNOBS["alignment_growth_scale"]
    shipped = benchmark_script("matched_detectors").spectral_alignment_alarm
    slow, surge = collapsing_run(0.03), collapsing_run(0.3)
    share, _ = benchmark_script("alignment_margin").margin(slow)
    for r in (slow, surge):
        assert candidate.replay(r, knob, 1.25)["baseline"]["spectral_alignment"] == shipped(r)
    slowed = candidate.replay(slow, knob, share + margin_step, baseline=share - margin_step)
    assert slowed["baseline"]["spectral_alignment"] is not None and slowed["candidate"]["spectral_alignment"] is None
    surged = candidate.replay(surge, knob, 1.25)
    assert surged["baseline"]["spectral_alignment"] == surged["candidate"]["spectral_alignment"] is not None
