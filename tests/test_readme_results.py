"""The monitor benchmark tables in the README and in benchmarks/monitors-heldout.md are what the
benchmarks print from the committed results.

Issue 16 asks for results "so that the figures in the README can be checked by a program": this is
that program. A table edited by hand, or a results file rerun without the README following, fails.
"""

import importlib
import json
from pathlib import Path

import pytest

from rksp_cli.monitors.failures import FAILURES

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
HELD_OUT = ROOT / "benchmarks" / "monitors-heldout.md"  # every held-out set, as judged


# Each table as (benchmark module, its printer, results file, key holding the rows), by document
README_TABLES = [
    ("monitors", "markdown", "monitors.json", "head_to_head"),
    ("monitors", "markdown", "monitors-wide.json", "head_to_head"),
    ("matched_detectors", "markdown", "monitors-matched.json", "rows"),
    ("monitors", "actions_markdown", "monitors-actions-fresh.json", "actions"),
    ("monitors", "actions_markdown", "monitors-postln-actions-78-83.json", "actions"),
    ("monitors", "actions_markdown", "monitors-postln-control78-rollback.json", "actions"),
    ("monitors", "actions_markdown", "monitors-postln-rollback-once.json", "actions"),
    ("monitors", "guarded_runs_markdown", "monitors-postln-rollback-once.json", "guarded_runs"),
]
HELD_OUT_TABLES = [
    ("matched_detectors", "markdown", "monitors-matched-48-53.json", "rows"),
    ("matched_detectors", "markdown", "monitors-matched-54-59.json", "rows"),
    ("matched_detectors", "markdown", "monitors-matched-60-65.json", "rows"),
    ("matched_detectors", "markdown", "monitors-matched-66-71.json", "rows"),
    ("matched_detectors", "markdown", "monitors-matched-72-77.json", "rows"),
    ("matched_detectors", "markdown", "monitors-matched-78-83.json", "rows"),
    ("matched_detectors", "markdown", "monitors-matched-84-89.json", "rows"),
    ("matched_detectors", "runs_markdown", "monitors-matched-84-89.json", "failing_runs"),
    ("matched_detectors", "markdown", "monitors-matched-90-95.json", "rows"),
    ("matched_detectors", "runs_markdown", "monitors-matched-90-95.json", "failing_runs"),
    ("matched_detectors", "markdown", "monitors-matched-96-101.json", "rows"),
    ("matched_detectors", "runs_markdown", "monitors-matched-96-101.json", "failing_runs"),
    ("matched_detectors", "markdown", "monitors-matched-102-107.json", "rows"),
    ("matched_detectors", "runs_markdown", "monitors-matched-102-107.json", "failing_runs"),
    ("matched_detectors", "markdown", "monitors-matched-108-113.json", "rows"),
    ("matched_detectors", "runs_markdown", "monitors-matched-108-113.json", "failing_runs"),
    ("matched_detectors", "markdown", "monitors-matched-114-119.json", "rows"),
    ("matched_detectors", "runs_markdown", "monitors-matched-114-119.json", "failing_runs"),
    ("matched_detectors", "markdown", "monitors-matched-120-125.json", "rows"),
    ("matched_detectors", "runs_markdown", "monitors-matched-120-125.json", "failing_runs"),
    ("matched_detectors", "markdown", "monitors-matched-126-131.json", "rows"),
    ("matched_detectors", "runs_markdown", "monitors-matched-126-131.json", "failing_runs"),
    ("matched_detectors", "markdown", "monitors-matched-132-137.json", "rows"),
    ("matched_detectors", "runs_markdown", "monitors-matched-132-137.json", "failing_runs"),
    ("matched_detectors", "markdown", "monitors-matched-138-143.json", "rows"),
    ("matched_detectors", "runs_markdown", "monitors-matched-138-143.json", "failing_runs"),
    ("matched_detectors", "markdown", "monitors-matched-144-149.json", "rows"),
    ("matched_detectors", "runs_markdown", "monitors-matched-144-149.json", "failing_runs"),
    ("matched_detectors", "markdown", "monitors-matched-150-155.json", "rows"),
    ("matched_detectors", "runs_markdown", "monitors-matched-150-155.json", "failing_runs"),
    ("past_horizon", "markdown", "monitors-past-horizon-114-119.json", "rows"),
    ("past_horizon", "markdown", "monitors-past-horizon-120-125.json", "rows"),
    ("past_horizon", "markdown", "monitors-past-horizon-126-131.json", "rows"),
    ("past_horizon", "markdown", "monitors-past-horizon-78-83.json", "rows"),
    ("past_horizon", "markdown", "monitors-past-horizon-90-95.json", "rows"),
    ("past_horizon", "markdown", "monitors-past-horizon-144-149.json", "rows"),
    ("past_horizon", "markdown", "monitors-past-horizon-150-155.json", "rows"),
    ("monitors", "actions_markdown", "monitors-postln-actions-84-89.json", "actions"),
    ("monitors", "actions_markdown", "monitors-postln-control86-88-rollback.json", "actions"),
    ("monitors", "actions_markdown", "monitors-postln-actions-90-95.json", "actions"),
    ("monitors", "actions_markdown", "monitors-postln-actions-96-101.json", "actions"),
    ("monitors", "actions_markdown", "monitors-postln-control96-101-rollback.json", "actions"),
    ("monitors", "actions_markdown", "monitors-postln-actions-102-107.json", "actions"),
    ("monitors", "actions_markdown", "monitors-postln-control102-107-rollback.json", "actions"),
    ("monitors", "actions_markdown", "monitors-postln-actions-108-113.json", "actions"),
    ("monitors", "actions_markdown", "monitors-postln-actions-114-119.json", "actions"),
    ("monitors", "actions_markdown", "monitors-postln-actions-120-125.json", "actions"),
    ("monitors", "actions_markdown", "monitors-postln-actions-126-131.json", "actions"),
    ("monitors", "actions_markdown", "monitors-postln-actions-132-137.json", "actions"),
    ("monitors", "actions_markdown", "monitors-postln-actions-138-143.json", "actions"),
    ("monitors", "actions_markdown", "monitors-postln-actions-144-149.json", "actions"),
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
def test_readme_pooled_bars_are_the_program_s_sums(monkeypatch, failure):
    """The pooled lead and earliness counts over the held-out sets, summed by ``pooled_bars.py`` from
    the committed comparisons, not by hand."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    pooled = importlib.import_module("benchmarks.pooled_bars")
    table = pooled.tables(pooled.default_sets(), failure)
    assert table in README.read_text(), "README lacks pooled_bars.py's table as it prints it"
