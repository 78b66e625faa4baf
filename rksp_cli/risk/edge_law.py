"""The stable learning rate as a power law of width and depth, fitted on a ladder of small proxies.

Each proxy (a width, a depth) has its edge bracketed by probes: ``lo``, the largest lr that trained,
below ``hi``, the smallest that diverged. The law is

    log edge = a + b log(width) + c log(depth)

fitted by least squares on the proxies' edges (the geometric midpoint of each bracket, averaged
over seeds in log space), as Wortsman et al. (2023) fitted lr sensitivity by hand. A term whose
axis the ladder does not vary is left out. The interval is the ordinary least-squares prediction
interval (Student t, residual degrees of freedom), with the residual variance floored at the
bracket's own resolution: a ladder whose points happen to lie on a line is still no more precise
than the lr grid that measured them.

Design choices:
* a bracket whose edge lies outside the searched lrs is *censored* and left out of the fit (said so);
* non-monotone outcomes (an lr that trained above one that diverged) keep the first divergence as
  the edge (conservative) and are counted;
* the interval is 90%, like the risk model's bootstrap interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from rksp_cli.errors import InputError
from rksp_cli.risk.scoring import INTERVAL

WIDTH, DEPTH, LR, SEED = "config.model.d_model", "config.model.n_layers", "config.training.lr", "config.probe.seed"


@dataclass(frozen=True)
class Bracket:
    """Where one proxy's edge lies for one seed: between ``lo`` (trained) and ``hi`` (diverged)."""

    lo: float | None  # None: every probed lr diverged
    hi: float | None  # None: no probed lr diverged
    nonmonotone: int = 0  # lrs above ``hi`` that trained anyway

    @property
    def censored(self) -> bool:
        return self.lo is None or self.hi is None

    @property
    def edge(self) -> float:
        if self.censored:
            return math.nan
        return math.sqrt(self.lo * self.hi)

    @property
    def ratio(self) -> float:
        return math.inf if self.censored else self.hi / self.lo


def bracket(lrs: np.ndarray, diverged: np.ndarray) -> Bracket:
    """The bracket of one proxy and seed from its probed lrs and their labels."""
    lrs, diverged = np.asarray(lrs, dtype=float), np.asarray(diverged, dtype=bool)
    hi = float(lrs[diverged].min()) if diverged.any() else None
    below = lrs[~diverged & (lrs < hi)] if hi is not None else lrs[~diverged]
    lo = float(below.max()) if below.size else None
    nonmonotone = int((~diverged & (lrs > hi)).sum()) if hi is not None else 0
    return Bracket(lo, hi, nonmonotone)


def proxy_edges(frame: pd.DataFrame, label: str = "label") -> pd.DataFrame:
    """One row per proxy and seed: width, depth, seed, lo, hi, edge, censored, non-monotone count."""
    rows = []
    for (width, depth, seed), runs in frame.groupby([WIDTH, DEPTH, SEED]):
        b = bracket(runs[LR].to_numpy(), runs[label].to_numpy() > 0)
        rows.append(
            {"width": int(width), "depth": int(depth), "seed": int(seed), "lo": b.lo, "hi": b.hi,
             "edge": b.edge, "censored": b.censored, "nonmonotone": b.nonmonotone, "probes": len(runs)}
        )  # fmt: skip
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class EdgePrediction:
    """The law's edge at one width and depth, with its interval and what it rests on."""

    width: int
    depth: int
    edge: float
    interval: tuple[float, float]
    log_se: float  # standard error of log(edge) for a new point (prediction, not the mean)
    dof: int
    extrapolated: list[str]  # e.g. ["width 768 is 6.0x the widest proxy (128)"]
    notes: list[str] = field(default_factory=list)

    def p_above_edge(self, lr: float) -> float:
        """P(the edge lies below ``lr``) under the prediction's t distribution: the ladder's risk."""
        return float(stats.t.cdf((math.log(lr) - math.log(self.edge)) / self.log_se, self.dof))

    def to_dict(self) -> dict[str, Any]:
        return {
            "width": self.width, "depth": self.depth, "edge": self.edge, "interval": list(self.interval),
            "log_se": self.log_se, "dof": self.dof, "extrapolated": self.extrapolated, "notes": self.notes,
        }  # fmt: skip


