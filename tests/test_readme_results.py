"""The monitor benchmark tables in the README and in benchmarks/monitors-heldout.md are what the
benchmarks print from the committed results.

Issue 16 asks for results "so that the figures in the README can be checked by a program": this is
that program. A table edited by hand, or a results file rerun without the README following, fails.
"""

import functools
import importlib
import itertools
import json
import re
import statistics
from pathlib import Path

import pytest

from rksp_cli.monitors.failures import FAILURES
from rksp_cli.monitors.spike_detectors import FoundryKillLossSpike, MegatronSpikyLoss, OlmoSkipStep

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
HELD_OUT = ROOT / "benchmarks" / "monitors-heldout.md"  # every held-out set, as judged


@pytest.fixture
def pooled(monkeypatch):
    """``benchmarks/pooled_bars.py``, imported with its sibling scripts on the path, as when it runs."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("benchmarks.pooled_bars")


# Each table as (benchmark module, its printer, results file, key holding the rows), by document
README_TABLES = [
    ("monitors", "markdown", "monitors.json", "head_to_head"),
    ("monitors", "markdown", "monitors-wide.json", "head_to_head"),
    ("monitors", "markdown", "monitors-wide-5-9.json", "head_to_head"),
    ("matched_detectors", "markdown", "monitors-matched.json", "rows"),
    ("monitors", "actions_markdown", "monitors-actions-fresh.json", "actions"),
    ("monitors", "actions_markdown", "monitors-postln-actions-78-83.json", "actions"),
    ("monitors", "actions_markdown", "monitors-postln-control78-rollback.json", "actions"),
    ("monitors", "actions_markdown", "monitors-postln-rollback-once.json", "actions"),
    ("monitors", "guarded_runs_markdown", "monitors-postln-rollback-once.json", "guarded_runs"),
]


def _first_seed(results: Path) -> int:
    return int(results.stem.split("-")[-2])  # monitors-matched-150-155 -> 150


def _sets(pattern: str, since: int = 0) -> list[str]:
    """The held-out sets' results files matching ``pattern`` (named by their seeds), from ``since``
    on, in seed order: a set committed without its table in the record fails here."""
    return [p.name for p in sorted(RESULTS.glob(pattern), key=_first_seed) if _first_seed(p) >= since]


HELD_OUT_TABLES = [
    *(("matched_detectors", "markdown", f, "rows") for f in _sets("monitors-matched-*-*.json", since=48)),
    # the comparisons list their failing runs one by one from 84-89 on
    *(("matched_detectors", "runs_markdown", f, "failing_runs") for f in _sets("monitors-matched-*-*.json", since=84)),
    *(("past_horizon", "markdown", f, "rows") for f in _sets("monitors-past-horizon-*-*.json")),
    *(("monitors", "actions_markdown", f, "actions") for f in _sets("monitors-postln-actions-*-*.json", since=84)),
    ("monitors", "actions_markdown", "monitors-postln-control86-88-rollback.json", "actions"),
    ("monitors", "actions_markdown", "monitors-postln-control96-101-rollback.json", "actions"),
    ("monitors", "actions_markdown", "monitors-postln-control102-107-rollback.json", "actions"),
    # each held-out rollback-once rerun: what it did, and how each run ended
    *(
        ("monitors", printer, f.name, key)
        for f in sorted(RESULTS.glob("monitors-postln-rollback-once-*.json"))
        for printer, key in (("actions_markdown", "actions"), ("guarded_runs_markdown", "guarded_runs"))
    ),
    # a set's runs trained again on another CPU (monitors-rerun-<isa>-<what>-<seeds>.json): not pooled
    *(
        ("matched_detectors", printer, f.name, key)
        for f in sorted(RESULTS.glob("monitors-rerun-*-matched-*.json"))
        for printer, key in (("markdown", "rows"), ("runs_markdown", "failing_runs"))
    ),
    *(
        ("monitors", printer, f.name, key)
        for f in sorted(RESULTS.glob("monitors-rerun-*.json"))
        if "-matched-" not in f.name
        for printer, key in (("actions_markdown", "actions"), ("guarded_runs_markdown", "guarded_runs"))
    ),
]


@pytest.mark.parametrize(
    ("module", "printer", "results", "key", "doc"),
    [(*table, README) for table in README_TABLES] + [(*table, HELD_OUT) for table in HELD_OUT_TABLES],
)
def test_readme_table_is_the_benchmark_output(monkeypatch, module, printer, results, key, doc):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # the scripts import their sibling ``machine``
    rows = json.loads((RESULTS / results).read_text())[key]
    assert rows, f"{results} holds no {key}"
    table = getattr(importlib.import_module(f"benchmarks.{module}"), printer)(rows)
    assert table in doc.read_text(), f"{doc.name} lacks {results}'s table as the benchmark prints it"


@pytest.mark.parametrize(
    ("results", "knob", "rules"),
    [
        ("monitors-candidate-90-95.json", "min_history", "10 checks / 16 checks"),
        ("monitors-candidate-logit-growth-114-119.json", "logit_growth", "growth 2.5 / growth 3"),
        # the floor stated for 274 on, replayed on every set from 272-273 until it is judged
        *((f, "sublayer_floor", "floor 0 / floor 0.1") for f in _sets("monitors-candidate-sublayer-floor-*-*.json")),
        # spectral alignment's growth threshold at 1.25x, stated for 482 on
        *(
            (f, "alignment_growth_scale", "growth z x1 / growth z x1.25")
            for f in _sets("monitors-candidate-alignment-growth-scale-*-*.json")
        ),
        # attention entropy's lone fall at 15%, stated for 486 on (180-185 judged 0 against 10%)
        *(
            (f, "ae_alone_fall", "alone at 10% / alone at 15%")
            for f in _sets("monitors-candidate-ae-alone-fall-*-*.json", since=486)
        ),
    ],
)
def test_readme_candidate_table_is_the_replay_s_output(monkeypatch, results, knob, rules):
    """A judged candidate's table, headed by the two rules its results record."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    recorded = json.loads((RESULTS / results).read_text())
    replay = importlib.import_module("benchmarks.candidate_replay")
    table = replay.markdown(recorded["rows"], replay.KNOBS[knob], **recorded[knob])
    assert rules in table and table in HELD_OUT.read_text()


