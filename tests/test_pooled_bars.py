"""Pooling the held-out sets' counts (benchmarks/pooled_bars.py)."""

import json

import pytest

RKSP = "rksp (first alarm of any monitor, as shipped)"


@pytest.fixture
def pooled(benchmark_script):
    return benchmark_script("pooled_bars")


def a_set(first: int, failed: int, met: int | None, earliest: int, false_alarms: int = 0) -> dict:
    seeds = f"{first}-{first + 5}"
    return {"seeds": seeds, "first_seed": first, "failed": failed, "lead_bar_met": met, "earliest": earliest,
            "false_alarms": false_alarms, "controls": 12}  # fmt: skip


def test_the_lead_bar_pools_only_the_sets_that_counted_it(pooled):
    """A set judged before the lead bar was counted adds its failures to the earliness count but not to
    the lead count's denominator, and the table says which sets the lead is over."""
    sets = [a_set(42, 5, None, 3), a_set(78, 5, 4, 3, false_alarms=1), a_set(84, 4, 2, 1)]
    total = pooled.pool(sets, "all sets")
    assert (total["failed"], total["lead_bar_met"], total["lead_failed"]) == (14, 6, 9)
    assert (total["earliest"], total["false_alarms"], total["controls"]) == (7, 1, 36)
    assert "6/9 (" in pooled.markdown(sets, [total]) and "over 78-83, 84-89" in pooled.markdown(sets, [total])
    assert "over" not in pooled.markdown(sets[1:], [pooled.pool(sets[1:], "all")])


def test_the_pooled_row_names_a_long_run_of_counted_sets_by_its_ends(pooled):
    """Three or more sets in a row that counted the lead bar are named by their first and last; a set
    that did not count it breaks the run."""
    sets = [a_set(first, 2, 1, 1) for first in (60, 66, 72, 78)]
    assert pooled.pool(sets, "all")["lead_sets"] == ["60-65 to 78-83 (4 sets)"]
    sets[1]["lead_bar_met"] = None
    assert pooled.pool(sets, "all")["lead_sets"] == ["60-65", "72-77, 78-83"]
    assert "over 60-65, 72-77, 78-83 |" in pooled.markdown(sets, [pooled.pool(sets, "all")])


def comparison(failed: int, watched: str, met: int | None = None) -> dict:
    row = {"failure": "f", "watcher": RKSP, "failed": failed, "earlier_than_every_matched_detector": 1,
           "false_alarms": 0, "controls": 12} | ({} if met is None else {"lead_bar_met": met})  # fmt: skip
    return {"held_out_seeds": [66, 71], "held_out_runs_watched_under_today_s_code": watched, "rows": [row]}


def head_to_head() -> dict:
    def failing(seed: int, failed: int | None, **alarms: int | None) -> dict:
        return {"failure": "f", "kind": "failing", "seed": seed, "failed_step": failed, "first_alarms": alarms}

    return {"runs": [
        failing(66, 4000, sublayer_ratio=1500, attention_entropy=None),  # 2500 ahead: met
        failing(67, 626, sublayer_ratio=600, **{"OLMo-core SkipStepOptimizer": 10}),  # a detector is not rksp
        failing(68, None, sublayer_ratio=2000),  # never failed
        {"failure": "f", "kind": "control", "seed": 66, "failed_step": None, "first_alarms": {"r_metric": 100}},
    ]}  # fmt: skip


def test_a_set_watched_under_today_s_code_counts_its_lead_bar_from_its_runs(pooled):
    """Only rksp's monitors' alarms count, only failing runs that failed, and only when every held-out
    run was watched under today's code; a head-to-head record that disagrees with the comparison on
    the failures is refused."""
    assert pooled.set_row(comparison(2, "42 of 42"), "f", head_to_head())["lead_bar_met"] == 1
    assert pooled.set_row(comparison(2, "0 of 42"), "f", head_to_head())["lead_bar_met"] is None
    assert pooled.set_row(comparison(2, "42 of 42", met=2), "f", head_to_head())["lead_bar_met"] == 2  # as counted
    with pytest.raises(ValueError, match="have 2 failures, their comparison 3"):
        pooled.set_row(comparison(3, "42 of 42"), "f", head_to_head())


def test_a_failure_a_set_did_not_run_leaves_that_set_out(pooled, tmp_path):
    """Seeds 48-59 reran only deep Post-LN: a width-64 pooling skips such a set instead of failing,
    a head-to-head without that failure's runs leaves its lead uncounted, and a failure that no set
    ran is an error."""
    assert pooled.set_row(comparison(2, "42 of 42"), "g", head_to_head()) is None
    other_failure = {"runs": [dict(run, failure="g") for run in head_to_head()["runs"]]}
    assert pooled.set_row(comparison(2, "42 of 42"), "f", other_failure)["lead_bar_met"] is None
    (tmp_path / "f.json").write_text(json.dumps(comparison(2, "0 of 42", met=1)))
    (tmp_path / "g.json").write_text(json.dumps(comparison(2, "0 of 42") | {"rows": []}))
    sets = [(tmp_path / "f.json", None), (tmp_path / "g.json", None)]
    assert "| 66-71 | 2 | 1/2 | 1/2 | 0/12 |" in pooled.tables(sets, "f")
    with pytest.raises(ValueError, match="no comparison has an rksp row for h"):
        pooled.tables(sets, "h")


@pytest.mark.parametrize(("hits", "n"), [(0, 12), (1, 84), (17, 35), (20, 20)])
def test_wilson_interval_holds_the_proportion_inside_0_1(pooled, hits, n):
    low, high = pooled.wilson(hits, n)
    assert 0 <= low <= hits / n <= high <= 1 and high - low > 0
    assert (low == 0) == (hits == 0) and (high == 1) == (hits == n)


