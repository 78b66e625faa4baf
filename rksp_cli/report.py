"""Figures and self-contained HTML reports for screens, sweeps and comparisons.

Figures are matplotlib, drawn headless (Agg); HTML reports embed them as base64 PNGs so a report is
one file that a CI artefact store or a review meeting can open anywhere. Files are written atomically.
"""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import yaml

from rksp_cli.files import atomic_path
from rksp_cli.koopman import EXPANSIVE_ABOVE, NEAR_UNIT_FROM
from rksp_cli.risk import CalibratedRisk, RiskModel, format_risk

if TYPE_CHECKING:
    from rksp_cli.compare import Comparison
    from rksp_cli.screen import ScreenResult

SEED_COLUMN = "config.probe.seed"
MAX_PANELS = 12  # eigenvalue panels per figure: deeper models show evenly spaced layers


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def sweep_axes(frame: pd.DataFrame) -> list[str]:
    """The config columns a sweep varied, seeds aside."""
    return [
        c for c in frame.columns if c.startswith("config.") and c != SEED_COLUMN and frame[c].nunique(dropna=False) > 1
    ]


def heatmap_axes(frame: pd.DataFrame) -> list[str]:
    """The heatmap's default (x, y): the learning rate, when it varies, and the first other axis.

    Averaging the learning rate away would hide the one axis every risk depends on most.
    """
    axes = sweep_axes(frame)
    lr = "config.training.lr"
    return ([lr, *(a for a in axes if a != lr)] if lr in axes else axes)[:2]


def save_png(fig: Any, path: Path) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    _pyplot().close(fig)
    return path


def _png_data(fig: Any) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=110, format="png")
    _pyplot().close(fig)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


# ---- screen figures -------------------------------------------------------------------------


def eigenvalue_figure(layers: list[dict[str, Any]]) -> Any:
    """Each layer's DMD eigenvalues in the complex plane, with the unit circle and the near-unit band.

    ``layers``: dicts with ``layer``, ``eigenvalues`` (complex array) and ``kept`` (bool array).
    """
    plt = _pyplot()
    shown = (
        layers
        if len(layers) <= MAX_PANELS
        else [layers[i] for i in np.linspace(0, len(layers) - 1, MAX_PANELS).round().astype(int)]
    )
    cols = min(4, len(shown))
    rows = math.ceil(len(shown) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, 3.0 * rows), squeeze=False)
    theta = np.linspace(0, 2 * np.pi, 256)
    for ax in axes.flat[len(shown) :]:
        ax.axis("off")
    for ax, layer in zip(axes.flat, shown, strict=False):
        lam, kept = np.asarray(layer["eigenvalues"]), np.asarray(layer["kept"], bool)
        ax.fill_between(np.cos(theta) * EXPANSIVE_ABOVE, np.sin(theta) * EXPANSIVE_ABOVE, color="#fde0c5", lw=0)
        ax.fill_between(np.cos(theta) * NEAR_UNIT_FROM, np.sin(theta) * NEAR_UNIT_FROM, color="white", lw=0)
        ax.plot(np.cos(theta), np.sin(theta), color="black", lw=0.8)
        ax.scatter(lam.real[~kept], lam.imag[~kept], s=6, color="#bbbbbb", label="filtered (ResDMD)")
        ax.scatter(lam.real[kept], lam.imag[kept], s=8, color="#1f5fa8", label="kept")
        radius = max(1.2, float(np.abs(lam).max(initial=0)) * 1.05)
        ax.set_xlim(-radius, radius)
        ax.set_ylim(-radius, radius)
        ax.set_aspect("equal")
        ax.set_title(f"layer {layer['layer']}", fontsize=9)
        ax.tick_params(labelsize=7)
    note = f" ({len(shown)} of {len(layers)} layers)" if len(shown) < len(layers) else ""
    fig.suptitle(
        f"DMD eigenvalues; shaded: near-unit band {NEAR_UNIT_FROM} <= |λ| <= {EXPANSIVE_ABOVE}{note}", fontsize=10
    )
    fig.tight_layout()
    return fig