@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_readme_pooled_bars_are_the_program_s_sums(pooled, failure):
    """The pooled lead and earliness counts over the held-out sets, summed by ``pooled_bars.py`` from
    the committed comparisons, not by hand: their totals in the README, set by set in the record."""
    table = pooled.tables(pooled.default_sets(), failure)
    assert table in HELD_OUT.read_text(), "the held-out record lacks pooled_bars.py's table as it prints it"
    totals = pooled.tables(pooled.default_sets(), failure, per_set=False)
    assert totals in README.read_text(), "README lacks pooled_bars.py --totals as it prints it"
    assert table.endswith(totals.split("\n", 2)[2])  # the same pooled rows under the rows per set


@functools.cache
def _comparisons(pooled) -> tuple[dict, ...]:
    """Every comparison ``pooled_bars.SETS`` pools, parsed once for the tests that read them."""
    return tuple(json.loads(m.read_text()) for m, _ in pooled.default_sets())


def _failed_runs(pooled, failure: str) -> list[dict]:
    """The run-by-run records of the pooled sets' runs of ``failure`` that failed within the horizon."""
    return [
        run
        for results in _comparisons(pooled)
        for run in results.get("failing_runs", [])
        if run["failure"] == failure and run["failed"] is not None
    ]


def _false_alarms(pooled, row: dict, failure: str, watcher: str) -> int:
    """One watcher's false alarms on a set's controls of ``failure``, from the set's head-to-head
    (``monitors-postln-S-E.json`` or ``monitors-w64-S-E.json``), which counts them per monitor."""
    kind = "postln" if failure == "post_ln_without_warmup" else "w64"
    head_to_head = json.loads((pooled.RESULTS / f"monitors-{kind}-{row['seeds']}.json").read_text())["head_to_head"]
    (found,) = (w["false_alarms"] for w in head_to_head if w["failure"] == failure and w["watcher"] == watcher)
    return found


def test_readme_race_table_is_the_program_s_and_agrees_with_the_pooled_earliness(pooled):
    """Where rksp was not first on deep Post-LN, by how much: the README's table is the program's,
    and its "rksp first" column is the earliness count of the same sets' pooled rows."""
    sets, failure = pooled.default_sets(), "post_ln_without_warmup"
    table = pooled.races(sets, failure)
    assert table in HELD_OUT.read_text(), "the held-out record lacks pooled_bars.py --races as it prints it"
    assert pooled.races(sets, failure, per_set=False) in README.read_text(), "README lacks --races --totals"
    with_runs = [pooled.set_row(r, failure) for r in _comparisons(pooled) if r.get("failing_runs")]
    summed = pooled.pool(with_runs, "with runs")
    races, first = summed["failed"], summed["earliest"]
    total = table.splitlines()[-1]
    assert total.startswith(f"| **all** | {races} | {first} |")
    # the prose quotes the same row three times; one of its counts drifted two behind for seven sets
    close, far = (int(c) for c in total.split("|")[4:6])  # by under / at least one interval
    prose = _prose()
    assert (
        f"Of the {races} deep failures with a run-by-run record, a check every step could have won at most {close} "
        "more races"
    ) in prose
    assert f"lift rksp's {first} of {races} to at most {first + close}. Of the other {far} races," in prose


