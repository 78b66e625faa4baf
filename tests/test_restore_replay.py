"""The replay of spectral_alignment's rule across a guard's restores (benchmarks/restore_replay.py)."""

import json
import math

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


# `sublayer_ratio` (``--rule sublayer_ratio``): a run whose first 20 checks burst as early training
# does, then settle; a burst at check 40 rolls it back to the state of check 20 (step 1000), and the
# restored run bursts again as it did then.
BRANCH = "blocks.0.mlp"
BURSTS = (0.05, 0.2, 0.06, 0.35, 0.05, 0.12, 0.3, 0.055, 0.25, 0.05)


def sublayer_twin(checks: int = 50, seed: int = 1, code: str = "today") -> dict:
    ratios = []
    for i in range(1, checks + 1):
        if i <= 20:
            ratio = BURSTS[(i - 1) % 10]
        elif i < 40:
            ratio = 0.05 * (1 + 0.02 * ((i * 7) % 5 - 2))  # settled
        elif i == 40:
            ratio = 0.4  # the burst that acts
        else:
            ratio = BURSTS[(i - 41) % 10]  # the restored state of check 20 bursts again
        ratios.append({"step": 50 * i, "metrics": {f"sublayer_ratio/{BRANCH}": ratio}})
    return {
        "failure": "post_ln_without_warmup",
        "kind": "failing",
        "seed": seed,
        "series": ratios,
        "actions": [rollback(2000)],
        "alerts": [],
        "monitor_code": code,
    }


def rollback(step: int, by: tuple[str, ...] = ("sublayer_ratio",)) -> dict:
    return {"step": step, "action": "rollback", "what": "restored the state of step 1000", "by": list(by)}


def test_kept_the_sublayer_rule_scores_the_replayed_bursts_against_the_settled_history(replay):
    kept = replay.sublayer_alarms(sublayer_twin(), rewind=False)
    assert kept[0] == 2000 and len(kept) > 1 and all(step > 2000 for step in kept[1:])


def test_rewound_the_sublayer_rule_reads_them_as_the_run_did_the_first_time(replay):
    assert replay.sublayer_alarms(sublayer_twin(), rewind=True) == [2000]


def test_the_first_change_is_the_first_rollback_rewinding_removes_or_adds(replay):
    run = sublayer_twin()
    kept = replay.sublayer_alarms(run, rewind=False)
    added = next(step for step in range(2050, 2500, 50) if step not in kept)
    assert replay.first_change(run, kept, [2000, added]) == ("adds", added)  # the run acted once
    run["actions"].append(rollback(kept[1]))
    assert replay.first_change(run, kept, [2000]) == ("removes", kept[1])
    run["actions"][1] = rollback(kept[1], by=("sublayer_ratio", "attention_entropy"))  # another acts too
    assert replay.first_change(run, kept, [2000]) is None


def test_the_sublayer_table_lists_the_changed_twins_with_their_once_twins(replay, tmp_path, capsys):
    run = sublayer_twin(code="853bd1602ceae5ca")  # a twin from before the rule was rewound
    kept = replay.sublayer_alarms(run, rewind=False)
    run["alerts"] = [{"step": s, "monitor": "sublayer_ratio", "level": "alarm"} for s in kept]
    run["actions"] += [rollback(step) for step in kept[1:]]
    (tmp_path / "post_ln_without_warmup-failing-1-rollback.json").write_text(json.dumps(run))
    (tmp_path / "post_ln_without_warmup-failing-1-rollback-once.json").write_text(json.dumps(sublayer_twin()))
    replay.main(["--rule", "sublayer_ratio", "--runs", str(tmp_path)])
    out = capsys.readouterr().out
    assert f"| post_ln_without_warmup failing 1 | {', '.join(map(str, kept))} |" in out
    assert f"| removes {kept[1]} | none |" in out
    assert "1 rollback twins; changed by rewinding the rule with the weights: 1" in out
    run["alerts"] = []  # saved alarms the kept replay does not give: refused
    (tmp_path / "post_ln_without_warmup-failing-1-rollback.json").write_text(json.dumps(run))
    with pytest.raises(SystemExit, match="not exact"):
        replay.main(["--rule", "sublayer_ratio", "--runs", str(tmp_path)])


def test_a_twin_run_under_todays_code_is_replayed_rewound(replay, tmp_path, capsys):
    run = sublayer_twin()  # today's code: its saved alarms are the rewound rule's
    run["alerts"] = [{"step": 2000, "monitor": "sublayer_ratio", "level": "alarm"}]
    (tmp_path / "post_ln_without_warmup-failing-1-rollback.json").write_text(json.dumps(run))
    replay.main(["--rule", "sublayer_ratio", "--runs", str(tmp_path)])
    assert "1 rollback twins; changed by rewinding the rule with the weights: 0" in capsys.readouterr().out


def test_a_twin_with_a_rollback_rewinding_adds_is_listed_with_no_once_twin(replay, tmp_path, capsys):
    """Settled for 20 checks (the snapshot of step 1000), bursty for the next 19, rolled back at
    check 40 on another monitor's alarm: a burst at check 42 passes against the bursty history
    kept, and alarms against the settled one rewound."""
    flat = [0.05 * (1 + 0.02 * math.sin(i)) for i in range(20)]
    ratios = [*flat, *BURSTS, *BURSTS[:9], 0.9, 0.05, 0.3]
    run = sublayer_twin(code="853bd1602ceae5ca")
    run["series"] = [{"step": 50 * i, "metrics": {f"sublayer_ratio/{BRANCH}": r}} for i, r in enumerate(ratios, 1)]
    run["actions"] = [rollback(2000, by=("attention_entropy",))]
    kept, rewound = replay.sublayer_alarms(run, rewind=False), replay.sublayer_alarms(run, rewind=True)
    assert 2100 in rewound and 2100 not in kept
    run["alerts"] = [{"step": s, "monitor": "sublayer_ratio", "level": "alarm"} for s in kept]
    (tmp_path / "post_ln_without_warmup-failing-1-rollback.json").write_text(json.dumps(run))
    replay.main(["--rule", "sublayer_ratio", "--runs", str(tmp_path)])
    assert "| adds 2100 | - |" in capsys.readouterr().out
