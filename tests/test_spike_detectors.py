"""The re-implemented spike detectors fire exactly where their documented rules say, and not before."""

import math
import sys
from collections import defaultdict

import numpy as np
import pytest

from rksp_cli.monitors.spike_detectors import (
    DETECTORS,
    FoundryKillLossSpike,
    LightningSpikeDetection,
    MegatronSpikyLoss,
    OlmoSkipStep,
    first_alarm,
)
from tests.fakes import saved_run


def test_lightning_fires_at_a_rise_of_twice_the_running_mean_not_below_and_never_on_improvement():
    base = [2.0] * 20
    assert first_alarm(LightningSpikeDetection(), [*base, 5.9]) is None  # |5.9 - 2| < 2 x 2
    assert first_alarm(LightningSpikeDetection(), [*base, 6.1]) == 20
    assert first_alarm(LightningSpikeDetection(), [10.0, *base]) is None  # falling is never a spike
    assert first_alarm(LightningSpikeDetection(), [*base, math.nan]) == 20
    assert first_alarm(LightningSpikeDetection(), [100.0, 2.0]) is None  # batch 0 is warmup


def test_olmo_waits_for_64_values_then_skips_beyond_six_sigma_of_loss_or_gradient():
    rng = np.random.default_rng(0)
    noise = list(3.0 + 0.01 * rng.standard_normal(200))
    sigma = float(np.std(noise[:128], ddof=1))
    early = [*noise[:40], 100.0]
    assert first_alarm(OlmoSkipStep(), early) is None  # fewer than 64 values: never skips
    mean = float(np.mean(noise[:128]))
    assert first_alarm(OlmoSkipStep(), [*noise[:128], mean + 4 * sigma]) is None
    assert first_alarm(OlmoSkipStep(), [*noise[:128], mean + 9 * sigma]) == 128
    grads = [1.0 + 0.01 * g for g in rng.standard_normal(129)]
    grads[-1] = 5.0
    assert first_alarm(OlmoSkipStep(), noise[:129], grads) == 128  # the gradient norm alone


def test_foundry_needs_a_full_window_and_more_than_patience_consecutive_outliers():
    flat = [2.0] * 100
    assert first_alarm(FoundryKillLossSpike(), [*flat, 5.0, 5.0, 5.0, 5.0]) is None  # 4 = patience
    assert first_alarm(FoundryKillLossSpike(), [*flat, 5.0, 5.0, 5.0, 5.0, 5.0]) == 104
    assert first_alarm(FoundryKillLossSpike(), [*flat, 5.0, 5.0, 2.0, 5.0, 5.0, 5.0]) is None  # reset
    assert first_alarm(FoundryKillLossSpike(), [50.0] * 50) is None  # window never full
    high = first_alarm(FoundryKillLossSpike(), [11.0] * 300)  # persistently above the loss cap
    assert high == 200


def test_megatron_fires_above_ten_times_the_largest_loss_seen_or_on_nan():
    assert first_alarm(MegatronSpikyLoss(), [3.0, 2.0, 29.0]) is None
    assert first_alarm(MegatronSpikyLoss(), [3.0, 2.0, 31.0]) == 2
    assert first_alarm(MegatronSpikyLoss(), [3.0, math.inf]) == 1


@pytest.mark.parametrize("detector", DETECTORS, ids=lambda d: d.name)
def test_no_detector_fires_on_a_smoothly_falling_loss(detector):
    losses = list(5.0 * np.exp(-np.arange(600) / 200) + 1.0)
    grads = list(1.0 + 0.05 * np.random.default_rng(1).standard_normal(600))
    assert first_alarm(detector(), losses, grads) is None


def test_olmo_skips_while_a_non_finite_value_is_in_its_window_as_torch_does():
    """A NaN loss or gradient norm enters OLMo-core's window like any other; torch's mean and
    standard deviation of it are NaN, so every step skips until it leaves (statistics.stdev raised
    on it instead, once the window held one)."""
    losses = [2.0 + 0.01 * (i % 7) for i in range(200)]
    grads = [1.0 + 0.01 * (i % 5) for i in range(200)]
    for series in (losses, grads):
        marred = list(series)
        marred[10] = math.nan  # under 64 values held: not yet judged, but kept
        trace = (marred, grads) if series is losses else (losses, marred)
        assert first_alarm(OlmoSkipStep(), *trace) == 63
        detector = OlmoSkipStep()
        fired = [detector.update(loss, grad) for loss, grad in zip(*trace, strict=True)]
        assert all(fired[63:139]) and not any(fired[139:])  # 129 values held: gone from step 139