def test_readme_names_the_rules_that_won_the_races_by_an_interval_or_more(pooled):
    """Which tuned rule beat rksp by a check interval or more on deep Post-LN, and by how much, is
    prose kept by hand as sets are added: it is read back here from the same run-by-run records."""
    olmo, foundry, tied = [], [], []
    for run in _failed_runs(pooled, "post_ln_without_warmup"):
        if pooled.race(run) != pooled.RACES[2]:
            continue
        first, winners = pooled.earliest_detectors(run)
        margin = run["rksp"] - first
        if "OLMo-core SkipStepOptimizer" in winners:
            olmo.append(margin)
            if len(winners) > 1:
                tied.append(run["seed"])
        else:
            assert winners == {"llm-foundry KillLossSpike"}, (run["seed"], winners)
            foundry.append(margin)
    prose = _prose()
    assert f"races, {len(olmo)} went to tuned OLMo-core's rule" in prose
    assert tied == [343] and "on 343 tied with tuned Megatron-LM's" in prose
    assert f"which fired {min(olmo)}-{max(olmo)} steps before rksp's first alarm" in prose
    assert len(foundry) == 2 and f"two to tuned llm-foundry's, {min(foundry)} and {max(foundry)} steps" in prose


def _lead_misses(pooled, failure: str, since: int = 0) -> list[int]:
    """The seeds whose ``failure`` failed within the horizon with rksp's lead short of the bar, from
    the run-by-run records of every pooled set."""
    runs = _failed_runs(pooled, failure)
    return sorted(run["seed"] for run in runs if run["seed"] >= since and not run["lead_bar_met"])


def test_readme_names_every_lead_miss_of_the_run_by_run_records(pooled):
    """The README says what happened on each failure whose lead missed the bar; that list is prose
    kept by hand as sets are added, so a new miss left out of it, or its count left unmoved, is
    caught here from the same records the pooled counts come from."""
    deep = _lead_misses(pooled, "post_ln_without_warmup", since=90)
    low_precision = _lead_misses(pooled, "low_precision_attention")
    assert len(deep) >= 27 and len(low_precision) >= 8  # every committed set was read
    prose = _prose()
    heading = f"The {len(deep)} deep misses since seed 90:"
    assert heading in prose, f"README lacks {heading!r}"
    start = prose.index(heading)
    listing = prose[start : prose.index(f"The {len(low_precision)} low-precision misses", start)]
    named = {int(n) for n in re.findall(r"\b\d+\b", listing)}
    assert [seed for seed in deep if seed not in named] == [], "deep misses the README does not name"
    assert f"The {len(low_precision)} low-precision misses ({', '.join(map(str, low_precision))})" in prose
    assert not _lead_misses(pooled, "attention_logit_growth")  # the README: the bar met on every one


def test_readme_deep_control_alarms_since_the_entropy_rule_are_the_pooled_sets(pooled):
    """How often ``attention_entropy`` has alarmed on a deep control since its lone-block rule shipped
    (seed 186; rksp as a whole: the watchers' paragraph). The README once listed those sets by hand
    and stood three sets short; the span and the count of controls are read here from the pooled
    rows, and the monitor's alarms from each set's head-to-head (``monitors-postln-*.json``), which
    counts false alarms per monitor."""
    rows = [pooled.set_row(results, "post_ln_without_warmup") for results in _comparisons(pooled)]
    since = sorted((row for row in rows if row is not None and row["first_seed"] >= 186), key=lambda r: r["first_seed"])
    controls = sum(row["controls"] for row in since)
    alarms = sum(_false_alarms(pooled, row, "post_ln_without_warmup", "attention_entropy") for row in since)
    assert (
        f"on the {len(since)} sets from {since[0]['seeds']} to {since[-1]['seeds']}, the first watched under it, "
        f"it alarmed on {alarms} of {controls} deep controls"
    ) in _prose()
    last = since[-1]["seeds"].split("-")[1]
    assert f"under which {alarms} of the {controls} controls of 186-{last} alarmed" in _prose(HELD_OUT)


def test_pooled_sets_name_every_held_out_comparison(pooled):
    """``pooled_bars.SETS`` is kept by hand, with a note on each set's code: a held-out comparison
    committed without its row there would drop out of the pooled bars without any table failing."""
    listed = {m.name for m, _ in pooled.default_sets()}
    missing = [f for f in _sets("monitors-matched-*-*.json", since=48) if f not in listed]
    assert not missing, f"pooled_bars.SETS lacks {missing}"


