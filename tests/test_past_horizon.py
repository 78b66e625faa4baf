"""Failing runs trained on past the benchmark's horizon (benchmarks/past_horizon.py)."""

import math
import subprocess
import sys
import threading
import time

import pytest

from rksp_cli.monitors.base import Alert
from rksp_cli.monitors.failures import WatchedRun


@pytest.fixture
def past_horizon(benchmark_script):
    return benchmark_script("past_horizon")


def watched(losses: list[float], alarm_at: int | None) -> WatchedRun:
    alerts = [] if alarm_at is None else [Alert(alarm_at, "attention_logits", None, 9.0, 4.0, "alarm", "grew")]
    n = len(losses)
    return WatchedRun("post_ln_without_warmup", "failing", 7, n, losses, [1.0] * n, None, alerts,
                      ["attention_logits"], 0.1, {})  # fmt: skip


def learning(n: int) -> list[float]:
    return [5.5 - 2.0 * (1 - math.exp(-t / 100)) for t in range(n)]


def test_a_failure_past_the_horizon_gives_the_watched_alarm_its_lead(past_horizon):
    """The watched run (300 steps, no failure) alarmed at 200; trained on, it explodes at 450: a lead
    of 250 steps, over 10% of the run, and the first 300 losses are the watched run's, bit for bit."""
    first = learning(300)
    longer = {"steps": 600, "losses": [*first, *learning(450)[300:]], "exploded_step": 450}
    row = past_horizon.judge(watched(first, 200), longer)
    assert (row["failed"], row["rksp"], row["monitors"], row["lead"], row["lead_bar_met"]) == (
        450, 200, ["attention_logits"], 250, True)  # fmt: skip
    assert row["prefix_identical"] and row["prefix_max_abs_diff"] == 0


def test_a_rerun_that_drifted_from_the_watched_run_says_so(past_horizon):
    """A rerun on other threads or another CPU may round differently: reported, with the difference."""
    first = learning(300)
    drifted = [x + (1e-6 if t > 100 else 0.0) for t, x in enumerate(first)]
    longer = {"steps": 600, "losses": drifted + learning(600)[300:], "exploded_step": None}
    row = past_horizon.judge(watched(first, None), longer)
    assert not row["prefix_identical"] and row["prefix_max_abs_diff"] == pytest.approx(1e-6)
    assert row["failed"] is None and row["lead"] is None and not row["lead_bar_met"]
    assert "did not fail" in past_horizon.markdown([row]) and "no (max diff 1e-06)" in past_horizon.markdown([row])


def test_an_alarm_after_the_failure_is_no_lead(past_horizon):
    first = learning(300)
    row = past_horizon.judge(watched(first, 280), {"steps": 600, "losses": first + learning(300), "exploded_step": 250})
    assert row["failed"] == 250 and row["lead"] is None and not row["lead_bar_met"]


def test_a_second_call_for_a_seed_waits_for_the_first_and_trains_nothing(past_horizon, tmp_path):
    """The make target's rerun and one started by hand share the claim: the later caller blocks until
    the result is saved, then is told not to train."""
    result = tmp_path / "run-to600.json"
    holding, told = threading.Event(), []

    def first() -> None:
        with past_horizon.claimed(result) as mine:
            told.append(("first", mine))
            holding.set()
            time.sleep(0.3)
            result.write_text("{}")

    thread = threading.Thread(target=first)
    thread.start()
    holding.wait(timeout=10)
    with past_horizon.claimed(result) as mine:
        told.append(("second", mine))
        assert result.is_file()  # woke only after the first saved its result
    thread.join()
    assert told == [("first", True), ("second", False)]
    assert not (tmp_path / "run-to600.json.training").exists()


def test_a_claim_whose_holder_was_killed_does_not_hold(past_horizon, tmp_path):
    result = tmp_path / "run-to600.json"
    lock = tmp_path / "run-to600.json.training"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import fcntl, time; f = open({str(lock)!r}, 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
         "print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait(timeout=10)
    with past_horizon.claimed(result) as mine:
        assert mine  # its file is still there, but no lock on it