def test_olmo_skips_on_a_constant_history_as_its_torch_code_does():
    """0/0 is NaN in torch and NaN <= 6 is false, so OLMo-core skips a step after a flat window."""
    assert first_alarm(OlmoSkipStep(), [2.0 + 0.01 * (i % 3) for i in range(64)], [1.0] * 64) == 63


def test_matched_setting_stops_at_the_first_false_alarm():
    """The benchmark at matched false alarms keeps what a team turning the knob down would: the last
    setting before the first false alarm, not a quieter one past it."""
    from benchmarks.matched_detectors import matched_setting

    assert matched_setting([0, 0, 1, 3], [10, 5, 2, 1]) == 5
    assert matched_setting([0, 1, 0, 0], [10, 5, 2, 1]) == 10  # quiet again past a false alarm: not taken
    assert matched_setting([0, 0], [10, 5]) == 5
    assert matched_setting([2, 0], [10, 5]) is None


def run(kind: str, seed: int, failed: int | None = None, **alarms: int) -> dict:
    """A replayed run as ``matched_detectors.compare`` reads it: first alarms by watcher key."""
    return {"failure": "f", "kind": kind, "seed": seed, "failed": failed, "alarms": defaultdict(lambda: None, alarms)}


def test_matched_comparison_tunes_on_controls_and_judges_held_out_seeds_only():
    from benchmarks.matched_detectors import RKSP, WITHOUT, compare

    olmo, quiet = OlmoSkipStep.name, "rksp without the R-Metric"
    assert quiet in WITHOUT
    runs = [
        run("control", 0, **{f"{olmo}#1": 300}),  # sigma 50 false-alarms on a tuning control: 100 is kept
        run("failing", 0, failed=500, **{f"{olmo}#0": 10}),  # a tuning seed's failure is not judged
        run("failing", 1, failed=1000, **{f"{olmo}#0": 400, RKSP: 200, quiet: 200}),
        run("failing", 2, failed=1000, **{f"{olmo}#0": 100, RKSP: 600, quiet: 600}),
        run("control", 1, **{RKSP: 50}),  # the R-Metric's false alarm: rksp's, not the quiet set's
    ]
    rows = {r["watcher"]: r for r in compare(runs, held_out={1, 2})}
    assert rows[olmo]["setting"] == 100 and rows[olmo]["alarmed"] == 2 and rows[olmo]["median_lead_steps"] == 750
    assert rows[olmo]["rksp_earlier"] == 1 and rows[olmo]["false_alarms"] == 0
    assert rows[RKSP]["false_alarms"] == 1 and rows[quiet]["false_alarms"] == 0
    assert rows[RKSP]["earlier_than_every_matched_detector"] == 1


def test_matched_comparison_tunes_and_judges_on_every_kind_of_control():
    """A detector is tuned quiet on healthy runs of the failing architecture too (deep Post-LN's
    ``control_low_lr``), and its false alarms are counted per kind of control."""
    from benchmarks.matched_detectors import RKSP, compare

    olmo = OlmoSkipStep.name
    runs = [
        run("control", 0),
        run("control_low_lr", 0, **{f"{olmo}#0": 800}),  # sigma 100 fires on a healthy run of the same architecture
        run("failing", 1, failed=1000, **{f"{olmo}#0": 100, RKSP: 600}),
        run("control", 1),
        run("control_low_lr", 1, **{RKSP: 700}),
    ]
    rows = {r["watcher"]: r for r in compare(runs, held_out={1})}
    assert rows[olmo]["setting"] is None and rows[olmo]["tuning_controls"] == 2  # no setting stays quiet
    assert rows[RKSP]["false_alarms_by_control"] == {"control": "0/1", "control_low_lr": "1/1"}
    assert rows[RKSP]["earlier_than_every_matched_detector"] == 1  # no detector left to beat


def test_a_control_that_failed_is_neither_a_false_alarm_nor_a_tuning_run():
    """A control that exploded (Pre-LN at deep Post-LN's lr, now and then) is no clean run: a detector
    that fired on it found a real failure, so it neither counts as a false alarm held out nor pushes
    the tuned setting up; the comparison lists it apart."""
    from benchmarks.matched_detectors import RKSP, compare, failed_controls

    olmo = OlmoSkipStep.name
    runs = [
        run("control", 0, failed=113, **{f"{olmo}#0": 113}),  # sigma 100 fires on a tuning control's explosion
        run("control_low_lr", 0),
        run("failing", 1, failed=1000, **{f"{olmo}#0": 400, RKSP: 600}),
        run("control", 1),
        run("control", 2, failed=4387, **{f"{olmo}#0": 475, RKSP: 4300}),  # held out, and failed
    ]
    rows = {r["watcher"]: r for r in compare(runs, held_out={1, 2})}
    assert rows[olmo]["setting"] is not None and rows[olmo]["tuning_controls"] == 1  # counted, none would stay quiet
    assert (rows[olmo]["false_alarms"], rows[olmo]["controls"]) == (0, 1)
    assert (rows[RKSP]["false_alarms"], rows[RKSP]["controls"]) == (0, 1)
    assert failed_controls(runs, held_out={1, 2}) == [
        {"failure": "f", "kind": "control", "seed": 2, "failed": 4387, "rksp": 4300}
    ]