def depth_figure(layers: list[dict[str, Any]]) -> Any:
    """Spectral masses and spectral radius over depth."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 3.4))
    x = [row["layer"] for row in layers]
    for key, label in (
        ("expansive_mass", "M>1"),
        ("near_unit_mass", "M≈1"),
        ("gap_mass", "gap"),
        ("contractive_mass", "M<1"),
    ):
        ax.plot(x, [row[key] for row in layers], marker="o", ms=3, label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("layer (transition h_l -> h_l+1)")
    ax.set_ylabel("mass")
    ax.set_ylim(-0.02, 1.02)
    twin = ax.twinx()
    twin.plot(x, [row["spectral_radius"] for row in layers], color="black", ls="--", label="ρ")
    twin.axhline(1.0, color="grey", lw=0.6)
    twin.set_ylabel("spectral radius ρ")
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(
        handles, [h.get_label() for h in handles], fontsize=8, ncol=5, loc="upper center", bbox_to_anchor=(0.5, 1.18)
    )
    fig.tight_layout()
    return fig


def risk_lr_figure(lrs: np.ndarray, risk: np.ndarray, lr: float | None, edge: float | None, level: float) -> Any:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.semilogx(lrs, risk, color="#b22222")
    ax.axhline(level, color="grey", lw=0.6, ls=":")
    if edge is not None and math.isfinite(edge):
        ax.axvline(edge, color="#2e7d32", ls="--", label=f"predicted edge {edge:.2g}")
    if lr is not None:
        ax.axvline(lr, color="black", label=f"configured lr {lr:.2g}")
    ax.set_xlabel("learning rate (other settings as configured)")
    ax.set_ylabel("P(diverge)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def spectra_layers(result: ScreenResult) -> list[dict[str, Any]]:
    """The eigenvalue-figure input of a ScreenResult."""
    return [
        {"layer": i, "eigenvalues": s.eigenvalues.numpy(), "kept": s.kept.numpy()} for i, s in enumerate(result.spectra)
    ]


# ---- HTML -----------------------------------------------------------------------------------

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
.verdict{font-size:1.3em;font-weight:600;padding:.5em .8em;border-radius:6px;display:inline-block}
.low{background:#e3f4e3;color:#1b5e20}.elevated{background:#fff4d6;color:#8a5a00}
.high{background:#fde2e2;color:#a01818}.unknown{background:#e3ecfa;color:#1a3d80}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ddd;padding:.25em .6em;text-align:right}
th{background:#f5f5f5}td:first-child,th:first-child{text-align:left}
pre{background:#f7f7f7;padding:1em;overflow-x:auto}img{max-width:100%}.note{color:#666;font-size:.9em}
"""


def _page(title: str, body: str) -> str:
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_STYLE}</style></head><body>{body}</body></html>\n"
    )


def _img(src: str, alt: str) -> str:
    return f'<img src="{src}" alt="{html.escape(alt)}">'


def _table(frame: pd.DataFrame) -> str:
    return frame.to_html(index=False, float_format=lambda v: f"{v:.3g}", na_rep="-", border=0, escape=True)


