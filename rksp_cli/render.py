"""Terminal, JSON and CSV renderings of a screen result."""

from __future__ import annotations

import io
import json
import math

import pandas as pd
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from rksp_cli.screen import ScreenResult

VERDICT_STYLE = {"low": "bold green", "elevated": "bold yellow", "high": "bold red"}

_COLUMNS = (  # (row key, header)
    ("expansive_mass", "M>1"),
    ("near_unit_mass", "M≈1"),
    ("gap_mass", "gap"),
    ("contractive_mass", "M<1"),
    ("spectral_radius", "ρ"),
    ("kappa", "κ(V)"),
    ("eta_nl", "η_nl"),
)


def fmt(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.3g}" if abs(x) >= 100 else f"{x:.2f}"


def to_json(result: ScreenResult) -> str:
    return json.dumps(result.to_dict(), indent=2)


def to_csv(result: ScreenResult) -> str:
    buf = io.StringIO()
    pd.DataFrame(result.layer_rows()).to_csv(buf, index=False)
    return buf.getvalue()


def render(result: ScreenResult, console: Console) -> None:
    """The per-layer table, the aggregates, and the verdict with its main reason."""
    model = result.model
    n_layers, d_model = int(result.features["n_layers"]), int(result.features["d_model"])
    title = f"{model.get('architecture', '?')}  ·  {n_layers} blocks  ·  d={d_model}"
    table = Table(title=title, title_justify="left", show_footer=True, header_style="bold")
    table.add_column("layer", footer="mean", justify="right")
    for key, header in _COLUMNS:
        table.add_column(header, footer=fmt(result.features.get(f"{key}_mean")), justify="right")
    table.add_column("kept", justify="right")
    for row in result.layer_rows():
        kept = f"{row['n_kept']}/{row['n_eigenvalues']}" + ("*" if row["filter_fallback"] else "")
        if row["degenerate"]:
            kept = "identity"
        cells = [fmt(row[key]) for key, _ in _COLUMNS]
        table.add_row(str(row["layer"]), *cells, kept, style="dim" if row["degenerate"] else None)
    if any(row["filter_fallback"] for row in result.layer_rows()):
        table.caption = "* the ResDMD filter kept nothing; all eigenvalues used"
    console.print(table)

    risk = result.risk
    headline = Text.assemble(
        ("risk ", "bold"),
        (f"{risk.risk:.2f}", VERDICT_STYLE[risk.verdict]),
        ("  ", ""),
        (risk.verdict.upper(), VERDICT_STYLE[risk.verdict]),
        (f"  {risk.reason}", ""),
    )
    lines: list[Text] = [headline, Text(f"risk model: {risk.model}", style="dim")]
    lines += [Text(f"note: {n}", style="dim") for n in risk.notes]
    lines += [Text(f"warning: {w}", style="yellow") for w in result.warnings]
    lr = result.config["training"].get("lr")
    lines.append(
        Text(
            f"estimator: {result.spectra[0].estimator} on {result.config['probe']['tokens']} token states"
            + (f"  ·  training.lr = {lr:g}" if lr else "  ·  training.lr not given"),
            style="dim",
        )
    )
    console.print(Panel(Group(*lines), border_style=VERDICT_STYLE[risk.verdict].split()[-1], expand=False))
