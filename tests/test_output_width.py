"""What CI logs show: every command's output at 80 columns, no line longer, no name cut to '…'."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import rksp_cli.cli
from rksp_cli.cli import app

WIDTH = 80


@pytest.fixture
def narrow(monkeypatch):
    """The CLI's consoles as a CI log has them: 80 columns, not a terminal."""
    monkeypatch.setattr(rksp_cli.cli, "out", Console(width=WIDTH))
    monkeypatch.setattr(rksp_cli.cli, "err", Console(width=WIDTH, stderr=True))

    def run(*args: object) -> str:
        result = CliRunner().invoke(app, [str(a) for a in args])
        assert result.exit_code in (0, 1), result.output
        return result.output

    return run


def assert_fits(text: str) -> None:
    for line in text.splitlines():
        assert len(line) <= WIDTH, f"{len(line)} columns: {line!r}"
        assert "…" not in line, f"a name was cut: {line!r}"


def _yaml(tmp: Path, text: str, name: str = "screen.yaml") -> Path:
    (tmp / name).write_text(text)
    return tmp / name


def test_screen_table_panel_and_profile_fit(narrow, tmp_path):
    path = _yaml(tmp_path, "model: {n_layers: 12}\ntraining: {lr: 0.003}\nprobe: {tokens: 256}\n")
    text = narrow("screen", path, "--profile", "--fail-above", "0.99")
    assert "risk" in text and "gate:" in text
    assert_fits(text)


def test_probe_panel_fits_and_names_the_baseline_step(narrow, tmp_path):
    path = _yaml(tmp_path, "model: {n_layers: 2, norm: none}\ntraining: {lr: 0.3}\nprobe: {tokens: 256}\n")
    text = narrow("probe", path, "--steps", "30")
    assert "gradient norm at step" in text and " k " not in text
    assert_fits(text)


def test_sweep_tables_fit_with_four_axes(narrow, tmp_path):
    _yaml(tmp_path, "model: {n_layers: 2, d_model: 32}\nprobe: {tokens: 256}\n", "base.yaml")
    grid = _yaml(
        tmp_path,
        "base: base.yaml\naxes:\n  training.lr: [0.0001, 0.5]\n  model.norm: [pre, none]\n"
        "  training.warmup_steps: [0, 10]\n  model.mlp_ratio: [2, 4]\n",
        "grid.yaml",
    )
    text = narrow("sweep", grid, "--out", tmp_path / "s.parquet")
    assert "riskiest" in text and "predicted stability edge" in text
    assert_fits(text)


def test_calibration_table_fits(narrow, tmp_path):
    from tests.test_risk_model import synthetic_runs

    synthetic_runs(n_arch=30).to_parquet(tmp_path / "runs.parquet")
    text = narrow("calibrate", tmp_path / "runs.parquet", "--out", tmp_path / "c.json", "--bootstrap", "20")
    assert "AUROC" in text
    assert_fits(text)


def test_compare_table_fits(narrow, tmp_path):
    paths = []
    for lr in (0.001, 0.3):
        result = CliRunner().invoke(app, ["screen", str(_yaml(tmp_path, "probe: {tokens: 256}\n")), "--json",
                                          "--set", f"training.lr={lr}"])  # fmt: skip
        paths.append(tmp_path / f"{lr}.json")
        paths[-1].write_text(result.stdout)
    text = narrow("compare", *paths)
    assert "config changes" in text
    assert_fits(text)


def test_watch_dashboard_fits_with_long_reasons(narrow, tmp_path):
    log = tmp_path / "metrics.jsonl"
    reason = "sign entropy 0.312 bit < 0.5 for 3 checks (p+ 0.94) while sigma_1 grows abnormally (robust z 7.1)"
    records = [{"event": "start", "every": 10, "monitors": ["spectral_alignment", "attention_entropy"]}]
    for step in range(0, 50, 10):
        alert = {"step": step, "monitor": "spectral_alignment", "layer": "blocks.11.attn.qkv", "level": "alarm",
                 "reason": reason}  # fmt: skip
        records.append({"step": step, "loss": 3.0 - step / 100, "metrics": {"sa_entropy_min": 0.3}, "alerts": [alert]})
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    text = narrow("watch", log, "--once")
    assert "blocks.11.attn.qkv" in text.replace("\n", "").replace("│", "").replace(" ", "")
    assert_fits(text)


def test_fault_tables_fit(narrow):
    text = narrow("faults", "--steps", "30", "--inject-at", "15", "--fault", "lr_jump")
    assert "spectral_alignment" in text and "attention_entropy" in text
    assert_fits(text)


@pytest.mark.parametrize("command", ["screen", "probe", "sweep", "calibrate", "faults", "watch", "compare"])
def test_help_fits_and_shows_no_type_placeholders(command):
    text = CliRunner().invoke(app, [command, "--help"], terminal_width=WIDTH).output
    assert "<bool>" not in text
    assert_fits(text)


def test_ladder_plan_table_and_screen_lines_fit(narrow, tmp_path):
    path = _yaml(tmp_path, "model: {d_model: 64, n_layers: 1, n_heads: 2, norm: none}\ntraining: {lr: 0.003, steps: 30}"
                           "\nprobe: {tokens: 128}\n")  # fmt: skip
    out = tmp_path / "ladder.parquet"
    text = narrow("ladder", path, "--out", out, "--widths", "8,16,32", "--lr-range", "1e-3,3", "--lr-points", "4",
                  "--resolution", "3")  # fmt: skip
    assert "ladder edge at width 64" in text and "law: edge ∝ width^" in text
    assert_fits(text)
    text = narrow("screen", path, "--ladder", out, "--fail-above", "0.99")
    assert "ladder edge" in text and "P(edge below it)" in text
    assert_fits(text)