def a_race(rksp: int | None, detectors: dict[str, int | None], failed: int = 3000, first: bool = False) -> dict:
    """One failing run as ``matched_detectors.failing_runs`` records it."""
    return {"failure": "f", "seed": 1, "failed": failed, "rksp": rksp,
            "earlier_than_every_matched_detector": first, "matched_detectors": detectors}  # fmt: skip


@pytest.mark.parametrize(
    ("run", "expected"),
    [
        (a_race(1000, {"a": 2000, "b": None}, first=True), 0),
        (a_race(1050, {"a": 1001, "b": 2500}), 1),  # beaten by 49 steps: inside one check interval
        (a_race(1000, {"a": 1000, "b": None}), 1),  # a tie is no win
        (a_race(1050, {"a": 1020, "b": 990}), 2),  # the earliest detector counts (a alone: 30)
        (a_race(1050, {"a": 1000, "b": None}), 2),  # beaten by a whole interval
        (a_race(None, {"a": 1000}), 3),
        (a_race(3100, {"a": 1000}), 3),  # an alarm after the failure is none
    ],
)
def test_a_lost_race_is_sorted_by_its_margin(pooled, run, expected):
    assert pooled.race(run) == pooled.RACES[expected]


def test_races_sum_each_set_with_a_run_by_run_record(pooled, tmp_path):
    """Sets without a run-by-run record, and other failures' runs, are left out of the table."""
    runs = [a_race(1000, {"a": 2000}, first=True), a_race(1050, {"a": 1000}), {**a_race(1, {}), "failure": "g"}]
    (tmp_path / "f.json").write_text(json.dumps({"held_out_seeds": [84, 89], "failing_runs": runs}))
    (tmp_path / "g.json").write_text(json.dumps({"held_out_seeds": [78, 83], "rows": []}))
    table = pooled.races([(tmp_path / "g.json", None), (tmp_path / "f.json", None)], "f")
    assert table.splitlines()[2:] == ["| 84-89 | 2 | 1 | 0 | 1 | 0 |", "| **all** | 2 | 1 | 0 | 1 | 0 |"]
    with pytest.raises(ValueError, match="no comparison has a run-by-run record of h"):
        pooled.races([(tmp_path / "f.json", None)], "h")


def test_totals_leave_out_the_rows_per_set_and_keep_the_sums(pooled, tmp_path):
    """``--totals`` (the README's tables) prints the header and the pooled rows of the full table
    (the held-out record's), unchanged: a row per set dropped, no count."""
    runs = [a_race(1000, {"a": 2000}, first=True), a_race(1050, {"a": 1000})]
    (tmp_path / "f.json").write_text(json.dumps(comparison(2, "0 of 42", met=1) | {"failing_runs": runs}))
    sets = [(tmp_path / "f.json", None)]
    for print_table in (pooled.tables, pooled.races):
        full, totals = print_table(sets, "f").splitlines(), print_table(sets, "f", per_set=False).splitlines()
        assert any(line.startswith("| 66-71 |") for line in full)
        assert totals == full[:2] + [line for line in full if line.startswith("| **")]
        assert len(totals) < len(full)


def test_watchers_sum_each_watcher_and_count_the_lead_bar_only_where_a_set_did(pooled, tmp_path):
    """Every tuned detector and rksp as shipped, summed set by set; rksp with a monitor left out is
    not a row, and a set that did not count the lead bar adds to the alarms but not to that count."""

    def row(watcher: str, alarmed: int, false_alarms: int, met: int | None) -> dict:
        return {"failure": "f", "watcher": watcher, "failed": 3, "alarmed": alarmed, "controls": 6,
                "false_alarms": false_alarms} | ({} if met is None else {"lead_bar_met": met})  # fmt: skip

    olmo = "OLMo-core SkipStepOptimizer"
    old = [row(olmo, 3, 2, None), row(RKSP, 2, 0, None), row("rksp without the R-Metric", 1, 5, None)]
    new = [row(olmo, 1, 1, 1), row(RKSP, 3, 0, 2)]
    for name, rows in (("old", old), ("new", new)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"rows": rows}))
    sets = [(tmp_path / "old.json", None), (tmp_path / "new.json", None)]
    sums = pooled.watcher_sums(sets)
    assert set(sums) == {("f", olmo), ("f", RKSP)}
    assert dict(sums["f", olmo]) == {"failed": 6, "alarmed": 4, "false": 3, "controls": 12, "met": 1, "counted": 3}
    assert (sums["f", RKSP]["alarmed"], sums["f", RKSP]["met"], sums["f", RKSP]["counted"]) == (5, 2, 3)
    table = pooled.watchers(sets).splitlines()
    assert [line.split(" | ")[1] for line in table[2:]] == [olmo, RKSP]  # rksp last
    assert table[2].startswith(f"| f | {olmo} | 4/6 (") and "| 3/12 (" in table[2]


def test_watchers_refuse_the_options_that_do_not_apply(benchmark_script, monkeypatch, capsys):
    """``--watchers`` tables every failure, pooled; a ``--failure`` or ``--totals`` beside it would be
    silently ignored, so it is refused with one line and exit code 2."""
    pooled = benchmark_script("pooled_bars")
    for extra in (["--totals"], ["--failure", "attention_logit_growth"]):
        monkeypatch.setattr("sys.argv", ["pooled_bars.py", "--watchers", *extra])
        with pytest.raises(SystemExit) as exit_:
            pooled.main()
        assert exit_.value.code == 2 and "do not apply" in capsys.readouterr().err