@pytest.mark.parametrize("doc", [README, HELD_OUT], ids=lambda p: p.name)
def test_every_table_ends_before_its_prose(doc):
    """Markdown runs a table on until a blank line: prose written straight under one renders as a
    table row. The records are edited by hand set after set, and one such slip went unnoticed."""
    lines = doc.read_text().splitlines()
    glued = [
        n + 2
        for n, (row, after) in enumerate(itertools.pairwise(lines))
        if row.startswith("|") and after.strip() and not after.startswith("|")
    ]
    assert not glued, f"{doc.name}: text right under a table at line(s) {glued[:5]}"


@pytest.mark.parametrize("doc", [README, HELD_OUT], ids=lambda p: p.name)
def test_no_bullet_is_run_into_the_prose_before_it(doc):
    """A bullet's "- **" pulled up into the line above, as a careless rewrap of a hand-edited
    paragraph does, renders as prose and silently merges two bars; one such merge hid the held-out
    record's actions bar inside its overhead bar for a set."""
    merged = [n + 1 for n, line in enumerate(doc.read_text().splitlines()) if re.search(r"\S - \*\*", line)]
    assert not merged, f"{doc.name}: a bullet run into the line before it at line(s) {merged[:5]}"


def _prose(doc: Path = README) -> str:
    """``doc`` with its line breaks and indents folded to single spaces, so a sentence is found
    however it is wrapped."""
    return " ".join(doc.read_text().split())


def _healthy_post_ln_seed_sd() -> float:
    """The seed sd of healthy Post-LN's final loss at a third of the lr, over the benchmark's own
    controls (``monitors.json``; the README quotes it as 0.034): a capped run ending less than this
    above its twin that rolled back on every alarm is "no worse"."""
    runs = json.loads((RESULTS / "monitors.json").read_text())["runs"]
    finals = [
        r["final_loss"] for r in runs if r["failure"] == "post_ln_without_warmup" and r["kind"] == "control_low_lr"
    ]
    return statistics.stdev(finals)


def _rollback_runs(policy: str, pattern: str) -> dict[tuple[str, int], dict]:
    """Deep Post-LN failing runs (``guarded_runs`` holds no other kind) guarded by ``policy`` in the
    results files matching ``pattern``, by (the CPU a rerun names, or "" for a set's own runs) and seed."""
    runs = {}
    for path in RESULTS.glob(pattern):
        where = path.name.split("-")[2] if path.name.startswith("monitors-rerun-") else ""
        for run in json.loads(path.read_text()).get("guarded_runs", []):
            if run["policy"] == policy and run["failure"] == "post_ln_without_warmup":
                runs[where, run["seed"]] = run
    return runs


def test_readme_capped_rollback_counts_are_the_results_files():
    """The README counts the runs retrained with one rollback (``rollback-once``) and how many ended no
    worse than with every rollback, twice, in prose, and the held-out record's summary once: a set
    that adds one must move all three counts (one stood stale for three sets, the summary's for
    one). "No worse": not failed, and, where the twin is committed (it is not for the nine of
    132-149), at most a seed sd above it."""
    capped = _rollback_runs("rollback-once", "monitors-*rollback-once*.json")
    twins = _rollback_runs("rollback", "monitors-*actions-*.json")
    seed_sd = _healthy_post_ln_seed_sd()
    worse = [
        key
        for key, run in capped.items()
        if run["ended_failed"] or (key in twins and run["final_loss"] > twins[key]["final_loss"] + seed_sd)
    ]
    total, fine = len(capped), len(capped) - len(worse)
    assert total >= 41 and len(twins.keys() & capped.keys()) >= 32  # every committed file was read
    prose = _prose()
    assert f"of the {total} runs rolled back more than once and retrained with the cap, {fine} ended no worse" in prose
    assert f"on {fine} of the {total} capped runs" in prose
    assert f"of the {total} capped runs in all, {fine} ended no worse" in _prose(HELD_OUT)


def test_readme_past_horizon_count_is_the_results_files():
    """The README sums the failing runs that outlived the horizon and were trained on past it: a set
    that adds one must move the count, the range of steps at which they were lost and of rksp's
    leads, and the lead bar's count, all read here from ``monitors-past-horizon-*.json``."""
    rows = [
        row
        for path in sorted(RESULTS.glob("monitors-past-horizon-*.json"))
        for row in json.loads(path.read_text())["rows"]
    ]
    failed = [row["failed"] for row in rows if row["failed"] is not None]
    leads = [row["lead"] for row in rows if row["lead"] is not None]
    met = sum(bool(row["lead_bar_met"]) for row in rows)
    assert len(rows) >= 33  # every committed file was read
    assert len(failed) == len(rows), (
        "a run that outlived the horizon and was not lost: the README's 'were lost' no longer holds"
    )
    prose = _prose()
    assert (
        f"all {len(rows)} held out and taken on to 10,000 steps (`benchmarks/past_horizon.py`, "
        f"`monitors-past-horizon-*.json`) were lost, at steps {min(failed)}-{max(failed)}, "
        f"each {min(leads)}-{max(leads)} steps after rksp's first alarm (the lead bar on {met} of {len(rows)})"
    ) in prose
    # the benchmark's opening paragraph counts them again; it stood at 40 for four such sets
    assert (
        "every such run taken on to 10,000 steps has failed (four of four then, `benchmarks/monitors-log.md`; "
        f"all {len(rows)} held out since" in prose
    )


