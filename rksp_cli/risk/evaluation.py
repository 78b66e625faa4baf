"""How well a risk model transfers, measured on runs it never saw.

Three held-out validations, each stricter than the last about what "unseen" means:

* **leave-architecture-out**: grouped 5-fold cross-validation, a group being everything but lr,
  warmup and seed, so no architecture's spectra sit on both sides of a fold (the old grouping by
  configuration let one init's spectra straddle folds at another lr: interpolation, not transfer);
* **leave-norm-family-out**: fit on five normalisation families, score the sixth;
* **leave-scale-out** (the headline): fit on every run below the largest width and the largest
  depth, score the runs at the largest width or depth: a model asked to extrapolate in size.

With more token samples of each run's screen (``calibrate --token-samples``), each feature set's
held-out fits also predict the edge from every sample of each run they did not see: how far the
predicted edge moves with nothing but the screen's own token sample (issue 13).

AUROC intervals are group-bootstrap percentiles (architectures resampled, not runs, since runs of
one architecture are not independent).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from rksp_cli.risk.assessment import EDGE_LEVEL
from rksp_cli.risk.estimator import DivergenceModel
from rksp_cli.risk.features import (
    FEATURE_SETS,
    FOLDS,
    SHIPPED,
    WITHOUT_SPECTRA,
    architecture_groups,
    column,
    norm_family,
)

LABELS = {
    "label": "diverged (loss > 50 or grad norm > 500, or non-finite, at any step: the RKSP paper's label)",
    "label_any": "diverged or stalled (tail loss no lower than the first loss)",
}
BOOTSTRAP_CI = 1000


def auroc(y: np.ndarray, score: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    ok = np.isfinite(score)
    y, score = y[ok], score[ok]
    return float(roc_auc_score(y, score)) if len(np.unique(y)) == 2 else math.nan


def group_bootstrap_ci(
    y: np.ndarray, score: np.ndarray, groups: np.ndarray, n: int = BOOTSTRAP_CI, seed: int = 0,
    statistic: Callable[[np.ndarray, np.ndarray], float] = auroc,
) -> tuple[float, float]:  # fmt: skip
    """95% percentile interval of a statistic (default the AUROC) with whole groups resampled."""
    rng = np.random.default_rng(seed)
    members = [np.flatnonzero(groups == g) for g in np.unique(groups)]
    if not members:
        return math.nan, math.nan
    stats = []
    for _ in range(n):
        idx = np.concatenate([members[i] for i in rng.integers(0, len(members), len(members))])
        if len(np.unique(y[idx])) == 2:
            stats.append(statistic(y[idx], score[idx]))
    return (float(np.percentile(stats, 2.5)), float(np.percentile(stats, 97.5))) if stats else (math.nan, math.nan)


def reliability(y: np.ndarray, p: np.ndarray, bins: int = 10) -> list[dict[str, float]]:
    """Equal-width bins of predicted probability: count, mean prediction, observed rate."""
    which = np.minimum((p * bins).astype(int), bins - 1)
    return [
        {"bin": f"{b / bins:.1f}-{(b + 1) / bins:.1f}", "n": int((which == b).sum()),
         "predicted": float(p[which == b].mean()), "observed": float(y[which == b].mean())}
        for b in range(bins) if (which == b).any()
    ]  # fmt: skip


def ece(y: np.ndarray, p: np.ndarray, bins: int = 10) -> float:
    return sum(r["n"] * abs(r["predicted"] - r["observed"]) for r in reliability(y, p, bins)) / len(y)


def calibrated_ece(p: np.ndarray, n: int = BOOTSTRAP_CI, seed: int = 0) -> tuple[float, float]:
    """Median and 95th percentile of the ECE that a perfectly calibrated model would score with these
    predictions (labels drawn from them): binned ECE is biased upward on few rows, and this is its
    floor, so an observed ECE inside it is not evidence of miscalibration."""
    rng = np.random.default_rng(seed)
    draws = [ece((rng.random(len(p)) < p).astype(float), p) for _ in range(n)]
    return float(np.median(draws)), float(np.percentile(draws, 95))


def metrics(y: np.ndarray, score: np.ndarray, groups: np.ndarray, family: np.ndarray, probability: bool,
            n_boot: int = BOOTSTRAP_CI) -> dict[str, Any]:  # fmt: skip
    ok = np.isfinite(score)
    y, score, groups, family = y[ok], score[ok], groups[ok], family[ok]
    none = family == "none"
    out = {
        "n": len(y), "auroc": auroc(y, score), "auroc_ci95": list(group_bootstrap_ci(y, score, groups, n_boot)),
        "auroc_no_norm": auroc(y[none], score[none]),
    }  # fmt: skip
    if probability:
        out.update(brier=float(np.mean((score - y) ** 2)), ece=ece(y, score))
        out["ece_ci95"] = list(group_bootstrap_ci(y, score, groups, n_boot, statistic=ece))
        out["ece_if_calibrated"] = list(calibrated_ece(score, n_boot))
    return out


Make = Callable[[], DivergenceModel]


Fits = list[tuple[DivergenceModel, np.ndarray]]  # (a model, the rows it never saw)
EDGE_SPREAD_BAR = 1.25  # issue 13: the edge of one model may move at most this much between token samples


def held_out_fits(frame: pd.DataFrame, y: np.ndarray, splits: list[tuple[np.ndarray, np.ndarray]], make: Make) -> Fits:
    """One model per split, fitted on its training rows alone."""
    return [(make().fit(frame.iloc[train], y[train]), test) for train, test in splits]


def held_out(frame: pd.DataFrame, y: np.ndarray, splits: list[tuple[np.ndarray, np.ndarray]], make: Make) -> np.ndarray:
    """P(diverged) for every test row, each from a model fitted on its split's training rows alone."""
    return _probabilities(frame, held_out_fits(frame, y, splits, make))


