"""The replay of spectral_alignment's rule across a guard's restores (benchmarks/restore_replay.py)."""

import json

import pytest

LAYER = "blocks.0.attn.qkv"
UNTOLD_CODE = "c55e6e62ca8c3122"  # the monitor code before spectral_alignment was told of restores


@pytest.fixture
def replay(benchmark_script):
    return benchmark_script("restore_replay")


def twin(restore_at: int = 17, checks: int = 21, code: str = UNTOLD_CODE) -> dict:
    """A guarded run checked every 50 steps whose one layer spreads (1 bit) with sigma_1 growing a
    steady 1% a check, then from check 16 on collapses (0 bit) with sigma_1 growing 20% a check;
    rolled back at check ``restore_at``."""
    series = []
    log_sigma = 0.0
    for i in range(1, checks + 1):
        collapsed = i >= 16
        log_sigma += 0.2 if collapsed else 0.01
        metrics = {f"sa_entropy/{LAYER}": 0.0 if collapsed else 1.0, f"sa_sigma1/{LAYER}": 2.718281828**log_sigma}
        series.append({"step": 50 * i, "metrics": metrics})
    return {
        "failure": "post_ln_without_warmup",
        "kind": "failing",
        "seed": 1,
        "series": series,
        "actions": [{"step": 50 * restore_at, "action": "rollback"}],
        "alerts": [],
        "monitor_code": code,
    }


def test_untold_the_rule_scores_a_streak_that_spans_the_restore(replay):
    # checks 16, 17 before the restore and 18 after it make the untold rule's 3-check streak
    assert replay.alarms(twin(), False, frozenset())[0] == 50 * 18


def test_told_the_rule_waits_for_a_new_history(replay):
    # the streaks and increment histories start again: no score for 10 checks after the restore, and
    # an alarm on a collapse once they have them
    assert replay.alarms(twin(), True, frozenset()) == []
    assert replay.alarms(twin(restore_at=5, checks=30), True, frozenset())[0] > 50 * 16


def test_a_replay_that_does_not_give_the_saved_alarms_is_refused(replay, tmp_path):
    run = twin()  # its saved alerts (none) disagree with the untold rule's alarm at check 18
    (tmp_path / "post_ln_without_warmup-failing-1-rollback.json").write_text(json.dumps(run))
    with pytest.raises(SystemExit, match="not exact"):
        replay.main(["--runs", str(tmp_path)])


def test_a_twin_run_under_todays_code_is_replayed_told(replay, tmp_path, capsys):
    run = twin(code="today")  # no saved alarm: what the told rule gives, not the untold one
    (tmp_path / "post_ln_without_warmup-failing-1-rollback.json").write_text(json.dumps(run))
    replay.main(["--runs", str(tmp_path)])
    assert "| 850 | 900, 950, 1000, 1050 / none | not saved |" in capsys.readouterr().out


def test_the_table_lists_only_the_twins_telling_changes(replay, tmp_path, capsys):
    changed, unchanged = twin(), twin(restore_at=3)
    saved = [{"step": 50 * i, "monitor": "spectral_alignment", "level": "alarm"} for i in (18, 19, 20, 21)]
    changed["alerts"], unchanged["alerts"], unchanged["seed"] = saved, saved, 2
    for run in (changed, unchanged):
        (tmp_path / f"post_ln_without_warmup-failing-{run['seed']}-rollback.json").write_text(json.dumps(run))
    once = twin(restore_at=17, checks=30)
    (tmp_path / "post_ln_without_warmup-failing-1-rollback-once.json").write_text(json.dumps(once))
    replay.main(["--runs", str(tmp_path)])
    out = capsys.readouterr().out
    assert "| post_ln_without_warmup failing 1 | 850 | 900, 950, 1000, 1050 / none | none |" in out
    assert "failing 2 |" not in out
    assert "2 rollback twins; changed by telling the rule of restores: 1" in out