def test_heldout_lists_the_past_horizon_files():
    """The held-out record lists the sets with a ``monitors-past-horizon-S-E.json`` by hand; a set
    with no run past its horizon writes none, and 372-375 was once listed without one."""
    listed = re.search(r"`monitors-past-horizon-S-E\.json` \(([^)]*)\)", _prose(HELD_OUT))
    assert listed, "the held-out record no longer lists the past-horizon files"
    sets = re.split(r", | and ", listed.group(1))
    files = _sets("monitors-past-horizon-*-*.json")  # in seed order
    assert sets == [Path(name).stem.removeprefix("monitors-past-horizon-") for name in files]


def _share(pooled, hits: int, n: int) -> tuple[str, str]:
    """``hits`` of ``n`` as the prose quotes it: the percentage and the 95% Wilson interval, whole."""
    low, high = pooled.wilson(hits, n)
    return f"{100 * hits / n:.0f}", f"{100 * low:.0f}-{100 * high:.0f}"


def test_readme_and_heldout_lead_counts_are_the_results_files(pooled):
    """The lead bar's headline counts, in the README and again in the held-out record's summary, kept
    by hand as sets are added (the record's stood six sets stale before this test): width 64's from
    the run-by-run records, deep Post-LN's from the pooled rows plus the sets before 66-71, which the
    prose counts itself (13 of their 21 failures; 5 of the 6 of 60-65 watched with the sub-layer
    monitor)."""

    def met(failure: str) -> tuple[int, int]:
        runs = _failed_runs(pooled, failure)
        return sum(bool(run["lead_bar_met"]) for run in runs), len(runs)

    (growth, growth_n), (low, low_n) = met("attention_logit_growth"), met("low_precision_attention")
    rows = pooled.set_rows(pooled.default_sets(), "post_ln_without_warmup")
    every = pooled.pool(rows, "all sets")
    newest = pooled.pool([row for row in rows if row["first_seed"] >= pooled.SUBLAYER_FROM], "newest")
    readme, held_out = _prose(), _prose(HELD_OUT)
    before = re.search(r"the per-set prose counts the sets before it too, (\d+) of their (\d+) failures", readme)
    sixty = re.search(r"\((\d+)%; (\d+-\d+)%: (\d+) of the (\d+) of seeds 60-65", held_out)
    assert before and sixty, "the prose no longer counts the sets before 66-71 as this test reads it"
    assert every["failed"] - every["lead_failed"] == int(before[2])  # the sets without a count here
    assert newest["failed"] - newest["lead_failed"] == int(sixty[4])
    deep, deep_n = every["lead_bar_met"] + int(before[1]), every["failed"]
    watched, watched_n = newest["lead_bar_met"] + int(sixty[3]), newest["failed"]
    (deep_pct, deep_ci), (watched_pct, watched_ci) = _share(pooled, deep, deep_n), _share(pooled, watched, watched_n)
    assert f"met on attention-logit growth ({growth} of {growth_n} counted), missed" in readme
    assert (
        f"low-precision attention ({low} of {low_n}), not met on deep Post-LN ({deep} of {deep_n} fresh failures, "
        f"{deep_pct}%, 95% Wilson interval {deep_ci}%; {watched} of the {watched_n} watched with `sublayer_ratio`, "
        f"{watched_pct}%, {watched_ci}%)"
    ) in readme
    assert f"giving the {deep} of {deep_n} above" in readme
    assert f"met on attention-logit growth ({growth} of {growth_n} counted), missed" in held_out
    assert (
        f"low-precision attention ({low} of {low_n} counted), not met on deep Post-LN: {deep} of {deep_n} fresh "
        f"failures ({deep_pct}%; 95% Wilson interval {deep_ci}%), {watched} of the {watched_n} watched with "
        f"`sublayer_ratio` among the monitors ({watched_pct}%; {watched_ci}%"
    ) in held_out