def _probabilities(frame: pd.DataFrame, fits: Fits) -> np.ndarray:
    p = np.full(len(frame), np.nan)
    for model, test in fits:
        p[test] = model.predict_proba(frame.iloc[test])[:, 1]
    return p


def edge_spread(frame: pd.DataFrame, fits: Fits, samples: pd.DataFrame, level: float = EDGE_LEVEL) -> dict[str, Any]:
    """How far each held-out run's predicted edge moves over its token samples (max / min).

    ``samples``: the runs' other token samples (``read_token_samples``); runs without any are
    left out. Runs whose edge is not finite in some sample (no lr reaches the level) are counted apart.
    """
    ratios = []
    for model, test in fits:
        rows = frame.iloc[test]
        rows = rows[rows["key"].isin(samples["key"])]
        mine = samples[samples["key"].isin(rows["key"])]
        edges = pd.DataFrame({"key": [*rows["key"], *mine["key"]],
                              "edge": [*model.edge(rows, level), *model.edge(mine, level)]})  # fmt: skip
        per_run = edges.groupby("key")["edge"].agg(["min", "max"])
        ratios.extend((per_run["max"] / per_run["min"]).to_numpy(float))
    r = np.asarray(ratios)
    finite = r[np.isfinite(r) & (r > 0)]
    if not finite.size:
        return {"runs": len(r), "unresolved": len(r)}
    return {
        "runs": len(r), "unresolved": int(len(r) - finite.size), "median": float(np.median(finite)),
        "p90": float(np.percentile(finite, 90)), "within_bar": float(np.mean(finite <= EDGE_SPREAD_BAR)),
    }  # fmt: skip


def architecture_splits(groups: np.ndarray, folds: int = FOLDS) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.model_selection import GroupKFold

    return list(GroupKFold(n_splits=min(folds, len(np.unique(groups)))).split(groups, groups=groups))


def scale_split(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, str]:
    """Train below the largest width and depth; test at the largest width or depth."""
    width, depth = column(frame, "feature.d_model").to_numpy(), column(frame, "feature.n_layers").to_numpy()
    w, d = np.nanmax(width), np.nanmax(depth)
    big = (width >= w) | (depth >= d)
    what = f"fit on width < {w:g} and depth < {d:g}; scored at width {w:g} or depth {d:g}"
    return np.flatnonzero(~big), np.flatnonzero(big), what


BASELINE_SCORES = {  # score column, is it a probability?
    "raw near-unit mass (paper's score)": ("feature.near_unit_mass_mean", True),
    "spectral radius (mean)": ("feature.spectral_radius_mean", False),
    "initial gradient norm": ("baseline.init_grad_norm", False),
    "output change per unit lr (Admin)": ("baseline.update_sensitivity", False),
    "gradient norm at step 100": ("baseline.grad_norm_at_k", False),
    "gradient variance, steps 1-100": ("baseline.grad_norm_var_k", False),
    "loss-spike count": ("baseline.loss_spikes", False),
}


