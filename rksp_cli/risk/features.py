"""From a flat screen row (``config.*``, ``feature.*``) to the numbers the risk model reads.

Every feature exists for any model a user can screen: training hyperparameters, size (depth,
width, init scale) and the layer-mean spectra. Two choices, both by measurement (README, "The
risk number"):

* **Layer means, and their pairwise products.** The per-layer extremes (min, max, std over depth)
  and kappa(V) moved the predicted edge 1.3-2.2x between token samples of one model (issue 13):
  kappa alone moved the score by 0.32 at d = 512. The means are stable; their products (a
  quadratic in the spectra and the init scale) recover what the extremes carried about the
  normalisation family (leave-architecture-out AUROC 0.89 linear, 0.97 with the products).
* **No products of the gap mass.** The gap band (0.80-0.90) holds few eigenvalues, so its mass is
  the noisiest spectral mean relative to how much it differs between runs: over 4 token samples
  of each of the 1040 calibration screens (``calibration/token_samples.py``) its within-run spread is 1/6 of
  its between-run spread, against 1/29 to 1/100 for the other means. A product adds its factors'
  relative noise, and the fit leaned on gap-mass products with large opposite-signed weights that
  turned that noise into a moving edge. Without them the held-out edge moves less between token
  samples of one run (90th percentile 2.48x -> 1.94x) at an AUROC cost of 0.008 (README, "The
  risk number"). Rule: products only of features that differ between runs by at least 10x their
  within-run spread.
* **Scale as a law.** Depth and width enter as log2, linearly, lr as log10 and nothing multiplies
  the lr: the log stable edge is linear in log width and log depth (a power law, as published lr
  tables are) and the risk is monotone in lr at any size, inside the calibrated box or not. No
  product involves width or the spectra with depth, so nothing quadratic is extrapolated along
  the scale ladder; depth's slope alone differs per normalisation family (``DEPTH_PER_NORM``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

Column = Callable[[pd.DataFrame], pd.Series]


def column(frame: pd.DataFrame, name: str) -> pd.Series:
    """A numeric column, NaN where absent or not a number."""
    if name in frame:
        return pd.to_numeric(frame[name], errors="coerce").astype(float)
    return pd.Series(np.nan, index=frame.index, dtype=float)


def _log(frame: pd.DataFrame, name: str, base: float = 10.0, floor: float = 1e-12) -> pd.Series:
    return np.log(column(frame, name).clip(lower=floor)) / np.log(base)


def _init_std(frame: pd.DataFrame) -> pd.Series:
    """config.model.init_std for the built-in GPT, else the screen's (a transformers config's initializer_range)."""
    return column(frame, "config.model.init_std").fillna(column(frame, "feature.init_std"))


def _clipped(frame: pd.DataFrame) -> pd.Series:
    """1 when the gradient norm is clipped (at any threshold), else 0."""
    return column(frame, "config.training.grad_clip").notna().astype(float)


def _batch(frame: pd.DataFrame) -> pd.Series:
    return np.log2(column(frame, "config.training.batch_size").fillna(16.0))


FEATURES: dict[str, Column] = {
    # training hyperparameters
    "log10_lr": lambda f: _log(f, "config.training.lr"),
    "log1p_warmup": lambda f: np.log1p(column(f, "config.training.warmup_steps").fillna(0.0)),
    "clipped": _clipped,
    "log2_batch": _batch,
    # size, known for any model
    "log2_n_layers": lambda f: _log(f, "feature.n_layers", base=2),
    "log2_d_model": lambda f: _log(f, "feature.d_model", base=2),
    "log10_init_std": lambda f: np.log10(_init_std(f).clip(lower=1e-6)),
    # layer-mean spectra of the residual stream at init
    "near_unit_mass_mean": lambda f: column(f, "feature.near_unit_mass_mean"),
    "expansive_mass_mean": lambda f: column(f, "feature.expansive_mass_mean"),
    "gap_mass_mean": lambda f: column(f, "feature.gap_mass_mean"),
    "log10_rho_mean": lambda f: _log(f, "feature.spectral_radius_mean"),
    "eta_nl_mean": lambda f: column(f, "feature.eta_nl_mean"),
    "log10_stream_growth": lambda f: _log(f, "feature.stream_growth"),
    # candidates beyond the spectra, measured in the report and not shipped: the gradient scale at
    # init (pre-clip global norm of the first step's gradient) and Admin's output change per unit
    # lr of a first Adam step (probe.update_sensitivity); both lr-free. A screen would need a
    # backward pass for either; it is only worth one if they earn their place.
    "log10_init_grad_norm": lambda f: np.log10(column(f, "baseline.init_grad_norm").clip(1e-12, 1e12)),
    "log10_update_sensitivity": lambda f: np.log10(column(f, "baseline.update_sensitivity").clip(1e-12, 1e12)),
}
HYPER = ("log10_lr", "log1p_warmup", "clipped", "log2_batch")
SIZE = ("log2_n_layers", "log2_d_model", "log10_init_std")
GRADIENT, SENSITIVITY = ("log10_init_grad_norm",), ("log10_update_sensitivity",)
MEANS = tuple(k for k in FEATURES if k not in HYPER + SIZE + GRADIENT + SENSITIVITY)


def _product(a: str, b: str) -> Column:
    return lambda f: FEATURES[a](f) * FEATURES[b](f)


# within-run (token-sample) spread of gap_mass_mean is 1/6 of its between-run spread, below the
# 1/10 a product factor needs (module docstring); ``test_calibration_data`` re-measures it
NOISY = ("gap_mass_mean",)
_FACTORS = (*(m for m in MEANS if m not in NOISY), "log10_init_std")
PRODUCTS = tuple(f"{a}*{b}" for i, a in enumerate(_FACTORS) for b in _FACTORS[i:])
FEATURES.update({name: _product(*name.split("*")) for name in PRODUCTS})
SPECTRA = MEANS + PRODUCTS
NORMS = ("none", "pre", "post", "rms", "deepnorm", "subln")


def norm_family(frame: pd.DataFrame) -> pd.Series:
    """Each row's normalisation family: the one its screen found (``model.norm``, transformers
    models included; ``rksp_cli.models.norm``), else the built-in GPT's ``config.model.norm``
    (rows recorded before screens reported it); None where neither is known."""
    missing = pd.Series(None, index=frame.index, dtype=object)
    found = frame.get("model.norm", missing).astype(object)
    return found.where(found.notna(), frame.get("config.model.norm", missing).astype(object))


def _is_norm(frame: pd.DataFrame, norm: str) -> pd.Series:
    """1 where the row's normalisation family is ``norm``, else 0 (0 in every family when unknown)."""
    return (norm_family(frame) == norm).astype(float)


