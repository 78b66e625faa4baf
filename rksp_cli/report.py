"""Figures for sweeps (and, later, screens): matplotlib, written headless and atomically."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from rksp_cli.files import atomic_path

SEED_COLUMN = "config.probe.seed"


def sweep_axes(frame: pd.DataFrame) -> list[str]:
    """The config columns a sweep varied, seeds aside."""
    return [
        c for c in frame.columns if c.startswith("config.") and c != SEED_COLUMN and frame[c].nunique(dropna=False) > 1
    ]


def risk_heatmap(frame: pd.DataFrame, x: str, y: str, path: Path) -> Path:
    """Mean predicted risk over two axes (averaged over every other axis and seed); with probe
    labels, the observed divergence rate beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    return path


def _tick(value: object) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
