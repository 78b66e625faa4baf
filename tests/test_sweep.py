"""Grids, the durable store, resumption after a kill, and the Ray backend."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from rksp_cli.cli import app
from rksp_cli.errors import InputError
from rksp_cli.sweep import load_grid, run_sweep

BASE = "model: {n_layers: 2, d_model: 32}\nprobe: {tokens: 256}\ntraining: {steps: 20}\n"


@pytest.fixture
def grid(tmp_path):
    def make(body: str) -> str:
        (tmp_path / "base.yaml").write_text(BASE)
        path = tmp_path / "grid.yaml"
        path.write_text("base: base.yaml\n" + body)
        return path

    return make


def test_grid_expands_lists_log_ranges_and_seeds(grid):
    points = load_grid(
        grid("axes:\n  training.lr: {log: [1e-4, 1e-2], num: 3}\n  model.norm: [pre, none]\nseeds: [0, 1]\n")
    )
    assert len(points) == 12 and len({p.key for p in points}) == 12
    lrs = sorted({p.config["training"]["lr"] for p in points})
    assert lrs == pytest.approx([1e-4, 1e-3, 1e-2])
    assert all(p.config["model"]["d_model"] == 32 for p in points)  # the base applies
    sampled = load_grid(
        grid("axes:\n  training.lr: {log: [1e-4, 1e-2], num: 5}\n  model.norm: [pre, none]\nsample: 3\n")
    )
    assert len(sampled) == 3


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("axes:\n  training.lrr: [0.1]\n", "training.lrr"),
        ("axes:\n  training.lr: []\n", "empty"),
        ("axes:\n  training.lr: {log: [0, 1], num: 3}\n", "positive"),
        ("axes:\n  training.lr: {log: [1e-3, 1e-1]}\n", "axes.training.lr"),
        ("axes:\n  model.n_layers: [two]\n", "model.n_layers"),
        ("axes: {}\n", "axes"),
        ("axes:\n  training.lr: [0.1]\nseeds: 3\n", "seeds"),
        ("axes:\n  training.lr: [0.1]\nworkers: 3\n", "unknown field"),
    ],
)
def test_bad_grids_fail_before_any_work(grid, body, fragment, tmp_path):
    path = grid(body)
    with pytest.raises(InputError, match=fragment):
        load_grid(path)
    result = CliRunner().invoke(app, ["sweep", str(path), "--out", str(tmp_path / "r.parquet")])
    assert result.exit_code == 2 and fragment in result.stderr
    assert not (tmp_path / "r.parquet.journal").exists()


def test_sweep_records_failures_and_resumes_without_redoing(grid, tmp_path, monkeypatch):
    points = load_grid(grid("axes:\n  training.lr: [0.001, 0.01]\n  training.task: [synthetic_lm, assoc_recall]\n"))
    out = tmp_path / "r.parquet"
    frame = run_sweep(points[:3], out, probe=True)
    assert len(frame) == 3 and frame["error"].isna().all()
    assert set(frame["label"]) <= {0, 1}

    import rksp_cli.sweep as sweep

    calls = []
    real = sweep.run_point
    monkeypatch.setattr(sweep, "run_point", lambda *a: calls.append(a) or real(*a))
    frame = run_sweep(points, out, probe=True)
    assert len(calls) == 1 and len(frame) == 4  # only the new point ran
    assert frame["key"].is_unique


def test_a_failing_point_is_recorded_and_the_sweep_goes_on(grid, tmp_path):
    points = load_grid(grid("axes:\n  model.zero_init_residual: [true, false]\n"))
    frame = run_sweep(points, tmp_path / "r.parquet")
    failed = frame[frame["error"].notna()]
    assert len(frame) == 2 and len(failed) == 1 and "identity" in failed["error"].iloc[0]


def test_a_failed_point_is_tried_again_on_resume_and_replaced(grid, tmp_path, monkeypatch):
    import rksp_cli.sweep as sweep

    points = load_grid(grid("axes:\n  training.lr: [0.001, 0.01]\n"))
    out = tmp_path / "r.parquet"
    real = sweep.run_point
    monkeypatch.setattr(sweep, "run_point", lambda config, key, *rest: {"key": key, "error": "OSError: transient"}
                        if key == points[0].key else real(config, key, *rest))  # fmt: skip
    assert run_sweep(points, out)["error"].notna().sum() == 1
    calls = []
    monkeypatch.setattr(sweep, "run_point", lambda *a: calls.append(a) or real(*a))
    frame = run_sweep(points, out)
    assert len(calls) == 1 and calls[0][1] == points[0].key  # only the failed point ran again
    assert len(frame) == 2 and frame["error"].isna().all() and frame["key"].is_unique


def test_sigkill_midway_then_resume_keeps_every_point_exactly_once(grid, tmp_path):
    path = grid("axes:\n  training.lr: {log: [1e-4, 1e-2], num: 10}\n  model.norm: [pre, none]\n")
    out = tmp_path / "r.parquet"
    cmd = [sys.executable, "-m", "rksp_cli", "sweep", str(path), "--out", str(out), "--probe"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    journal = tmp_path / "r.parquet.journal"
    deadline = time.time() + 120
    done = 0
    while time.time() < deadline and proc.poll() is None:
        if journal.exists():
            try:
                done = sqlite3.connect(journal).execute("SELECT count(*) FROM points").fetchone()[0]
            except sqlite3.OperationalError:
                done = 0
            if done >= 3:
                break
        time.sleep(0.05)
    assert proc.poll() is None, "the sweep finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not out.exists()  # the export only happens at the end
    before = {k: json.loads(r) for k, r in sqlite3.connect(journal).execute("SELECT key, row FROM points")}
    assert 3 <= len(before) < 20

    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    frame = pd.read_parquet(out)
    assert len(frame) == 20 and frame["key"].is_unique
    assert set(frame["key"]) == {p.key for p in load_grid(path)}
    resumed = frame.set_index("key")
    for key, row in before.items():  # points finished before the kill were not redone
        assert resumed.loc[key, "seconds"] == pytest.approx(row["seconds"])


def test_ray_backend_on_a_local_instance(grid, tmp_path):
    ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'rksp[ray]'")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        points = load_grid(grid("axes:\n  training.lr: [0.001, 0.01, 0.1]\n"))
        frame = run_sweep(points, tmp_path / "r.parquet", backend="ray")
        assert len(frame) == 3 and frame["error"].isna().all()
    finally:
        ray.shutdown()


@pytest.mark.parametrize("path", sorted((Path(__file__).parent.parent / "grids").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_grids_are_valid(path):
    points = load_grid(path)
    assert points and len({p.key for p in points}) == len(points)
