"""What the control-margin scripts share (benchmarks/control_margin.py): their command line."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("script", ["sublayer_margin", "logit_margin", "alignment_margin"])
def test_no_saved_runs_is_a_usage_error(tmp_path, script):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), "--seeds", "5-6", "--runs", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "no saved runs of seeds 5-6" in done.stderr
