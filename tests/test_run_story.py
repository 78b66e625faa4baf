"""The facts a held-out set's write-up quotes, printed from its saved runs (benchmarks/run_story.py)."""

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from rksp_cli.monitors.base import Alert
from tests.fakes import saved_run

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def stories(benchmark_script):
    return benchmark_script("run_story")


def _checks(values: list[float], key: str = "sublayer_ratio/blocks.3.mlp") -> list[dict]:
    return [{"step": 50 * (i + 1), "metrics": {key: v, "steady": 1.0 + 0.01 * (i % 3)}} for i, v in enumerate(values)]


def test_surging_steps_within_the_gap_are_one_surge_and_a_non_finite_norm_is_the_largest(stories):
    norms = [1.0] * 400
    norms[10], norms[60], norms[70] = 25.0, 30.0, stories.SURGE  # 70: at the threshold, not over it
    norms[300], norms[301] = 21.0, math.nan
    assert stories.surges(norms) == [(10, 60, 30.0), (300, 301, math.inf)]
    assert stories.surges(norms, gap=49) == [(10, 10, 25.0), (60, 60, 30.0), (300, 301, math.inf)]
    assert stories.surges([1.0] * 50) == []


def test_the_best_loss_is_the_lowest_trailing_window_mean(stories):
    losses = [5.0 - 0.01 * t + 0.3 * math.sin(t) for t in range(250)]
    window = 100
    brute = min(statistics.fmean(losses[t - window : t]) for t in range(window, len(losses) + 1))
    assert stories.best_mean(losses, window) == pytest.approx(brute, rel=1e-12)
    assert stories.best_mean(losses[:99], window) is None


def test_the_quiet_line_names_the_signal_that_moved_most_at_the_last_check(stories):
    values = [0.1 * (1 + 0.02 * (i % 4)) for i in range(30)] + [0.5]
    run = saved_run(_checks(values), "sublayer_ratio", losses=[4.0] * 1600, exploded_step=1560)
    z, key, step = stories.quiet(run, before=1560)
    assert key == "sublayer_ratio/blocks.3.mlp" and step == 1550 and z > 100
    z_before, _, step_before = stories.quiet(run, before=1549)  # the jump not yet checked
    assert step_before == 1500 and z_before < 5
    assert stories.quiet(run, before=200) is None  # four checks: too few to score


def test_a_signal_with_a_flat_history_is_left_out_not_scored_infinite(stories):
    """A sign entropy pinned at 0 bit that lifts to 0.05 has no robust scale: naming it with an
    infinite z would hide the signal that did move against a spread."""
    checks = _checks([0.0] * 20 + [0.05], key="sa_entropy/blocks.11.mlp.proj")
    for i, check in enumerate(checks):
        check["metrics"]["sublayer_ratio/blocks.3.mlp"] = 0.1 * (1 + 0.02 * (i % 4)) if i < 20 else 0.2
    z, key, _ = stories.quiet(saved_run(checks, "sublayer_ratio", losses=[4.0] * 1100, exploded_step=1060), 1060)
    assert key == "sublayer_ratio/blocks.3.mlp" and math.isfinite(z) and z > 10
    flat = [{"step": 50 * (i + 1), "metrics": {"sa_entropy_min": 0.0 if i < 20 else 0.05}} for i in range(21)]
    assert stories.quiet(saved_run(flat, "spectral_alignment", losses=[4.0] * 1100, exploded_step=1060), 1060) is None


