"""The shipped calibration data: its features are what today's estimator measures on each run's init.

A change to the estimator that is not followed by `make rescreen` would leave the risk model
fitted on features the screen no longer produces; these tests catch that.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from calibration.rescreen import ESTIMATOR_FIELDS, run_config
from rksp_cli.koopman import _CANCELLATION_CUT
from rksp_cli.risk.features import FEATURES, MEANS, NOISY
from rksp_cli.screen import screen
from rksp_cli.spec import flatten, spec_from_dict
from tests.tolerances import EPS32

RUNS = Path(__file__).parent.parent / "calibration" / "runs.parquet"
SCALE_RUNS, TOKEN_SAMPLES = RUNS.with_name("scale-runs.parquet"), RUNS.with_name("token-samples.parquet")


@pytest.fixture(scope="module")
def runs() -> pd.DataFrame:
    return pd.read_parquet(RUNS)


def _same(a: object, b: object) -> bool:
    missing = [v is None or (isinstance(v, float) and math.isnan(v)) for v in (a, b)]
    if any(missing):
        return all(missing)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return str(a) == str(b)


def test_a_labelled_run_is_rebuilt_from_its_own_config(runs):
    row = runs.iloc[0]
    rebuilt = flatten(spec_from_dict(run_config(row)).resolved(), "config")
    recorded = [c for c in row.index if c.startswith("config.")]  # fields added since take their defaults
    assert len(recorded) > 20
    for column in recorded:
        assert _same(rebuilt[column], row[column]), (column, rebuilt[column], row[column])


RECORDED_SINCE = {"token_states"}  # screen outputs the shipped runs predate; the risk model reads none


@pytest.mark.parametrize("index", [0, 137, 555])
def test_shipped_features_are_what_the_current_estimator_measures(runs, index):
    row = runs.iloc[index]
    for name in ESTIMATOR_FIELDS:  # the runs were re-screened with today's estimator defaults
        assert _same(row[f"config.probe.{name}"], spec_from_dict({}).probe.model_dump()[name])
    config = run_config(row)
    features = screen(spec_from_dict(config)).features  # the default path: eigenvalues alone, float32 solve
    config["probe"]["kappa"] = True  # the shipped runs carry kappa(V), which the screen computes on request
    features |= {k: v for k, v in screen(spec_from_dict(config)).features.items() if "kappa" in k}
    d = features["d_model"]
    for name, value in features.items():
        if name in RECORDED_SINCE:
            continue
        shipped = row[f"feature.{name}"]
        if "mass" in name:  # round-off may carry one eigenvalue of d across a band edge
            assert abs(value - shipped) <= 1 / d + 1e-12 or (math.isnan(value) and math.isnan(shipped)), name
        elif "kappa" in name:
            # an eigenvector-derived quantity moves by ~ n u kappa^2 (relative) under a relative
            # perturbation u of the operator; the states are float32 (u = 2^-24) and their round-off
            # differs between CPUs: 0.2% at kappa = 200, over 100% at kappa = 3000 (not reproducible)
            rel = d * 2.0**-24 * row["feature.kappa_max"] ** 2
            if "log10" in name:
                assert value == pytest.approx(shipped, abs=rel / math.log(10), nan_ok=True), name
            else:
                assert value == pytest.approx(shipped, rel=rel, nan_ok=True), name
        elif "spectral_radius" in name:
            # the default path solves for eigenvalues in float32: Bauer-Fike with a backward error of
            # d u ||A||, u = 2^-24, ||A|| ~ rho; a mean, extreme or std over layers moves by at most
            # twice the largest per-layer move
            bound = 2 * d * 2.0**-24 * row["feature.kappa_max"] * row["feature.spectral_radius_max"]
            assert value == pytest.approx(shipped, rel=1e-5, abs=bound, nan_ok=True), name
        elif "eta_nl" in name:
            # float32 states: the products behind eta_nl^2 are formed in float32 (koopman._gram_eigh),
            # each squared norm carrying ~sqrt(N) eps32 relative round-off, and eta_nl^2 is their
            # difference, at least _CANCELLATION_CUT[float32] of the larger (smaller ones are redone
            # in float64); a layer's eta_nl moves by about that ratio at most, an aggregate over layers by
            # twice the largest layer's move
            moved = math.sqrt(row["config.probe.tokens"]) * EPS32 / _CANCELLATION_CUT[torch.float32]
            assert value == pytest.approx(shipped, abs=2 * moved * row["feature.eta_nl_max"], nan_ok=True), name
        else:  # float32 forward passes differ between CPUs at ~1e-7 relative
            assert value == pytest.approx(shipped, rel=1e-5, nan_ok=True), name


def test_the_token_samples_are_the_screens_other_samples_and_justify_the_products(runs):
    samples = pd.read_parquet(TOKEN_SAMPLES)
    per_run = samples.groupby("key").size()
    assert set(per_run.index) >= set(runs["key"]) and per_run.nunique() == 1
    row = runs.iloc[0]
    again = screen(spec_from_dict(run_config(row)), repeats=1 + int(per_run.iloc[0])).samples
    stored = samples[samples["key"] == row["key"]].sort_values("sample")["feature.near_unit_mass_mean"]
    one_eigenvalue = 1 / row["feature.d_model"] + 1e-12  # round-off may carry one across a band edge
    for features, near in zip(again, [row["feature.near_unit_mass_mean"], *stored], strict=True):
        assert features["near_unit_mass_mean"] == pytest.approx(near, abs=one_eigenvalue)
    # features.NOISY: the spectral means too noisy (within-run spread over 1/10 of between-run) for products
    shipped = pd.concat([pd.read_parquet(RUNS), pd.read_parquet(SCALE_RUNS)], ignore_index=True)
    every = pd.concat([shipped, samples], ignore_index=True)
    for name in MEANS:
        within = FEATURES[name](every).groupby(every["key"]).std().mean()
        between = FEATURES[name](shipped).std()
        assert (within / between > 0.1) == (name in NOISY), (name, within / between)