class EdgeLaw:
    """``log edge = a + b log width + c log depth``, least squares over proxies (see the module doc)."""

    def fit(self, edges: pd.DataFrame) -> EdgeLaw:
        """``edges``: the rows of ``proxy_edges``. Censored seeds are dropped; proxies are seed means."""
        if edges.empty:
            raise InputError("ladder: no probed proxy to fit; run `rksp ladder` to the end")
        kept = edges[~edges["censored"]].astype({"lo": float, "hi": float, "edge": float})
        self.censored_ = edges[edges["censored"]][["width", "depth", "seed"]].to_dict("records")
        if kept.empty:
            raise InputError("ladder: no proxy has its edge inside the searched lrs; widen --lr-range")
        kept = kept.assign(log_edge=np.log(kept["edge"]), log_ratio=np.log(kept["hi"] / kept["lo"]))
        proxies = (
            kept.groupby(["width", "depth"])
            .agg(log_edge=("log_edge", "mean"), seeds=("seed", "size"), log_ratio=("log_ratio", "mean"))
            .reset_index()
        )
        self.proxies_ = proxies
        self.terms_ = [t for t in ("width", "depth") if proxies[t].nunique() > 1]
        X = self._design(proxies["width"].to_numpy(), proxies["depth"].to_numpy())
        n, p = X.shape
        self.dof_ = n - p
        if self.dof_ < 1:
            raise InputError(
                f"ladder: {n} proxies with an edge for {p} parameters (intercept"
                + "".join(f", {t}" for t in self.terms_)
                + "); the interval needs at least one more proxy: add a width or a depth"
            )
        y = proxies["log_edge"].to_numpy()
        self.coef_, *_ = np.linalg.lstsq(X, y, rcond=None)
        residual = y - X @ self.coef_
        # the lr grid's own resolution: a bracket of log-width r holds the edge uniformly, variance r^2/12
        resolution = float((proxies["log_ratio"] ** 2 / 12 / proxies["seeds"]).mean())
        self.resolution_var_ = resolution
        self.residual_var_ = max(float(residual @ residual) / self.dof_, resolution)
        self.xtx_inv_ = np.linalg.inv(X.T @ X)
        self.widths_ = (int(proxies["width"].min()), int(proxies["width"].max()))
        self.depths_ = (int(proxies["depth"].min()), int(proxies["depth"].max()))
        self.nonmonotone_ = int(edges["nonmonotone"].sum())
        return self

    @property
    def exponents(self) -> dict[str, float]:
        """The power of each varied axis: edge ~ width^b depth^c."""
        return {t: float(self.coef_[1 + i]) for i, t in enumerate(self.terms_)}

    def _design(self, width: np.ndarray, depth: np.ndarray) -> np.ndarray:
        columns = [np.ones(len(width))]
        columns += [np.log(np.asarray(width, float))] if "width" in self.terms_ else []
        columns += [np.log(np.asarray(depth, float))] if "depth" in self.terms_ else []
        return np.column_stack(columns)

    def predict(self, width: int, depth: int) -> EdgePrediction:
        x = self._design(np.array([width]), np.array([depth]))[0]
        mu = float(x @ self.coef_)
        se = math.sqrt(self.residual_var_ * (1.0 + float(x @ self.xtx_inv_ @ x)))
        half = float(stats.t.ppf(0.5 + INTERVAL / 2, self.dof_)) * se
        extrapolated, notes = [], []
        for axis, value, (low, high) in (("width", width, self.widths_), ("depth", depth, self.depths_)):
            if value > high:
                extrapolated.append(f"{axis} {value} is {value / high:.1f}x the largest proxy's ({high})")
            elif value < low:
                extrapolated.append(f"{axis} {value} is below the smallest proxy's ({low})")
            if axis not in self.terms_ and value != low:
                notes.append(f"the ladder did not vary {axis}: its edge at {axis} {value} assumes none of it")
        if self.censored_:
            notes.append(f"{len(self.censored_)} proxy seed(s) had their edge outside the searched lrs, left out")
        if self.nonmonotone_:
            notes.append(f"{self.nonmonotone_} probe(s) trained above an lr that diverged; the lower edge was kept")
        return EdgePrediction(
            width=width, depth=depth, edge=math.exp(mu), interval=(math.exp(mu - half), math.exp(mu + half)),
            log_se=se, dof=self.dof_, extrapolated=extrapolated, notes=notes,
        )  # fmt: skip