def test_matched_comparison_tunes_only_on_the_tuning_seeds():
    """Controls of seeds neither tuned on nor held out (saved from other checks) do not move the
    setting, so the table does not depend on which other runs happen to be saved."""
    from benchmarks.matched_detectors import compare

    olmo = OlmoSkipStep.name
    runs = [
        run("control", 0, **{f"{olmo}#1": 300}),  # sigma 50 false-alarms on the tuning control: 100 is kept
        run("control", 5, **{f"{olmo}#0": 800}),  # another check's control: sigma 100 fires there too
        run("failing", 9, failed=1000, **{f"{olmo}#0": 100}),
        run("control", 9),
    ]
    assert {r["watcher"]: r for r in compare(runs, held_out={9})}[olmo]["setting"] is None
    rows = {r["watcher"]: r for r in compare(runs, held_out={9}, tuning={0})}
    assert rows[olmo]["setting"] == 100 and rows[olmo]["tuning_seeds"] == [0] and rows[olmo]["alarmed"] == 1


def test_a_saved_run_s_spectral_alignment_is_rescored_with_today_s_exemptions():
    """A run watched before the MLP projection (fed by GELU) was left out: its collapse there no longer
    counts, the same collapse on a projection fed by a norm still does."""
    from benchmarks.matched_detectors import activation_fed, spectral_alignment_alarm
    from rksp_cli.monitors.failures import WatchedRun

    assert activation_fed("attention_logit_growth", "failing") == {"blocks.0.mlp.proj", "blocks.1.mlp.proj"}

    def saved(layer: str) -> WatchedRun:
        series = []
        for check in range(30):
            collapsed = check >= 20
            sigma = 1.0 + (0.5 * (check - 19) ** 2 if collapsed else 0.01 * (check % 3))
            series.append(
                {
                    "step": 50 * check,
                    "metrics": {f"sa_entropy/{layer}": 0.1 if collapsed else 1.0, f"sa_sigma1/{layer}": sigma},
                }
            )
        return saved_run(series, "spectral_alignment", failure="attention_logit_growth", losses=[1.0] * 1500)

    assert spectral_alignment_alarm(saved("blocks.0.attn.qkv")) == 50 * 22  # third collapsed check
    assert spectral_alignment_alarm(saved("blocks.0.mlp.proj")) is None


def test_matched_comparison_with_settings_from_an_earlier_one_reproduces_it_without_tuning_runs():
    """``--settings-from``: the settings an earlier comparison tuned, read back from its rows, judge
    the held-out runs exactly as re-tuning would, with no tuning seed's run at hand."""
    from benchmarks.matched_detectors import compare, tuned_settings

    olmo = OlmoSkipStep.name
    tuning_runs = [run("control", 0, **{f"{olmo}#1": 300})]  # sigma 50 false-alarms: 100 is kept
    held_out = [
        run("failing", 9, failed=1000, **{f"{olmo}#0": 100, f"{olmo}#1": 50}),
        run("control", 9, **{f"{olmo}#1": 20}),
    ]
    tuned = compare(tuning_runs + held_out, held_out={9}, tuning={0})
    again = compare(held_out, held_out={9}, settings=tuned_settings({"rows": tuned}))

    def without_tuning_counts(rows: list[dict]) -> list[dict]:
        return [r | {"curve": [{k: v for k, v in c.items() if k != "tuning_false_alarms"} for c in r.get("curve", [])]}
                for r in rows]  # fmt: skip

    assert without_tuning_counts(again) == without_tuning_counts(tuned)
    assert {r["watcher"]: r for r in again}[olmo]["setting"] == 100
    assert all(c["tuning_false_alarms"] is None for r in again for c in r.get("curve", []))
    with pytest.raises(ValueError, match=r"no tuned .* for f"):
        compare(held_out, held_out={9}, settings={})


def test_lead_bar_asks_for_both_100_steps_and_a_tenth_of_the_run():
    """Issue 16's lead bar as the comparison counts it: 150 steps ahead of a failure at step 2000 is
    not 10% of the run; 99 steps ahead of one at 500 is not 100 steps; an alarm after it is no lead."""
    from benchmarks.matched_detectors import RKSP, compare

    runs = [
        run("control", 0),
        run("failing", 1, failed=2000, **{RKSP: 1850}),
        run("failing", 2, failed=500, **{RKSP: 401}),
        run("failing", 3, failed=1000, **{RKSP: 900}),  # exactly 100 steps and 10%: met
        run("failing", 4, failed=1000, **{RKSP: 1001}),
    ]
    rows = {r["watcher"]: r for r in compare(runs, held_out={1, 2, 3, 4})}
    assert rows[RKSP]["alarmed"] == 3 and rows[RKSP]["lead_bar_met"] == 1


