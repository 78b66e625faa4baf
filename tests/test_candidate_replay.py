"""A stated candidate for the sub-layer burst rule, replayed on saved runs (benchmarks/candidate_replay.py)."""

from pathlib import Path

import pytest

from rksp_cli.monitors.failures import WatchedRun

ROOT = Path(__file__).resolve().parent.parent
LAYER = "blocks.11.attn"  # a late attention branch of deep Post-LN's Pre-LN control


@pytest.fixture
def candidate(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # the scripts import their siblings
    import candidate_replay

    return candidate_replay


def run(kind: str, burst_at: int, checks: int = 30, failed_at: int | None = None) -> WatchedRun:
    """A run checked every 50 steps whose one branch sits at a ratio of 0.1 (small wiggles) but for
    a 10x burst at check ``burst_at``; a failing run's loss collapses at ``failed_at``."""
    series = [
        {"step": 50 * i, "metrics": {f"sublayer_ratio/{LAYER}": 1.0 if i == burst_at else 0.1 * (1 + 0.01 * (i % 3))}}
        for i in range(1, checks + 1)
    ]
    n = 50 * checks
    losses = [5.5 - 2.0 * min(t / 1000, 1.0) for t in range(n)]
    if failed_at is not None:
        losses[failed_at:] = [5.5] * (n - failed_at)
    return WatchedRun("post_ln_without_warmup", kind, 7, n, losses, [1.0] * n, None, [], ["sublayer_ratio"],
                      0.1, {}, series=series)  # fmt: skip


def test_the_candidate_withholds_an_early_burst_and_keeps_a_late_one(candidate):
    """A burst at the 12th check scores under a baseline of 10 checks of history, not under 16; one at
    the 25th scores under both, at the same step."""
    early, late = candidate.replay(run("control", 12), 16, 10), candidate.replay(run("control", 25), 16, 10)
    assert (early["baseline"]["sublayer_ratio"], early["candidate"]["sublayer_ratio"]) == (600, None)
    assert late["baseline"]["sublayer_ratio"] == late["candidate"]["sublayer_ratio"] == 1250


def test_the_baseline_defaults_to_the_shipped_rule(candidate):
    """Without a baseline the replay's is the shipped minimum history: a burst before it is withheld."""
    from rksp_cli.monitors.sublayer_ratio import MIN_HISTORY

    before, after = (
        candidate.replay(run("control", MIN_HISTORY), 1),
        candidate.replay(run("control", MIN_HISTORY + 1), 1),
    )
    assert before["baseline"]["sublayer_ratio"] is None and before["candidate"]["sublayer_ratio"] == 50 * MIN_HISTORY
    assert after["baseline"]["sublayer_ratio"] == after["candidate"]["sublayer_ratio"] == 50 * (MIN_HISTORY + 1)


def test_the_summary_counts_control_alarms_and_moved_failing_runs(candidate):
    """A control's early burst is the baseline's false alarm and not the candidate's; a failing run whose only
    alarm was early loses it (moved, and its lead bar with it); one alarmed late keeps both."""
    rows = [
        candidate.replay(run("control", 12), 16, 10),
        candidate.replay(run("failing", 12, failed_at=1400), 16, 10),
        candidate.replay(run("failing", 20, failed_at=1400), 16, 10),
    ]
    s = candidate.summary(rows)
    assert (s["controls"], s["failed"]) == (1, 2)
    assert s["baseline"] == {"sublayer_ratio_control_alarms": 1, "rksp_control_alarms": 1, "lead_bar_met": 2}
    assert s["candidate"] == {"sublayer_ratio_control_alarms": 0, "rksp_control_alarms": 0, "lead_bar_met": 1}
    assert s["failing_runs_moved"] == [
        {"failure": "post_ln_without_warmup", "seed": 7, "baseline": 600, "candidate": None}
    ]
    table = candidate.markdown(rows, 10, 16)
    assert "| 600 / - |" in table and "met/-" in table and "10 / 16 checks" in table
