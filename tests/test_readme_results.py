"""The README's monitor benchmark tables are what the benchmarks print from the committed results.

Issue 16 asks for results "so that the figures in the README can be checked by a program": this is
that program. A table edited by hand, or a results file rerun without the README following, fails.
"""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


@pytest.fixture
def benchmarks(monkeypatch):
    """The benchmark scripts import their sibling ``machine`` module as a script would."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))


@pytest.mark.parametrize(
    ("module", "results", "key"),
    [
        ("monitors", "monitors.json", "head_to_head"),
        ("matched_detectors", "monitors-matched.json", "rows"),
    ],
)
def test_readme_table_is_the_benchmark_output(benchmarks, module, results, key):
    import importlib

    markdown = importlib.import_module(f"benchmarks.{module}").markdown
    table = markdown(json.loads((RESULTS / results).read_text())[key])
    assert table in (ROOT / "README.md").read_text(), f"README lacks {results}'s table as the benchmark prints it"


def test_readme_actions_table_is_the_benchmark_output(benchmarks):
    from benchmarks.monitors import actions_markdown

    rows = json.loads((RESULTS / "monitors-backoff-fresh.json").read_text())["actions"]
    assert rows, "the back-off run measured no policy"
    assert actions_markdown(rows) in (ROOT / "README.md").read_text()
