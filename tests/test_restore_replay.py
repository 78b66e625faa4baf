"""The replay of spectral_alignment's rule across a guard's restores (benchmarks/restore_replay.py)."""

import json

import pytest

LAYER = "blocks.0.attn.qkv"


@pytest.fixture
def replay(benchmark_script):
    return benchmark_script("restore_replay")


def twin(restore_at: int = 17, checks: int = 21) -> dict:
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
    }


def test_today_scores_a_streak_that_spans_the_restore(replay):
    # checks 16, 17 before the restore and 18 after it make today's 3-check streak
    assert replay.alarms(twin(), None, frozenset())[0] == 50 * 18


def test_keep_starts_the_streak_and_the_increments_again_after_a_restore(replay):
    # 18 counts 1 and its increment is not scored; 19 and 20 complete a new streak
    assert replay.alarms(twin(), replay.keep, frozenset())[0] == 50 * 20


def test_rebuild_waits_for_a_new_history(replay):
    # the increment histories start again: no score for 10 checks after the restore, and an alarm
    # on a collapse once they have them
    assert replay.alarms(twin(), replay.rebuild, frozenset()) == []
    assert replay.alarms(twin(restore_at=5, checks=30), replay.rebuild, frozenset())[0] > 50 * 16


def test_a_replay_that_does_not_give_the_saved_alarms_is_refused(replay, tmp_path, capsys):
    run = twin()  # its saved alerts (none) disagree with the rule's alarm at check 18
    (tmp_path / "post_ln_without_warmup-failing-1-rollback.json").write_text(json.dumps(run))
    with pytest.raises(SystemExit, match="not exact"):
        replay.main(["--runs", str(tmp_path)])


def test_the_table_lists_only_the_twins_a_candidate_changes(replay, tmp_path, capsys):
    changed, unchanged = twin(), twin(restore_at=3)
    saved = [{"step": 50 * i, "monitor": "spectral_alignment", "level": "alarm"} for i in (18, 19, 20, 21)]
    changed["alerts"], unchanged["alerts"], unchanged["seed"] = saved, saved, 2
    for run in (changed, unchanged):
        (tmp_path / f"post_ln_without_warmup-failing-{run['seed']}-rollback.json").write_text(json.dumps(run))
    replay.main(["--runs", str(tmp_path)])
    out = capsys.readouterr().out
    assert "| post_ln_without_warmup failing 1 | 850 | 900, 950, 1000, 1050 / 1000, 1050 / none | not saved |" in out
    assert "failing 2 |" not in out
    assert "2 rollback twins; changed: keep 1, rebuild 1" in out