def test_readme_and_heldout_earliness_counts_are_the_pooled_rows(pooled):
    """The earliness bar's headline counts, in the README and the held-out record's summary, are the
    pooled rows' "before every tuned detector" column with its Wilson interval (one interval stood a
    point low, 92% for the table's 93%, before this test)."""

    def earliest(rows: list[dict]) -> tuple[int, int, str, str]:
        summed = pooled.pool(rows, "")
        hits, n = summed["earliest"], summed["failed"]
        return hits, n, *_share(pooled, hits, n)

    def rows(failure: str) -> list[dict]:
        return pooled.set_rows(pooled.default_sets(), failure)

    deep = rows("post_ln_without_warmup")
    g, gn, _, gci = earliest(rows("attention_logit_growth"))
    lp, lpn, _, lpci = earliest(rows("low_precision_attention"))
    d, dn, dpct, dci = earliest(deep)
    w, wn, _, wci = earliest([row for row in deep if row["first_seed"] >= pooled.SUBLAYER_FROM])
    assert (
        f"before every tuned detector's on {g} of {gn} attention-logit failures ({gci}%), {lp} of {lpn} "
        f"low-precision ones ({lpci}%) and {d} of {dn} deep Post-LN ones ({dci}%; {w} of {wn}, {wci}%, with "
        "`sublayer_ratio`)."
    ) in _prose()
    assert (
        f"before every tuned detector's on {g} of {gn} attention-logit failures (95% Wilson interval {gci}%), "
        f"{lp} of {lpn} low-precision ones ({lpci}%) and {d} of {dn} deep Post-LN ones ({dpct}%; {dci}%; {w} of "
        f"{wn}, {wci}%, with `sublayer_ratio`)"
    ) in _prose(HELD_OUT)


def test_cpu_overhead_range_is_the_results_files():
    """The README and the held-out record give the monitors' cost on the CPU as one range, read from
    the committed comparisons' ``overhead_pct`` (each failure's and watcher's median over its runs;
    the GPU files apart). Written by hand, the README's stood at 0.36% (138-143's) and the record's
    at 0.34% when 404-405 passed both."""
    pcts = [
        row["overhead_pct"]
        for path in RESULTS.glob("monitors*.json")
        if "wide" not in path.name
        for row in (json.loads(path.read_text()).get("head_to_head") or [])
        if row.get("overhead_pct") is not None
    ]
    assert len(pcts) >= 1000  # every committed comparison was read
    span = f"{min(pcts):.2f}-{max(pcts):.2f}% of a training step"
    assert f"met at widths 64 and 128 on the CPU** ({span}" in _prose()
    assert f"met at widths 64 and 128 on the CPU, {span}" in _prose(HELD_OUT)


def test_readme_deep_false_alarm_counts_are_the_pooled_rows(pooled):
    """The zero-false-alarm bar's deep counts (rksp's alarms over every deep control, and how many
    sets had none) are prose kept by hand as sets are added; they are the pooled rows' sums."""
    rows = pooled.set_rows(pooled.default_sets(), "post_ln_without_warmup")
    alarms, controls = sum(row["false_alarms"] for row in rows), sum(row["controls"] for row in rows)
    quiet = sum(not row["false_alarms"] for row in rows)
    prose = _prose()
    assert f"not on every deep set** ({alarms} of {controls} deep controls," in prose
    assert f"though {quiet} of the {len(rows)} deep sets had none" in prose
    alarmed = [row["seeds"] for row in rows if row["false_alarms"]]
    assert f"(the other {len(alarmed)}: {', '.join(alarmed[:-1])} and {alarmed[-1]}, one or two each)" in prose
    assert max(row["false_alarms"] for row in rows) <= 2


def test_readme_width_64_false_alarm_count_is_the_pooled_rows(pooled):
    """The zero-false-alarm bar's width-64 count is prose kept by hand; it drifted four controls above
    the pooled rows between 272-273 and 418-419. Both width-64 failures share their control runs, so
    their rows must agree, and the README quotes them once."""
    counts = {
        failure: (sum(r["false_alarms"] for r in rows), sum(r["controls"] for r in rows))
        for failure in ("attention_logit_growth", "low_precision_attention")
        if (rows := pooled.set_rows(pooled.default_sets(), failure))
    }
    (alarms, controls), other = counts.values()
    assert other == (alarms, controls)
    assert f"not met since 272 at width 64 ({alarms} of {controls} controls of each failure" in _prose()


def test_readme_width_64_close_races_are_the_program_s(pooled):
    """How many width-64 races rksp lost by under a check interval is prose kept by hand as sets are
    added; it is the "by under" column of ``pooled_bars.py --races --failure F``'s total."""
    totals = [
        pooled.races(pooled.default_sets(), failure).splitlines()[-1].split("|")
        for failure in ("attention_logit_growth", "low_precision_attention")
    ]
    (growth, growth_close), (low, low_close) = ((int(t[2]), int(t[4])) for t in totals)
    assert growth >= 200 and low >= 328  # every committed set was read
    assert f"loses {growth_close} of {growth} and {low_close} of {low} races by under an interval" in _prose()


