"""The divergence model: fitting, calibration, serialisation, the stability edge, bad files."""

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from rksp_cli.calibrate import (
    DivergenceModel,
    ece,
    evaluate,
    load_calibration,
    read_runs,
    save_calibration,
)
from rksp_cli.cli import app
from rksp_cli.errors import InputError
from rksp_cli.risk import CalibratedRisk


def synthetic_runs(n_configs: int = 120, seeds: int = 2, seed: int = 0) -> pd.DataFrame:
    """Runs whose true edge depends on a spectral feature: diverged when lr > edge(near-unit mass)."""
    rng = np.random.default_rng(seed)
    rows = []
    for c in range(n_configs):
        norm = rng.choice(["none", "pre"])
        near = rng.uniform(0.7, 1.0) if norm == "none" else rng.uniform(0.1, 0.4)
        lr = 10 ** rng.uniform(-4, 0)
        edge = 10 ** (-0.5 - 2.5 * near)
        for s in range(seeds):
            noise = rng.normal(0, 0.15)
            rows.append({
                "key": f"{c}-{s}", "config_id": str(c), "config.model.norm": norm,
                "config.training.lr": lr, "config.training.warmup_steps": int(rng.choice([0, 20])),
                "config.training.optimizer": "adamw", "config.training.weight_decay": 0.1,
                "config.model.init_std": 0.02, "feature.n_layers": 4.0, "feature.d_model": 64.0,
                "feature.near_unit_mass_mean": near + rng.normal(0, 0.01),
                "feature.expansive_mass_mean": 1 - near, "feature.spectral_radius_mean": 1 + rng.uniform(0, 1),
                "feature.stream_growth": 1.5, "label": int(np.log10(lr) + noise > np.log10(edge)),
            })  # fmt: skip
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def runs():
    return synthetic_runs()


@pytest.fixture(scope="module")
def fitted(runs):
    return DivergenceModel().fit(runs)


def test_fit_is_deterministic_and_probabilities_are_valid(runs, fitted):
    again = DivergenceModel().fit(runs)
    p = fitted.predict_proba(runs)
    assert np.array_equal(p, again.predict_proba(runs))
    assert np.all((p >= 0) & (p <= 1))
    assert "config.model.norm" not in fitted.columns and not any(c.startswith("norm_") for c in fitted.columns)


def test_json_round_trip_predicts_the_same(tmp_path, runs, fitted):
    save_calibration(tmp_path / "cal.json", fitted, {"n_runs": len(runs)}, runs)
    loaded = load_calibration(tmp_path / "cal.json")
    assert np.allclose(loaded.model.predict_proba(runs), fitted.predict_proba(runs), atol=1e-12)
    assert loaded.fixed_settings["training.optimizer"] == "adamw"
    assert not list(tmp_path.glob(".*.tmp*"))  # written atomically, no temporary left


def test_risk_grows_with_lr_and_the_edge_tracks_the_spectra(tmp_path, runs, fitted):
    save_calibration(tmp_path / "cal.json", fitted, {"n_runs": len(runs)}, runs)
    risk = CalibratedRisk(load_calibration(tmp_path / "cal.json"))
    row = runs.iloc[0].to_dict()
    stable_family = {**row, "feature.near_unit_mass_mean": 0.2, "feature.expansive_mass_mean": 0.8}
    fragile_family = {**row, "feature.near_unit_mass_mean": 0.95, "feature.expansive_mass_mean": 0.05}
    assert risk.edge(fragile_family) < risk.edge(stable_family)
    low = risk.assess({**fragile_family, "config.training.lr": 1e-4})
    high = risk.assess({**fragile_family, "config.training.lr": 0.5})
    assert low.risk < 0.2 < 0.5 < high.risk
    assert high.verdict == "high" and "above the predicted edge" in high.reason and high.calibrated


def test_far_outside_the_calibration_is_flagged(tmp_path, runs, fitted):
    save_calibration(tmp_path / "cal.json", fitted, {"n_runs": len(runs)}, runs)
    risk = CalibratedRisk(load_calibration(tmp_path / "cal.json"))
    row = runs.iloc[0].to_dict()
    assert risk.assess(row).out_of_range == []
    far = risk.assess({**row, "config.training.lr": 1e3, "config.training.optimizer": "sgd"})
    assert any("log10_lr" in f for f in far.out_of_range)
    assert any("optimizer" in f for f in far.out_of_range)


def test_evaluate_reports_every_model_and_baseline_held_out(runs):
    report = evaluate(runs, n_boot=100)
    models = report["models"]
    shipped = models["hyperparameters + size + spectra (shipped)"]
    assert shipped["auroc"] > models["hyperparameters"]["auroc"]  # the edge moves with the spectra here
    assert shipped["auroc_ci95"][0] <= shipped["auroc"] <= shipped["auroc_ci95"][1]
    assert 0 <= shipped["ece"] <= 1 and sum(r["n"] for r in shipped["reliability"]) == len(runs)
    assert "raw near-unit mass (paper's score)" in models and "spectra help" in report["verdict"]


def test_ece_of_a_perfectly_calibrated_coin_is_small_and_of_a_liar_is_large():
    rng = np.random.default_rng(0)
    p = rng.uniform(0, 1, 20000)
    y = (rng.uniform(0, 1, 20000) < p).astype(int)
    assert ece(y, p) < 0.02
    assert ece(y, 1 - p) > 0.3


def test_bad_calibration_files_exit_2(tmp_path):
    from rksp_cli.risk import default_risk_model

    with pytest.raises(InputError, match="no such calibration file"):
        default_risk_model(tmp_path / "missing.json")
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text("{not json")
    with pytest.raises(InputError, match="not a valid rksp calibration"):
        load_calibration(corrupt)
    corrupt.write_text(json.dumps({"kind": "something-else"}))
    result = CliRunner().invoke(app, ["screen", "screens/gpt-small-noln.yaml", "--calibration", str(corrupt)])
    assert result.exit_code == 2 and "not a valid rksp calibration" in result.stderr


def test_runs_without_labels_are_refused(tmp_path):
    path = tmp_path / "r.parquet"
    pd.DataFrame({"key": ["a"], "risk": [0.1]}).to_parquet(path)
    with pytest.raises(InputError, match="rksp sweep --probe"):
        read_runs(path)