def test_failing_runs_are_the_rows_counts_seed_by_seed():
    """The per-run table behind a comparison: each held-out failing run's lead, lead bar and
    earliness, summing to the rksp row's counts, and a run that never failed listed as such."""
    from benchmarks.matched_detectors import RKSP, compare, failing_runs, runs_markdown

    olmo = OlmoSkipStep.name
    runs = [
        run("control", 0, **{f"{olmo}#1": 300}),  # sigma 50 false-alarms: 100 is kept
        run("failing", 1, failed=1000, **{f"{olmo}#0": 400, RKSP: 200}),  # rksp first, 800 ahead
        run("failing", 2, failed=1000, **{f"{olmo}#0": 100, RKSP: 950}),  # OLMo-core first; 50 ahead
        run("failing", 3, **{RKSP: 700}),  # never failed
        run("control", 1),
    ]
    rows = compare(runs, held_out={1, 2, 3})
    table = failing_runs(runs, {1, 2, 3}, rows)
    assert [(r["seed"], r["lead"], r["lead_bar_met"], r["earlier_than_every_matched_detector"]) for r in table] == [
        (1, 800, True, True),
        (2, 50, False, False),
        (3, None, False, False),
    ]
    assert table[0]["matched_detectors"][olmo] == 400
    rksp = {r["watcher"]: r for r in rows}[RKSP]
    assert sum(r["lead_bar_met"] for r in table) == rksp["lead_bar_met"] == 1
    assert sum(r["earlier_than_every_matched_detector"] for r in table) == rksp["earlier_than_every_matched_detector"]
    printed = runs_markdown(table)
    assert "| f | 3 | did not fail | 700 | - | - |" in printed and "| f | 1 | 1000 | 200 (800) | met | yes |" in printed


def test_matched_replay_reads_saved_runs_from_the_folder_it_is_given(benchmark_script, monkeypatch, tmp_path, capsys):
    """``--runs``: another machine's reruns are judged from their own folder; a folder without the
    seeds' runs is named in a one-line refusal (exit 2), and nothing is written."""
    matched = benchmark_script("matched_detectors")
    out = tmp_path / "matched.json"
    argv = ["matched_detectors.py", "--held-out", "9", "--tuning", "0", "--runs", str(tmp_path), "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exited:
        matched.main()
    assert exited.value.code == 2
    assert f"no saved runs of the tuning or held-out seeds under {tmp_path}" in capsys.readouterr().err
    assert not out.exists()


def _noisy_runs(count: int, steps: int = 400) -> list[tuple[list[float], list[float]]]:
    """Loss and gradient-norm traces with the features the detectors react to: a falling loss with
    noise, rises, spikes of every height and width, and now and then a NaN."""
    rng = np.random.default_rng(16)
    runs = []
    for _ in range(count):
        t = np.arange(steps)
        loss = 2.0 + 3.0 * np.exp(-t / rng.uniform(50, 400)) + rng.uniform(0.01, 0.3) * rng.standard_normal(steps)
        grads = np.exp(rng.normal(0.0, rng.uniform(0.1, 1.0), steps))
        for _ in range(rng.integers(0, 6)):
            at, width = rng.integers(0, steps), rng.integers(1, 30)
            loss[at : at + width] *= rng.uniform(1.0, 4.0)
            grads[at : at + width] *= rng.uniform(1.0, 500.0)
        if rng.random() < 0.1:
            loss[rng.integers(0, steps)] = math.nan
        runs.append((list(loss), list(grads)))
    return runs


def test_a_less_sensitive_setting_never_alarms_earlier(benchmark_script):
    """The tuning keeps the last setting before the first false alarm, and the README argues that a
    setting quiet enough for the held-out controls would win fewer races, not more: both rest on a
    detector's first alarm moving only later as its knob is made less sensitive. Lightning's window
    skips the values it flagged, so its state depends on the knob; its first alarm still cannot
    come earlier, and this checks that too, over the swept settings, on varied traces."""
    knobs = benchmark_script("matched_detectors").KNOBS
    for losses, grads in _noisy_runs(120):
        for cls, (knob, _, values) in knobs.items():  # least to most sensitive
            firsts = [first_alarm(cls(**{knob: v}), losses, grads) for v in values]
            steps = [math.inf if f is None else f for f in firsts]
            assert steps == sorted(steps, reverse=True), (cls.name, firsts)