def test_a_failure_with_no_alarm_says_so_and_one_with_alarms_names_each_monitors_first(stories):
    values = [0.1] * 20
    silent = saved_run(_checks(values), "sublayer_ratio", losses=[4.0] * 1000, exploded_step=990)
    lines = stories.story(silent)
    assert lines[0].startswith("post_ln_without_warmup failing 7: failed at 990 (exploded)")
    assert any(line.startswith("no rksp alarm before the failure") for line in lines)
    loud = saved_run(_checks(values), "sublayer_ratio", losses=[4.0] * 1000, exploded_step=990)
    loud.alerts = [
        Alert(700, "sublayer_ratio", "blocks.4.mlp", 3.0, 2.55, "alarm", "later"),
        Alert(500, "sublayer_ratio", "blocks.3.mlp", 3.0, 2.55, "alarm", "a burst"),
        Alert(500, "sublayer_ratio", "blocks.5.mlp", 3.0, 2.55, "alarm", "a burst"),
        Alert(600, "r_metric", None, 0.6, 0.57, "alarm", "R over"),
    ]
    lines = stories.story(loud)
    firsts = [line for line in lines if line.startswith("first ")]
    assert firsts == [
        "first sublayer_ratio alarm at 500 on blocks.3.mlp and 1 more: a burst",
        "first r_metric alarm at 600 on the model: R over",
    ]
    assert not any(line.startswith("no rksp alarm") for line in lines)


def test_a_twin_tells_what_it_did_and_a_run_that_never_failed_says_by_when(stories):
    twin = saved_run(_checks([0.1] * 20), "sublayer_ratio", losses=[4.0 - 0.001 * t for t in range(1000)])
    twin.policy = "rollback"
    twin.actions = [{"step": 850, "action": "rollback", "what": "restored the state of step 500", "by": ["r_metric"]}]
    lines = stories.story(twin)
    assert lines[0].startswith("post_ln_without_warmup failing 7 (rollback): did not fail by 1000")
    assert "acted at 850: rollback, restored the state of step 500 (r_metric)" in lines


def test_a_twin_sent_back_to_an_early_state_is_judged_on_how_it_ended(stories):
    """A rollback to step 0 puts the loss back at its start, which the failure label reads as lost;
    the twin that then learns again ended healthy, and says so (seed 395's twin read "failed")."""
    losses = [5.5 - 0.002 * t for t in range(1000)] + [5.5 - 0.002 * t for t in range(1000)]
    twin = saved_run(_checks([0.1] * 40), "sublayer_ratio", losses=losses)
    twin.policy = "rollback"
    twin.actions = [{"step": 1000, "action": "rollback", "what": "restored the state of step 0", "by": ["r_metric"]}]
    assert twin.failed_step is not None and twin.failed_step > 1000 and not twin.ended_failed
    lines = stories.story(twin)
    assert lines[0].startswith(
        f"post_ln_without_warmup failing 7 (rollback): did not end failed by 2000 (passed the failure line at "
        f"{twin.failed_step}, after acting at 1000)"
    )
    assert not any(line.startswith("no rksp alarm") for line in lines)
    twin.losses = losses[:1000] + [5.5] * 1000  # never learned again: failed, as the label says
    assert twin.ended_failed and stories.story(twin)[0].startswith(
        f"post_ln_without_warmup failing 7 (rollback): failed at {twin.failed_step} (lost)"
    )


def test_the_command_reads_runs_and_twins_skips_retrains_and_fits_a_ci_log(tmp_path):
    script = ROOT / "benchmarks" / "run_story.py"
    done = subprocess.run(
        [sys.executable, str(script), "--seeds", "5-6", "--runs", str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == 2 and "no saved runs of seeds 5-6" in done.stderr
    run = saved_run(_checks([0.1] * 20), "sublayer_ratio", losses=[4.0] * 1000, exploded_step=990, seed=5)
    run.check_seconds = {"sublayer_ratio": 0.002}
    (tmp_path / "post_ln_without_warmup-failing-5.json").write_text(json.dumps(run.as_dict()))
    (tmp_path / "post_ln_without_warmup-failing-5-to10000.json").write_text(json.dumps({"seed": 5, "losses": []}))
    (tmp_path / "post_ln_without_warmup-failing-7.json").write_text(json.dumps(run.as_dict() | {"seed": 7}))
    done = subprocess.run(
        [sys.executable, str(script), "--seeds", "5-6", "--runs", str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("post_ln_without_warmup failing") == 1 and "final" not in done.stdout  # none saved
    assert "cost a step: sublayer_ratio 0.04%" in done.stdout  # 0.002 s over 50 steps of 0.1 s
    assert max(len(line) for line in done.stdout.splitlines()) <= 80