# A depth slope per normalisation family beside the shared one: Post-LN loses stability with depth
# much faster than pre-LN (Xiong et al. 2020; Liu et al. 2020). Written down before the GPU runs
# at width 512-1024 and 12-24 blocks existed and then tested on them (calibration/gpu_scale.py):
# AUROC 0.976 against 0.922 without it. A model whose family is unknown gets the shared slope only.
DEPTH_PER_NORM = tuple(f"log2_n_layers_{n}" for n in NORMS)


def _depth_of(norm: str) -> Column:
    return lambda f: _is_norm(f, norm) * FEATURES["log2_n_layers"](f)


FEATURES.update({f"log2_n_layers_{n}": _depth_of(n) for n in NORMS})

# The sign each coefficient is held to: +1 risk may only rise with the feature, -1 only fall.
# A higher lr never makes a run safer, nor does a longer warmup (Xiong et al. 2020; Liu et al.
# 2020), nor clipping the gradient norm (measured: 3/24 against 19/24 diverged, README "KSS").
MONOTONE = {"log10_lr": +1, "log1p_warmup": -1, "clipped": -1}

FEATURE_SETS = {
    "hyperparameters": HYPER,
    "hyperparameters + size": HYPER + SIZE,
    "hyperparameters + spectra": HYPER + SPECTRA,
    "hyperparameters + size + depth per norm family": HYPER + SIZE + DEPTH_PER_NORM,
    "hyperparameters + size + spectra": HYPER + SIZE + SPECTRA,
    "hyperparameters + size + spectra + depth per norm family (shipped)": HYPER + SIZE + SPECTRA + DEPTH_PER_NORM,
    "hyperparameters + size + spectra + norm labels": HYPER + SIZE + SPECTRA + tuple(f"norm_{n}" for n in NORMS),
    "hyperparameters + size + init gradient norm": HYPER + SIZE + GRADIENT,
    "hyperparameters + size + spectra + init gradient norm": HYPER + SIZE + SPECTRA + GRADIENT,
    "hyperparameters + size + update sensitivity (Admin)": HYPER + SIZE + SENSITIVITY,
    "hyperparameters + size + spectra + update sensitivity": HYPER + SIZE + SPECTRA + SENSITIVITY,
}
SHIPPED = "hyperparameters + size + spectra + depth per norm family (shipped)"
WITHOUT_SPECTRA = "hyperparameters + size + depth per norm family"  # what the spectra must beat


def design(frame: pd.DataFrame, features: tuple[str, ...]) -> pd.DataFrame:
    """The named features of each row (NaN where a row lacks one)."""
    out = {}
    for name in features:
        if name.startswith("norm_"):
            out[name] = _is_norm(frame, name.removeprefix("norm_"))
        else:
            out[name] = FEATURES[name](frame)
    return pd.DataFrame(out, index=frame.index)


# What varies *within* an architecture: a group of runs that share everything else is one
# architecture, and a held-out architecture must leave the fit with all its lrs and seeds.
WITHIN_ARCHITECTURE = ("config.training.lr", "config.training.warmup_steps", "config.probe.seed")
FOLDS = 5  # grouped cross-validation folds, each group one architecture


def architecture_groups(frame: pd.DataFrame) -> pd.Series:
    """One id per architecture: every config.* column except lr, warmup and seed."""
    columns = sorted(c for c in frame.columns if c.startswith("config.") and c not in WITHIN_ARCHITECTURE)
    keys = [repr(values) for values in frame[columns].itertuples(index=False, name=None)]
    return pd.Series(pd.factorize(pd.Series(keys))[0], index=frame.index)