def evaluate(frame: pd.DataFrame, label: str = "label", method: str = "sigmoid", C: float = 1.0,
             n_boot: int = BOOTSTRAP_CI, token_samples: pd.DataFrame | None = None) -> dict[str, Any]:  # fmt: skip
    """The held-out report: the three validations of the shipped model, every feature set, the baselines;
    with ``token_samples`` (``read_token_samples``), each feature set's held-out ``edge_spread``."""
    y = frame[label].to_numpy(int)
    groups = architecture_groups(frame).to_numpy()
    family = norm_family(frame).fillna("").astype(str).to_numpy()

    def make(features: tuple[str, ...] = FEATURE_SETS[SHIPPED]) -> Make:
        return lambda: DivergenceModel(features=features, method=method, C=C, n_bootstrap=0)

    validations: dict[str, Any] = {}
    train, test, what = scale_split(frame)
    if len(np.unique(y[train])) == 2 and len(np.unique(y[test])) == 2:
        p = held_out(frame, y, [(train, test)], make())
        validations["leave-scale-out"] = metrics(y[test], p[test], groups[test], family[test], True, n_boot) | {
            "split": what,
            "n_train": len(train),
            "reliability": reliability(y[test], p[test]),
        }
    arch = architecture_splits(groups)
    fits_arch = held_out_fits(frame, y, arch, make())
    p_arch = _probabilities(frame, fits_arch)
    validations["leave-architecture-out"] = metrics(y, p_arch, groups, family, True, n_boot) | {
        "reliability": reliability(y, p_arch),
        "auroc_by_family": {f: auroc(y[family == f], p_arch[family == f]) for f in sorted(set(family))},
    }
    families = sorted(set(family))
    if len(families) > 1:
        splits = [(np.flatnonzero(family != f), np.flatnonzero(family == f)) for f in families]
        splits = [(tr, te) for tr, te in splits if len(np.unique(y[tr])) == 2]
        if splits:
            p = held_out(frame, y, splits, make())
            validations["leave-norm-family-out"] = metrics(y, p, groups, family, True, n_boot) | {
                "auroc_by_family": {f: auroc(y[family == f], p[family == f]) for f in families}
            }

    models = {}
    for name, features in FEATURE_SETS.items():
        fits = fits_arch if name == SHIPPED else held_out_fits(frame, y, arch, make(features))
        models[name] = metrics(y, _probabilities(frame, fits), groups, family, True, n_boot)
        if token_samples is not None:
            models[name]["edge_spread"] = edge_spread(frame, fits, token_samples)
    baselines = {}
    for name, (col, is_probability) in BASELINE_SCORES.items():
        score = np.nan_to_num(column(frame, col).to_numpy(float), nan=np.nan, posinf=1e300)
        baselines[name] = metrics(y, score, groups, family, is_probability, n_boot)
    report = {
        "n_runs": len(frame),
        "n_architectures": len(np.unique(groups)),
        "n_positive": int(y.sum()),
        "n_no_norm": int((family == "none").sum()),
        "label": label,
        "label_description": describe_label(frame, label),
        "method": method,
        "token_samples": None if token_samples is None else 1 + len(token_samples) // token_samples["key"].nunique(),
        "validations": validations,
        "models": models,
        "baselines": baselines,
    }
    report["verdict"] = spectra_verdict(models)
    return report


def describe_label(frame: pd.DataFrame, label: str) -> str:
    steps = sorted(set(frame.get("config.training.steps", pd.Series(dtype=int)).dropna().astype(int)))
    tasks = sorted(set(frame.get("config.training.task", pd.Series(dtype=str)).dropna()))
    return f"{LABELS.get(label, label)}, within {', '.join(map(str, steps))} steps of {', '.join(tasks)}"


def spectra_verdict(models: dict[str, dict[str, Any]]) -> str:
    """Say plainly whether the spectra earn their place over the shipped model without them."""
    with_spectra, without = models[SHIPPED], models[WITHOUT_SPECTRA]
    gain = with_spectra["auroc"] - without["auroc"]
    brier_gain = without["brier"] - with_spectra["brier"]
    if gain > 0.005 or brier_gain > 0.002:
        return (
            f"spectra help: AUROC {without['auroc']:.3f} -> {with_spectra['auroc']:.3f}, "
            f"Brier {without['brier']:.4f} -> {with_spectra['brier']:.4f} over {WITHOUT_SPECTRA} alone"
        )
    return (
        f"spectra add nothing measurable over {WITHOUT_SPECTRA} on these runs (AUROC "
        f"{without['auroc']:.3f} vs {with_spectra['auroc']:.3f}, Brier {without['brier']:.4f} vs "
        f"{with_spectra['brier']:.4f})"
    )
