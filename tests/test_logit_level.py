"""Whether a level of the largest attention logit separates failing runs from controls
(benchmarks/logit_level.py)."""

import pytest

from rksp_cli.monitors.failures import WatchedRun
from tests.fakes import saved_run


@pytest.fixture
def logit_level(benchmark_script):
    return benchmark_script("logit_level")


def run(kind: str, logits: list[float], explode_at: int | None = None) -> WatchedRun:
    """A run checked every 50 steps whose largest logit at check i is ``logits[i]``."""
    series = [{"step": 50 * i, "metrics": {"attn_logit_max": v}} for i, v in enumerate(logits)]
    return saved_run(series, "attention_logits", kind, exploded_step=explode_at)


def test_a_level_reached_only_at_or_after_the_failure_does_not_count(logit_level):
    logits = [10.0] * 20 + [90.0] * 20
    assert logit_level.first_reached(run("failing", logits), 75) == 1000
    assert logit_level.first_reached(run("failing", logits, explode_at=1000), 75) is None
    assert logit_level.first_reached(run("failing", logits, explode_at=1001), 75) == 1000


def test_rows_count_failures_that_failed_clean_controls_and_the_lead_bar(logit_level):
    early = run("failing", [90.0] * 40, explode_at=1900)  # from step 0, 1900 steps ahead: bar met
    late = run("failing", [10.0] * 37 + [90.0] * 3, explode_at=1900)  # 50 steps ahead: bar missed
    never_failed = run("failing", [90.0] * 40)  # not counted: it did not fail
    quiet = run("control_low_lr", [50.0] * 40)
    loud = run("control_low_lr", [50.0] * 30 + [80.0] * 10)
    failed_control = run("control", [500.0] * 40, explode_at=1500)  # fails itself: not counted
    rows = logit_level.rows([early, late, never_failed, quiet, loud, failed_control], [75.0])
    assert rows == [
        "| post_ln_without_warmup | failing | 2 | 75 | 2 | 1 |",
        "| post_ln_without_warmup | control | 0 | 75 | 0 | - |",
        "| post_ln_without_warmup | control_low_lr | 2 | 75 | 1 | - |",
    ]