def write_html(path: Path, page: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(page, encoding="utf-8")
    return path


def feature_table(features: dict[str, float]) -> pd.DataFrame:
    """Layer aggregates as a feature x (mean, max, min, std) table; whole-model features after them."""
    aggregates = ("mean", "max", "min", "std")
    rows: dict[str, dict[str, float]] = {}
    for key, value in features.items():
        base, _, agg = key.rpartition("_")
        if agg in aggregates and base:
            rows.setdefault(base, {})[agg] = value
        else:
            rows[key] = {"value": value}
    table = pd.DataFrame.from_dict(rows, orient="index").reindex(columns=[*aggregates, "value"])
    return table.rename_axis("feature").reset_index()


def screen_html(result: ScreenResult, risk_model: RiskModel) -> str:
    """The screen report: verdict and reason, spectra per layer, masses over depth, risk over lr, config."""
    data = result.to_dict()
    verdict = data["verdict"]
    parts = [
        f"<h1>rksp screen: {html.escape(str(data['model'].get('source', '')))}</h1>",
        f'<p><span class="verdict {verdict}">{verdict.upper()} · P(diverge) {format_risk(data["risk"])}</span></p>',
        f"<p><b>Why:</b> {html.escape(data['reason'])}</p>",
        f'<p class="note">risk model: {html.escape(data["risk_model"]["name"])}</p>',
    ]
    parts += [f'<p class="note">⚠ {html.escape(w)}</p>' for w in data["warnings"] + data["out_of_range"]]
    parts += [f'<p class="note">{html.escape(n)}</p>' for n in data["risk_model"]["notes"]]
    parts.append(
        "<h2>Eigenvalues per layer</h2>" + _img(_png_data(eigenvalue_figure(spectra_layers(result))), "eigenvalues")
    )
    parts.append(
        "<h2>Masses and spectral radius over depth</h2>" + _img(_png_data(depth_figure(data["layers"])), "depth")
    )
    parts.append("<h2>Risk against learning rate</h2>")
    row = result.row()
    if isinstance(risk_model, CalibratedRisk):
        lrs, curve = risk_model.risk_curve(row)
        figure = risk_lr_figure(lrs, curve, row.get("config.training.lr"), data["lr_edge"], risk_model.edge_level)
        parts.append(_img(_png_data(figure), "risk against learning rate"))
    else:
        parts.append(
            '<p class="note">Not available: the rule-based risk model does not depend on the learning rate.</p>'
        )
    parts.append("<h2>Features</h2>" + _table(feature_table(data["features"])))
    parts.append(
        "<h2>Resolved config</h2><pre>" + html.escape(yaml.safe_dump(data["config"], sort_keys=False)) + "</pre>"
    )
    return _page(f"rksp screen: {verdict}", "\n".join(parts))


# ---- sweeps ---------------------------------------------------------------------------------


def heatmap_figure(frame: pd.DataFrame, x: str, y: str) -> Any:
    """Mean predicted risk over two axes (averaged over every other axis and seed); with probe
    labels, the observed divergence rate beside it."""
    plt = _pyplot()
    panels = [("risk", "predicted risk")] + ([("label", "observed divergence rate")] if "label" in frame else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, (column, title) in zip(axes[0], panels, strict=True):
        grid = frame.pivot_table(index=y, columns=x, values=column, aggfunc="mean").sort_index(ascending=False)
        image = ax.imshow(grid.to_numpy(float), vmin=0, vmax=1, cmap="RdYlGn_r", aspect="auto")
        ax.set_xticks(range(grid.shape[1]), [_tick(v) for v in grid.columns], rotation=45, ha="right")
        ax.set_yticks(range(grid.shape[0]), [_tick(v) for v in grid.index])
        ax.set_xlabel(x.removeprefix("config."))
        ax.set_ylabel(y.removeprefix("config."))
        ax.set_title(title)
        fig.colorbar(image, ax=ax, fraction=0.046)
    averaged = [a.removeprefix("config.") for a in sweep_axes(frame) if a not in (x, y)]
    if averaged:
        fig.suptitle(f"averaged over {', '.join(averaged)} and seeds", fontsize=9)
    fig.tight_layout()
    return fig


def reliability_figure(frame: pd.DataFrame, bins: int = 10) -> Any:
    """Predicted risk against observed divergence rate, by bins of predicted risk (point size: runs)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.5, 4.2))
    edges = np.linspace(0, 1, bins + 1)
    which = np.clip(np.digitize(frame["risk"], edges) - 1, 0, bins - 1)
    grouped = (
        frame.assign(bin=which).groupby("bin").agg(pred=("risk", "mean"), obs=("label", "mean"), n=("label", "size"))
    )
    ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls=":")
    ax.scatter(grouped["pred"], grouped["obs"], s=20 + 200 * grouped["n"] / grouped["n"].max(), color="#1f5fa8")
    ax.plot(grouped["pred"], grouped["obs"], color="#1f5fa8", lw=0.8)
    ax.set_xlabel("predicted P(diverge)")
    ax.set_ylabel("observed divergence rate")
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("reliability", fontsize=10)
    fig.tight_layout()
    return fig


def riskiest(frame: pd.DataFrame, top: int = 10) -> pd.DataFrame:
    columns = [*sweep_axes(frame), "risk", "verdict", *(["label"] if "label" in frame else [])]
    table = frame.sort_values("risk", ascending=False).head(top)[columns]
    return table.rename(columns=lambda c: c.removeprefix("config."))


def sweep_html(frame: pd.DataFrame, axes: list[str], source: Path) -> str:
    ok = frame[frame["error"].isna()] if "error" in frame else frame
    parts = [
        f"<h1>rksp sweep: {html.escape(source.name)}</h1>",
        f"<p>{len(frame)} points, {len(frame) - len(ok)} failed.</p>",
    ]
    if len(axes) == 2 and "risk" in ok and all(a in ok for a in axes):
        parts.append("<h2>Risk over " + " and ".join(a.removeprefix("config.") for a in axes) + "</h2>")
        parts.append(_img(_png_data(heatmap_figure(ok, axes[0], axes[1])), "risk heatmap"))
    if "risk" in ok:
        parts.append("<h2>Riskiest points</h2>" + _table(riskiest(ok)))
    if "label" in ok and "risk" in ok and ok["label"].notna().any():
        labelled = ok.dropna(subset=["label", "risk"])
        parts.append(f"<h2>Predicted against observed ({len(labelled)} probed points)</h2>")
        parts.append(_img(_png_data(reliability_figure(labelled)), "reliability diagram"))
    return _page(f"rksp sweep: {source.name}", "\n".join(parts))


def _tick(value: object) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def compare_html(comparison: Comparison, markdown_table: str) -> str:
    """The comparison as a page: the same rows as the Markdown summary, in HTML tables."""

    def frame(changes: list, headers: tuple[str, ...]) -> pd.DataFrame:
        rows = [(ch.item, ch.before, ch.after, ch.delta) for ch in changes]
        return pd.DataFrame(rows, columns=["item", "before", "after", "change"])[list(headers)]

    verdict = comparison.outcome[0]
    cls = verdict.after if verdict.after in ("low", "elevated", "high", "unknown") else "unknown"
    parts = [
        f"<h1>rksp compare: {html.escape(comparison.before.name)} → {html.escape(comparison.after.name)}</h1>",
        f'<p><span class="verdict {cls}">verdict {html.escape(str(verdict.before))} → '
        f"{html.escape(str(verdict.after))}</span></p>",
        "<h2>Outcome and features</h2>" + _table(frame(comparison.outcome, ("item", "before", "after", "change"))),
        "<h2>Config changes</h2>"
        + (_table(frame(comparison.config, ("item", "before", "after"))) if comparison.config else "<p>identical</p>"),
        "<h2>Markdown summary</h2><pre>" + html.escape(markdown_table) + "</pre>",
    ]
    return _page("rksp compare", "\n".join(parts))