def test_readme_and_heldout_rollback_saves_are_the_results_files(pooled):
    """Rollback's held-out count on deep Post-LN is summed by hand set after set, in the README and
    at the end of each set's section of the held-out record; it is the sum over the committed
    ``monitors-postln-actions-S-E.json`` (the EPYC reruns of 296-299, ``monitors-rerun-*``, are
    not counted)."""
    rows = [
        row
        for path in RESULTS.glob("monitors-postln-actions-*-*.json")
        for row in json.loads(path.read_text())["actions"]
        if row["failure"] == "post_ln_without_warmup" and row["policy"] == "rollback"
    ]
    saved, failed = sum(row["saved"] for row in rows), sum(row["failed_unguarded"] for row in rows)
    assert len(rows) >= 88  # every committed file was read
    low, high = pooled.wilson(saved, failed)
    share = f"{round(100 * saved / failed)}%, {round(100 * low)}-{round(100 * high)}%"
    assert f"{saved} of {failed} held-out deep Post-LN failures ({share};" in _prose()
    counts = re.findall(r"rollback has now saved (\d+) of (\d+) failing runs", _prose(HELD_OUT))
    assert counts and counts[-1] == (str(saved), str(failed)), f"the last set's section says {counts[-1:]}"


def test_log_names_every_pooled_set(pooled):
    """``benchmarks/monitors-log.md`` is the running record of how each held-out set was run; it is
    appended to by hand, and one careless append once truncated it to its last bullets. Every set
    ``pooled_bars.SETS`` pools must still be named in it."""
    log = (ROOT / "benchmarks" / "monitors-log.md").read_text()
    seeds = [m.stem.removeprefix("monitors-matched-") for m, _ in pooled.default_sets()]
    assert [s for s in seeds if s not in log] == [], "monitors-log.md lacks these sets"


def test_readme_quiet_controls_under_the_floor_are_the_pooled_sets(pooled):
    """The README says ``sublayer_ratio`` alarmed on no control, deep or width 64, on the sets watched
    under its floor (shipped from seed 290); it once said so set by set, a sentence a set, and now
    counts them, read here from the pooled rows of every failure and each set's head-to-head."""
    since = {
        failure: [row for row in pooled.set_rows(pooled.default_sets(), failure) if row["first_seed"] >= 290]
        for failure in FAILURES
    }
    deep = since["post_ln_without_warmup"]
    alarmed = [
        row["seeds"] for f, rows in since.items() for row in rows if _false_alarms(pooled, row, f, "sublayer_ratio")
    ]
    assert alarmed == []
    assert (
        f"On the {len(deep)} sets from {deep[0]['seeds']} to {deep[-1]['seeds']}, the first watched under it, "
        "`sublayer_ratio` alarmed on no control"
    ) in _prose()


def test_readme_width_64_lost_races_are_the_records(pooled):
    """Who beat rksp on width 64, summed from the run-by-run records (the README listed each race
    seed by seed, a clause a race; the held-out record still does)."""
    rules: dict[str, list[list[int]]] = {d.name: [] for d in (MegatronSpikyLoss, OlmoSkipStep, FoundryKillLossSpike)}
    counts = {}
    for failure in ("attention_logit_growth", "low_precision_attention"):
        runs = _failed_runs(pooled, failure)
        lost = [run for run in runs if pooled.race(run) != pooled.RACES[0]]
        winners = [pooled.earliest_detectors(run) for run in lost if pooled.race(run) != pooled.RACES[3]]
        assert all(len(names) == 1 for _, names in winners)  # no tie to share out
        assert {name for _, names in winners for name in names} <= set(rules)
        for name, steps in rules.items():
            steps.append([first for first, names in winners if name in names])
        counts[failure] = (len(runs), len(lost), len(lost) - len(winners))
    (growth, growth_lost, growth_silent), (low, low_lost, low_silent) = counts.values()
    megatron, olmo, foundry = ((len(g), len(lp)) for g, lp in rules.values())
    early = sum(step <= 40 for step in rules[MegatronSpikyLoss.name][0])
    assert (
        f"on width 64 rksp lost {growth_lost} of the {growth} attention-logit races with a run-by-run record and "
        f"{low_lost} of the {low} low-precision ones: tuned Megatron-LM's rule (1.02x the largest loss seen) took "
        f"{megatron[0]} and {megatron[1]} of them, tuned OLMo-core's {olmo[0]} and {olmo[1]}, tuned llm-foundry's "
        f"{foundry[0]} and {foundry[1]}, and {growth_silent} and {low_silent} had no rksp alarm before the failure"
    ) in _prose()
    assert f"({early} of its {megatron[0]} attention-logit wins came in the first 40 steps)" in _prose()


