"""The divergence model: monotonicity, transfer validation, intervals, extrapolation, files."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from rksp_cli.cli import app
from rksp_cli.errors import InputError
from rksp_cli.risk import CalibratedRisk, default_risk_model
from rksp_cli.risk.calibration import load_calibration, read_runs, read_token_samples, save_calibration
from rksp_cli.risk.estimator import DivergenceModel, MonotoneLogistic
from rksp_cli.risk.evaluation import architecture_splits, ece, evaluate, scale_split
from rksp_cli.risk.features import SHIPPED, architecture_groups
from rksp_cli.risk.scoring import FittedRisk, NotFittedError


def synthetic_runs(n_arch: int = 60, lrs: int = 6, seed: int = 0) -> pd.DataFrame:
    """Architectures swept over lr: diverged when lr > edge, edge a power law in width and a spectral feature."""
    rng = np.random.default_rng(seed)
    rows = []
    for a in range(n_arch):
        norm = rng.choice(["none", "pre"])
        near = rng.uniform(0.7, 1.0) if norm == "none" else rng.uniform(0.1, 0.4)
        width = float(rng.choice([32, 64, 128, 256]))
        depth = float(rng.choice([2, 4, 8]))
        log_edge = -0.5 - 2.0 * near - 0.5 * math.log2(width / 32)
        for lr in 10 ** rng.uniform(-4, 0, lrs):
            warmup = int(rng.choice([0, 20]))
            rows.append({
                "key": f"{a}-{lr}", "config.model.norm": norm, "config.model.d_model": width,
                "config.model.n_layers": depth, "config.training.lr": lr, "config.training.warmup_steps": warmup,
                "config.training.optimizer": "adamw", "config.training.weight_decay": 0.1,
                "config.model.init_std": 0.02, "feature.n_layers": depth, "feature.d_model": width,
                "feature.near_unit_mass_mean": near, "feature.expansive_mass_mean": 1 - near,
                "feature.spectral_radius_mean": 1 + near, "feature.stream_growth": 1.5 + near,
                "label": int(np.log10(lr) + rng.normal(0, 0.15) - 0.3 * (warmup > 0) > log_edge),
            })  # fmt: skip
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def runs():
    return synthetic_runs()


@pytest.fixture(scope="module")
def fitted(runs):
    return DivergenceModel(n_bootstrap=12).fit(runs, runs["label"])


@pytest.fixture(scope="module")
def risk(tmp_path_factory, runs, fitted):
    path = tmp_path_factory.mktemp("cal") / "cal.json"
    save_calibration(path, fitted, {"n_runs": len(runs)}, runs)
    return CalibratedRisk(load_calibration(path))


def test_sign_constraints_hold_even_against_the_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 2))
    y = (X[:, 0] - X[:, 1] + rng.normal(0, 0.5, 400) > 0).astype(int)  # truly: + in x0, - in x1
    free = MonotoneLogistic().fit(X, y)
    assert free.coef_[0, 0] > 0 > free.coef_[0, 1]
    held = MonotoneLogistic(signs=(-1, +1)).fit(X, y)  # constraints that contradict the data
    assert held.coef_[0, 0] <= 0 <= held.coef_[0, 1]
    assert held.predict_proba(X).shape == (400, 2) and np.allclose(held.predict_proba(X).sum(1), 1)
    from sklearn.linear_model import LogisticRegression

    # Unconstrained, the objectives are the same. Both solvers stop on a gradient tolerance (sklearn's
    # tol=1e-4), so the optima agree to that order relative to the coefficients (about 3 here), not to eps.
    reference = LogisticRegression(C=1.0).fit(X, y)
    assert np.allclose(free.coef_, reference.coef_, rtol=2e-3)
    assert np.allclose(free.intercept_, reference.intercept_, atol=2e-3 * np.abs(reference.coef_).max())


def test_fit_is_deterministic_and_predict_proba_is_n_by_2(runs, fitted):
    again = DivergenceModel(n_bootstrap=12).fit(runs, runs["label"])
    p = fitted.predict_proba(runs)
    assert p.shape == (len(runs), 2) and np.allclose(p.sum(1), 1)
    assert np.array_equal(p, again.predict_proba(runs))
    assert np.array_equal(fitted.interval(runs), again.interval(runs))
    assert not any(c.startswith("norm_") for c in fitted.columns_)


@pytest.mark.parametrize("seed", range(5))
def test_risk_is_monotone_in_lr_and_warmup_for_any_row(fitted, seed):
    rng = np.random.default_rng(seed)
    row = synthetic_runs(n_arch=1, lrs=1, seed=100 + seed).iloc[0].to_dict()
    row |= {"feature.n_layers": float(rng.choice([2, 12, 80])), "feature.d_model": float(rng.choice([64, 8192])),
            "feature.near_unit_mass_mean": rng.uniform(0, 1),
            "feature.stream_growth": 10 ** rng.uniform(0, 3)}  # fmt: skip
    lrs = pd.DataFrame([row] * 50).assign(**{"config.training.lr": np.logspace(-6, 2, 50)})
    assert np.all(np.diff(fitted.predict_proba(lrs)[:, 1]) >= 0)
    warm = pd.DataFrame([row] * 50).assign(**{"config.training.warmup_steps": np.arange(0, 5000, 100)})
    assert np.all(np.diff(fitted.predict_proba(warm)[:, 1]) <= 0)


def test_the_edge_is_where_the_risk_reaches_the_level(risk, runs):
    row = runs.iloc[0].to_dict()
    edge = risk.edge(row)
    below = risk.assess({**row, "config.training.lr": edge / 1.01}).risk
    above = risk.assess({**row, "config.training.lr": edge * 1.01}).risk
    assert below < risk.edge_level < above
    fragile = {**row, "feature.near_unit_mass_mean": 0.95, "feature.expansive_mass_mean": 0.05}
    wider = {**row, "feature.d_model": 256.0}
    assert risk.edge(fragile) < risk.edge(row) and risk.edge(wider) < risk.edge({**row, "feature.d_model": 32.0})


def test_the_edge_interval_spans_the_refits_edges_and_compares_rows_refit_by_refit(fitted, runs):
    rows = runs.iloc[:2]
    edges = fitted.bootstrap_edges(rows, 0.2)
    assert edges.shape == (12, 2) and np.all(edges > 0)
    lo, hi = fitted.edge_interval(rows, 0.2).T
    assert np.all(lo >= edges.min(0) * (1 - 1e-12)) and np.all(hi <= edges.max(0) * (1 + 1e-12)) and np.all(lo < hi)
    wider = rows.assign(**{"feature.d_model": rows["feature.d_model"] * 4})
    # the fit's width law says wider is less stable: so in every refit, not only on average
    assert np.all(fitted.bootstrap_edges(wider, 0.2) < edges)


def test_inside_the_box_a_calibrated_risk_with_an_interval(risk, runs):
    result = risk.assess(runs.iloc[0].to_dict())
    assert result.calibrated and not result.extrapolated and result.out_of_range == []
    lo, hi = result.interval
    assert 0 <= lo <= hi <= 1 and result.gated == (result.risk, "risk")


def test_an_80_block_d8192_row_is_extrapolated_with_a_finite_interval(risk, runs):
    row = {**runs.iloc[0].to_dict(), "feature.n_layers": 80.0, "feature.d_model": 8192.0}
    result = risk.assess(row)
    assert result.extrapolated and not result.calibrated and "extrapolated" in result.reason
    assert "extrapolated" in result.model
    lo, hi = result.interval
    assert math.isfinite(lo) and math.isfinite(hi) and lo <= hi
    assert result.gated == (hi, "upper end of the extrapolation interval")
    flagged = "; ".join(result.out_of_range)
    assert "log2_d_model" in flagged and "log2_n_layers" in flagged


def test_the_family_the_screen_found_is_read_first_and_an_unknown_one_is_said(risk, runs):
    from rksp_cli.risk.features import norm_family

    pre = runs[runs["config.model.norm"] == "pre"].iloc[0].to_dict()
    frame = pd.DataFrame([pre, {**pre, "model.norm": "none"}, {**pre, "config.model.norm": None}])
    assert norm_family(frame).tolist()[:2] == ["pre", "none"] and pd.isna(norm_family(frame).iloc[2])
    # a transformers row: no config.model.norm; what the screen found decides the depth slope
    hf = {k: v for k, v in pre.items() if k != "config.model.norm"}
    assert risk.assess({**hf, "model.norm": "pre"}).risk == pytest.approx(risk.assess(pre).risk, abs=1e-12)
    assert not any("not recognised" in n for n in risk.assess({**hf, "model.norm": "pre"}).notes)
    assert any("not recognised" in n for n in risk.assess(hf).notes)


def test_a_training_setting_the_runs_held_fixed_is_extrapolation(risk, runs):
    result = risk.assess({**runs.iloc[0].to_dict(), "config.training.optimizer": "sgd"})
    assert result.extrapolated and any("optimizer" in f for f in result.out_of_range)


def test_json_round_trip_predicts_the_same(tmp_path, runs, fitted):
    """A calibration file loads into the scorer alone (no scikit-learn), which scores with the
    fitted estimator's own code on the same numbers (JSON keeps every float): bit for bit."""
    save_calibration(tmp_path / "cal.json", fitted, {"n_runs": len(runs)}, runs)
    loaded = load_calibration(tmp_path / "cal.json")
    assert type(loaded.model) is FittedRisk
    assert np.array_equal(loaded.model.predict_proba(runs), fitted.predict_proba(runs))
    assert np.array_equal(loaded.model.interval(runs), fitted.interval(runs), equal_nan=True)
    assert np.array_equal(loaded.model.edge(runs, 0.2), fitted.edge(runs, 0.2), equal_nan=True)
    assert loaded.fixed_settings["training.optimizer"] == "adamw"
    assert not list(tmp_path.glob(".*.tmp*"))  # written atomically, no temporary left