def test_readme_watchers_table_and_its_reading_are_the_program_s(pooled):
    """Each watcher's alarms and false alarms over the held-out sets: the table is
    ``pooled_bars.py --watchers``'s, and the counts its paragraph quotes are read from the same sums."""
    assert pooled.watchers(pooled.default_sets()) in README.read_text(), "README lacks pooled_bars.py --watchers"
    sums = pooled.watcher_sums(pooled.default_sets())
    deep, growth = "post_ln_without_warmup", "attention_logit_growth"
    olmo, foundry, megatron, rksp = OlmoSkipStep.name, FoundryKillLossSpike.name, MegatronSpikyLoss.name, pooled.RKSP
    assert sums[growth, olmo]["false"] == sums["low_precision_attention", olmo]["false"]  # one control run
    rows_186 = [row for row in pooled.set_rows(pooled.default_sets(), deep) if row["first_seed"] >= 186]
    controls_186, alarmed_186 = (sum(row[key] for row in rows_186) for key in ("controls", "false_alarms"))
    since = f"{alarmed_186 or 'none'} of the {controls_186}"
    prose = _prose()
    megatron_deep, megatron_w64 = sums[deep, megatron]["false"], sums[growth, megatron]["false"]
    megatron_said = (
        f"{megatron_deep} of each"
        if megatron_deep == megatron_w64
        else f"{megatron_deep} deep and {megatron_w64} width-64 ones"
    )
    assert (
        f"fired on {sums[deep, olmo]['false']} of {sums[deep, olmo]['controls']} deep controls and "
        f"{sums[growth, olmo]['false']} of {sums[growth, olmo]['controls']} width-64 ones; tuned llm-foundry's, on "
        f"{sums[growth, foundry]['false']} width-64 controls; tuned Megatron-LM's, on {megatron_said}; rksp, on "
        f"{sums[deep, rksp]['false']} deep controls ({since} since seed 186) and "
        f"{sums[growth, rksp]['false']} width-64 one."
    ) in prose
    assert (
        f"llm-foundry's alarmed before {sums[deep, foundry]['alarmed']} of {sums[deep, foundry]['failed']} and met the "
        f"lead bar on {sums[deep, foundry]['met']} of {sums[deep, foundry]['counted']}, OLMo-core's on "
        f"{sums[deep, olmo]['met']} against rksp's {sums[deep, rksp]['met']}."
    ) in prose


def test_pre_ln_control_count_is_the_results_files():
    """How many seeds have a deep Pre-LN control on record, and which of those exploded, is prose
    kept by hand in the README and the record, moved by two with every two-seed set; it is read here
    from every results file's head-to-head runs."""
    seeds: set[int] = set()
    exploded: dict[int, int] = {}
    for path in RESULTS.glob("*.json"):
        results = json.loads(path.read_text())
        runs = results.get("runs") if isinstance(results, dict) else None
        for run in runs if isinstance(runs, list) else []:
            if run.get("failure") == "post_ln_without_warmup" and run.get("kind") == "control":
                seeds.add(run["seed"])
                if run["exploded_step"] is not None:
                    exploded[run["seed"]] = run["exploded_step"]
    assert len(seeds) >= 398  # every committed file was read
    at = ", ".join(f"{seed} at step {step}" for seed, step in sorted(exploded.items()))
    assert f"({len(exploded)} of the {len(seeds)} Pre-LN seeds with a recorded run)" in _prose()
    assert f"exploded on {len(exploded)} of the {len(seeds)} seeds with a recorded run ({at})" in _prose(HELD_OUT)


def test_readme_sublayer_margin_denominators_are_the_pooled_rows(pooled):
    """How near the controls of 222 on came to a sub-layer alarm is counted over every control of
    those sets (the near ones from ``sublayer_margin.py``, by hand; 222-271's saved runs are lost):
    the span and the two denominators, which move with every set, are the pooled rows'."""
    controls = {
        failure: [row for row in pooled.set_rows(pooled.default_sets(), failure) if row["first_seed"] >= 222]
        for failure in ("post_ln_without_warmup", "attention_logit_growth")
    }
    deep, width_64 = (sum(row["controls"] for row in rows) for rows in controls.values())
    last = controls["post_ln_without_warmup"][-1]["seeds"].split("-")[1]
    assert f"Over the controls of 222-{last} (`benchmarks/sublayer_margin.py`;" in _prose()
    assert (
        f"of {width_64} width-64 controls came within 20% of every threshold, one past it, and 1 of {deep} deep"
        in _prose()
    )