def test_an_unfitted_model_says_so_before_scoring(runs):
    with pytest.raises(NotFittedError, match="not fitted"):
        DivergenceModel().predict_proba(runs)


def test_a_screen_never_imports_the_fitter():
    """Scoring a screen needs numpy and pandas: scikit-learn and SciPy (about 1 s to import) load
    only for `rksp calibrate` and the ladder."""
    code = (
        "import sys; from typer.testing import CliRunner; from rksp_cli.cli import app; "
        "r = CliRunner().invoke(app, ['screen', sys.argv[1], '--spread', '1']); "
        "assert r.exit_code == 0, r.output; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'scipy')))"
    )
    config = Path(__file__).parent.parent / "screens" / "gpt-small-noln.yaml"
    done = subprocess.run([sys.executable, "-c", code, str(config)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_no_architecture_straddles_a_fold_or_the_scale_split(runs):
    groups = architecture_groups(runs).to_numpy()
    # lr, warmup and seed vary within an architecture; norm, width and depth make one
    columns = ["config.model.norm", "config.model.d_model", "config.model.n_layers"]
    arch = runs[columns].astype(str).agg("/".join, axis=1)
    assert len(np.unique(groups)) == arch.nunique() and (pd.crosstab(groups, arch) > 0).sum(axis=1).eq(1).all()
    for train, test in architecture_splits(groups):
        assert not set(groups[train]) & set(groups[test])
    train, test, _ = scale_split(runs)
    assert runs["feature.d_model"].iloc[train].max() < 256 and runs["feature.n_layers"].iloc[train].max() < 8
    assert ((runs["feature.d_model"].iloc[test] == 256) | (runs["feature.n_layers"].iloc[test] == 8)).all()


def test_evaluate_reports_transfer_every_feature_set_and_baseline(runs):
    report = evaluate(runs, n_boot=50)
    v = report["validations"]
    assert set(v) == {"leave-scale-out", "leave-architecture-out", "leave-norm-family-out"}
    assert v["leave-scale-out"]["auroc"] > 0.8  # the law in width extrapolates on data that follow one
    shipped = report["models"][SHIPPED]
    assert shipped["auroc"] > report["models"]["hyperparameters"]["auroc"]
    assert shipped["auroc_ci95"][0] <= shipped["auroc"] <= shipped["auroc_ci95"][1]
    assert sum(r["n"] for r in v["leave-architecture-out"]["reliability"]) == len(runs)
    assert "raw near-unit mass (paper's score)" in report["baselines"] and "spectra help" in report["verdict"]


def test_ece_of_a_perfectly_calibrated_coin_is_small_and_of_a_liar_is_large():
    rng = np.random.default_rng(0)
    p = rng.uniform(0, 1, 20000)
    y = (rng.uniform(0, 1, 20000) < p).astype(int)
    assert ece(y, p) < 0.02
    assert ece(y, 1 - p) > 0.3


def test_the_shipped_calibration_is_monotone_and_extrapolates_honestly():
    risk = default_risk_model()
    assert isinstance(risk, CalibratedRisk)
    report = risk.calibration.report
    assert set(report["validations"]) >= {"leave-scale-out", "leave-architecture-out"}
    row = {"config.training.lr": 1e-3, "config.model.init_std": 0.02, "feature.n_layers": 80.0,
           "feature.d_model": 8192.0, "feature.near_unit_mass_mean": 0.1, "feature.expansive_mass_mean": 0.5,
           "feature.spectral_radius_mean": 2.0, "feature.stream_growth": 3.0, "feature.eta_nl_mean": 0.4}  # fmt: skip
    result = risk.assess(row)
    assert result.extrapolated and result.interval is not None and not result.calibrated
    lrs = pd.DataFrame([row] * 40).assign(**{"config.training.lr": np.logspace(-6, 1, 40)})
    assert np.all(np.diff(risk.calibration.model.predict_proba(lrs)[:, 1]) >= 0)
    # every calibration run trained without z-loss: a run that uses it is outside the calibration
    assert risk.calibration.fixed_settings["training.z_loss"] == 0.0
    inside = {**row, "feature.n_layers": 4.0, "feature.d_model": 64.0, "config.training.z_loss": 0.0}
    flagged = risk.assess({**inside, "config.training.z_loss": 1e-4}).out_of_range
    assert any("z_loss" in f for f in flagged) and not any("z_loss" in f for f in risk.assess(inside).out_of_range)


def test_bad_calibration_files_exit_2(tmp_path):
    with pytest.raises(InputError, match="no such calibration file"):
        default_risk_model(tmp_path / "missing.json")
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text("{not json")
    with pytest.raises(InputError, match="not a valid rksp calibration"):
        load_calibration(corrupt)
    corrupt.write_text(json.dumps({"kind": "rksp-divergence-model", "model": {}}))  # an old (format 1) file
    with pytest.raises(InputError, match="refit with `rksp calibrate`"):
        load_calibration(corrupt)
    corrupt.write_text(json.dumps({"kind": "something-else"}))
    result = CliRunner().invoke(app, ["screen", "screens/gpt-small-noln.yaml", "--calibration", str(corrupt)])
    assert result.exit_code == 2 and "not a valid rksp calibration" in result.stderr


def test_runs_without_labels_are_refused(tmp_path):
    path = tmp_path / "r.parquet"
    pd.DataFrame({"key": ["a"], "risk": [0.1]}).to_parquet(path)
    with pytest.raises(InputError, match="rksp sweep --probe"):
        read_runs([path])
    with pytest.raises(InputError, match="stall label"):
        read_runs([path], label="label_any")


def test_the_edge_spread_over_token_samples_is_measured_on_runs_the_fit_never_saw(runs, tmp_path):
    rng = np.random.default_rng(1)
    # the other token samples of each run: the same spectra but a near-unit mass drawn again (noise)
    near = "feature.near_unit_mass_mean"
    samples = pd.concat(
        [runs[["key"]].assign(sample=k, **{c: runs[c] for c in runs.columns if c.startswith("feature.")})
         .assign(**{near: runs[near] + rng.normal(0, 0.02, len(runs))}) for k in (1, 2, 3)]
    )  # fmt: skip
    path = tmp_path / "samples.parquet"
    samples.to_parquet(path)
    replicates = read_token_samples(path, runs)
    assert len(replicates) == 3 * len(runs) and (replicates.groupby("key")["label"].nunique() == 1).all()
    report = evaluate(runs, n_boot=20, token_samples=replicates)
    assert report["token_samples"] == 4
    spread = {name: m["edge_spread"] for name, m in report["models"].items()}
    assert spread["hyperparameters + size"]["median"] == pytest.approx(1.0)  # reads no spectra: never moves
    shipped = spread[SHIPPED]
    assert shipped["runs"] == len(runs) and shipped["median"] > 1.01  # the noisy mass moves its edge
    # the data's log10 edge moves 2.0 per unit of near-unit mass, so noise of SD 0.02 moves it by SD 0.04
    # decades; four samples span under 4 SD but for rare runs, and a fit may overshoot the slope 2x
    assert shipped["p90"] < 10 ** (2 * 4 * 0.04)


def test_runs_with_token_samples_must_have_as_many_and_runs_without_are_left_out(runs, tmp_path):
    path = tmp_path / "samples.parquet"
    one = pd.DataFrame({"key": runs["key"].iloc[1:], "sample": 1, "feature.gap_mass_mean": 0.1})
    pd.concat([one, one.iloc[1:].assign(sample=2)]).to_parquet(path)  # run 1 has one sample, the rest two
    with pytest.raises(InputError, match=r"samples\.parquet: 1 of .* runs lack some token samples"):
        read_token_samples(path, runs)
    one.to_parquet(path)  # run 0 has none: left out of the spread
    replicates = read_token_samples(path, runs)
    assert len(replicates) == len(runs) - 1 and runs["key"].iloc[0] not in set(replicates["key"])
    report = evaluate(runs, n_boot=20, token_samples=replicates)
    assert report["token_samples"] == 2
    assert report["models"]["hyperparameters + size"]["edge_spread"]["runs"] == len(runs) - 1
    pd.DataFrame({"key": ["not a run"], "sample": 1, "feature.gap_mass_mean": 0.1}).to_parquet(path)
    with pytest.raises(InputError, match="lack some token samples"):
        read_token_samples(path, runs)
    pd.DataFrame({"key": runs["key"], "gap": 0.1}).to_parquet(path)
    with pytest.raises(InputError, match="expected key, sample and feature"):
        read_token_samples(path, runs)
    with pytest.raises(InputError, match="no such file"):
        read_token_samples(tmp_path / "missing.parquet", runs)


def test_runs_the_screen_could_not_assess_are_left_out_of_the_fit(runs, tmp_path):
    """An init whose forward pass overflows has no features: imputing them would teach the model
    that featureless runs are typical ones, and the screen never scores such an init anyway."""
    path = tmp_path / "r.parquet"
    frame = runs.assign(screen_error=None, error=None)
    frame.loc[frame.index[:3], "screen_error"] = "the output of block 20 holds NaN or inf values"
    frame.loc[frame.index[3], "error"] = "OSError: transient"
    frame.to_parquet(path)
    read = read_runs([path])
    assert len(read) == len(runs) - 4 and read["screen_error"].isna().all()
