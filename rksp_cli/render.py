"""Terminal (rich), JSON, CSV and Markdown renderings: screens, probes, sweeps, calibration, fault
injection, the watch dashboard and comparisons."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from rksp_cli.probe import BASELINE_STEP, ProbeResult
from rksp_cli.report import sweep_axes
from rksp_cli.risk import RiskAssessment, format_risk
from rksp_cli.risk.features import SHIPPED
from rksp_cli.screen import ScreenResult
from rksp_cli.serialize import dumps
from rksp_cli.watch import HEADLINES, MetricsLog

if TYPE_CHECKING:  # types only: a screen's output should not import the fitter, the ladder or the faults
    from rksp_cli.compare import Change, Comparison
    from rksp_cli.ladder import LadderFit, Search, Target
    from rksp_cli.monitors.faults import FaultRun

VERDICT_STYLE = {"low": "bold green", "elevated": "bold yellow", "high": "bold red", "unknown": "bold blue"}

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
    return f"{x:.3g}" if abs(x) >= 100 or 0 < abs(x) < 0.01 else f"{x:.2f}"


def to_json(result: ScreenResult) -> str:
    return dumps(result.to_dict())


def to_csv(result: ScreenResult) -> str:
    buf = io.StringIO()
    pd.DataFrame(result.layer_rows()).to_csv(buf, index=False)
    return buf.getvalue()


def render(result: ScreenResult, console: Console) -> None:
    """The per-layer table, the aggregates, and the verdict with its main reason."""
    model = result.model
    n_layers, d_model = int(result.features["n_layers"]), int(result.features["d_model"])
    title = f"{model.get('architecture', '?')}  ·  {n_layers} blocks  ·  d={d_model}"
    if "norm" in model and model.get("source") != "built-in gpt":  # the built-in GPT's is in its name
        title += f"  ·  norm {model['norm'] or 'not recognised'}"
    table = Table(title=title, title_justify="left", show_footer=True, header_style="bold")
    table.add_column("layer", footer="mean", justify="right")
    rows = result.layer_rows()
    # kappa(V) is computed only with probe.kappa: no column of dashes otherwise
    columns = [(key, header) for key, header in _COLUMNS if key != "kappa" or any(not math.isnan(r[key]) for r in rows)]
    for key, header in columns:
        table.add_column(header, footer=fmt(result.features.get(f"{key}_mean")), justify="right")
    table.add_column("kept", justify="right")
    for row in rows:
        kept = f"{row['n_kept']}/{row['n_eigenvalues']}" + ("*" if row["filter_fallback"] else "")
        if row["degenerate"]:
            kept = "identity"
        cells = [fmt(row[key]) for key, _ in columns]
        table.add_row(str(row["layer"]), *cells, kept, style="dim" if row["degenerate"] else None)
    if any(row["filter_fallback"] for row in rows):
        table.caption = "* the ResDMD filter kept nothing; all eigenvalues used"
    console.print(table)

    risk = result.risk
    headline = Text.assemble(
        ("risk ", "bold"),
        (format_risk(risk.risk), VERDICT_STYLE[risk.verdict]),
        ("  ", ""),
        (risk.verdict.upper(), VERDICT_STYLE[risk.verdict]),
        (f"  {risk.reason}", ""),
    )
    lines: list[Text] = [headline]
    if line := interval_line(risk):
        lines.append(Text(line, style="yellow" if risk.extrapolated else "dim"))
    lines.append(Text(f"risk model: {risk.model}", style="dim"))
    lines += [Text(f"note: {n}", style="dim") for n in risk.notes]
    if risk.out_of_range:
        lines.append(Text(f"outside the calibrated range: {'; '.join(risk.out_of_range)}", style="yellow"))
    if result.spread is not None:
        lines.append(Text(spread_line(result.spread), style="dim"))
    if result.ladder is not None:
        lines += ladder_lines(result.ladder, result.config["training"].get("lr"))
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


def interval_line(risk: RiskAssessment) -> str | None:
    """'90% interval over 50 refits: risk 0.02 to 0.09, edge 0.004 to 0.011' (extrapolated said first)."""
    parts = []
    if risk.interval is not None:
        parts.append(f"risk {format_risk(risk.interval[0])} to {format_risk(risk.interval[1])}")
    if risk.edge_interval is not None:
        parts.append(f"edge {risk.edge_interval[0]:.2g} to {risk.edge_interval[1]:.2g}")
    if not parts:
        return None
    head = "extrapolated, not calibrated; " if risk.extrapolated else ""
    return f"{head}90% interval over bootstrap refits: " + ", ".join(parts)


def spread_line(spread: dict) -> str:
    """'spread over 3 token samples: risk 0.03 to 0.05, edge 0.041 to 0.07, M≈1 0.12 to 0.14, ...'"""

    def span(values: list[float] | None, show=lambda v: f"{v:.2f}") -> str:
        return "not finite in every sample" if values is None else " to ".join(show(v) for v in values)

    parts = [f"risk {span(spread['risk'], format_risk)}", f"edge {span(spread['lr_edge'], lambda v: f'{v:.2g}')}"]
    labels = {"near_unit_mass_mean": "M≈1", "expansive_mass_mean": "M>1", "eta_nl_mean": "η_nl"}
    parts += [f"{label} {span(spread['features'][name])}" for name, label in labels.items()]
    return f"spread over {spread['samples']} token samples: " + ", ".join(parts)


def render_profile(result: ScreenResult, console: Console) -> None:
    """Where the time went: build, forward and DMD in all, and per layer."""
    t = result.timings
    layers = t.get("layers", [])
    streamed = any("materialize" in row for row in layers)
    table = Table(title=f"profile: build {t['build']:.2f} s, forward {t['forward']:.2f} s, DMD {t['dmd']:.2f} s")
    table.add_column("layer", justify="right")
    if streamed:
        table.add_column("init/load s", justify="right")
    table.add_column("forward s", justify="right")
    table.add_column("DMD s", justify="right")
    for i, row in enumerate(layers):
        cells = [f"{row['materialize']:.3f}"] if streamed else []
        table.add_row(str(i), *cells, f"{row['forward']:.3f}", f"{row['dmd']:.3f}")
    console.print(table)


def render_probe(result: ProbeResult, console: Console) -> None:
    """The label, its reason, the trajectory's ends and the baselines beside the init screen."""
    style = "bold red" if result.diverged else "bold green"
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="dim")
    table.add_column(overflow="fold")
    table.add_row("outcome", Text("DIVERGED" if result.diverged else "stable", style=style) + f"  {result.reason}")
    losses = result.losses
    table.add_row("loss", f"{fmt(losses[0])} -> {fmt(losses[-1])} over {len(losses)} steps")
    table.add_row("gradient norm", f"{fmt(result.grad_norms[0])} -> {fmt(result.grad_norms[-1])} (pre-clip)")
    k = min(BASELINE_STEP, len(result.grad_norms))
    labels = {
        "init_grad_norm": "initial gradient norm",
        "grad_norm_at_k": f"gradient norm at step {k}",
        "grad_norm_var_k": f"gradient variance, steps 1-{k}",
        "loss_spikes": "loss spikes (> 1.5x the 20-step median)",
        "update_sensitivity": "output change per unit lr (Admin)",
    }
    for name, value in result.baselines.items():
        table.add_row(labels.get(name, name), str(int(value)) if name == "loss_spikes" else fmt(value))
    if result.screen is not None:
        r = result.screen.risk
        screen = f"risk {r.risk:.2f} ({r.verdict}); near-unit mass {result.screen.features['near_unit_mass_mean']:.2f}"
    else:
        screen = f"not assessable: {result.screen_error}"
    table.add_row("init screen", screen)
    if result.spec.training.guard is not None:
        table.add_row("guard", _guard_summary(result))
    table.add_row("time", f"{result.seconds:.1f} s")
    console.print(
        Panel(table, title=f"probe · {result.spec.training.task}", border_style=style.split()[-1], expand=False)
    )


def _guard_summary(result: ProbeResult) -> str:
    acts = result.actions
    if not acts:
        return f"{result.spec.training.guard}: no alarm, nothing done"
    steps = ", ".join(str(a["step"]) for a in acts[:5]) + (" ..." if len(acts) > 5 else "")
    by = sorted({m for a in acts for m in a["by"]})
    return f"{len(acts)} actions at steps {steps} (by {', '.join(by)}); lr x{acts[-1]['lr_scale']:g} at the end"


def render_sweep(frame: pd.DataFrame, path: Path, console: Console, top: int = 10) -> None:
    """Counts and failures, the riskiest points, and the predicted stability edge per architecture."""
    failed = frame["error"].notna().sum() if "error" in frame else 0
    console.print(f"{len(frame)} points in {path} ({failed} failed)", markup=False)
    ok = frame[frame["error"].isna()] if "error" in frame else frame
    if "label" in ok:
        console.print(f"diverged: {int(ok['label'].sum())} of {len(ok)} probes ({ok['label'].mean():.0%})")
    if "risk" not in ok or ok.empty:
        return
    axes = sweep_axes(ok)
    columns = ["risk", *axes, *(["label"] if "label" in ok else [])]
    table = Table(title=f"riskiest {min(top, len(ok))} points", title_justify="left")
    for col in columns:
        table.add_column(col.removeprefix("config."), justify="right", overflow="fold")
    for _, row in ok.nlargest(top, "risk").iterrows():
        table.add_row(*(Text(_cell(row[c])) for c in columns))
    console.print(table)

    arch = [c for c in axes if c.startswith("config.model.")]
    if "lr_edge" in ok and ok["lr_edge"].notna().any():
        edges = ok.groupby(arch, dropna=False)["lr_edge"].median().reset_index() if arch else ok[["lr_edge"]].median()
        table = Table(title="predicted stability edge (median lr over seeds)", title_justify="left")
        for col in [*arch, "lr_edge"]:
            table.add_column(col.removeprefix("config."), justify="right", overflow="fold")
        for _, row in edges.iterrows() if arch else [(0, edges)]:
            table.add_row(*(_cell(row[c]) for c in [*arch, "lr_edge"]))
        console.print(table)


def _cell(value: object) -> str:
    return fmt(value) if isinstance(value, float) else str(value)


def _metric_cells(m: dict) -> list[str]:
    """AUROC, its CI, AUROC within no-norm, Brier, ECE: the columns of every calibration table."""

    def f3(x: float | None) -> str:
        return "-" if x is None or math.isnan(x) else f"{x:.3f}"

    lo, hi = m["auroc_ci95"]
    calibration_error = f3(m.get("ece"))
    if m.get("ece_ci95") is not None and not math.isnan(m["ece_ci95"][0]):  # reports before it lack it
        calibration_error += " ({:.2f}-{:.2f})".format(*m["ece_ci95"])
    return [f3(m["auroc"]), f"{f3(lo)}-{f3(hi)}", f3(m["auroc_no_norm"]), f3(m.get("brier")), calibration_error]


VALIDATIONS = {  # report key: what the held-out rows are
    "leave-scale-out": "larger widths and depths than any fitted run",
    "leave-architecture-out": "architectures the fit never saw (5 grouped folds)",
    "leave-norm-family-out": "a normalisation family the fit never saw",
}


def render_calibration(report: dict, console: Console) -> None:
    """How the fitted model transfers, every feature set, the baselines, and the plain-words verdict."""
    from rksp_cli.risk.evaluation import EDGE_SPREAD_BAR  # the fitter's module: only `rksp calibrate` pays for it

    console.print(
        f"{report['n_runs']} runs, {report['n_architectures']} architectures, {report['n_positive']} positive "
        f"({report['label']})",
        markup=False,
    )
    table = Table(title="shipped model, held out", title_justify="left")
    for col in ("validation", "n", "AUROC", "95% CI", "ECE"):
        table.add_column(col, justify="left" if col == "validation" else "right", overflow="fold")
    for name, m in report["validations"].items():
        auc, ci, _, _, calibration_error = _metric_cells(m)
        table.add_row(name, str(m["n"]), auc, ci, calibration_error)
    console.print(table)
    table = Table(title="feature sets (leave-architecture-out) and baselines", title_justify="left")
    for col in ("model / score", "AUROC", "95% CI", "no-norm", "Brier", "ECE"):
        table.add_column(col, justify="left" if col == "model / score" else "right", overflow="fold")
    for name, m in {**report["models"], **report["baselines"]}.items():
        table.add_row(name, *_metric_cells(m))
    console.print(table)
    if (e := report["models"].get(SHIPPED, {}).get("edge_spread")) and "median" in e:
        console.print(
            f"held-out edge over {report['token_samples']} token samples of each run: moves {e['median']:.2f}x "
            f"(median), {e['p90']:.2f}x (90th percentile); {e['within_bar']:.0%} within {EDGE_SPREAD_BAR}x",
            markup=False,
        )
    console.print(report["verdict"], style="bold", markup=False)


def calibration_markdown(report: dict, sources: list[Path]) -> str:
    """The held-out report as Markdown, saved next to the calibration file."""
    from rksp_cli.risk.evaluation import BOOTSTRAP_CI, EDGE_SPREAD_BAR

    runs = ", ".join(f"`{s}`" for s in sources)
    lines = [
        "# Calibration report",
        "",
        f"Runs: {runs}: {report['n_runs']} runs of {report['n_architectures']} architectures, "
        f"{report['n_positive']} positive, {report['n_no_norm']} without normalisation.",
        f"Label: {report['label_description']}. Calibration: {report['method']} on grouped out-of-fold scores. "
        "Every figure is held out; AUROC 95% CIs are group-bootstrap percentiles (architectures resampled).",
        "",
        "## Transfer (the shipped feature set)",
        "",
        "| validation | held-out rows | n | AUROC | 95% CI | AUROC within no-norm | Brier | ECE (10 bins, 95% CI) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, m in report["validations"].items():
        what = m.get("split", VALIDATIONS.get(name, ""))
        lines.append(f"| {name} | {what} | {m['n']} | " + " | ".join(_metric_cells(m)) + " |")
    floors = [
        f"{name} {m['ece_if_calibrated'][0]:.3f} (95th percentile {m['ece_if_calibrated'][1]:.3f})"
        for name, m in report["validations"].items()
        if m.get("ece_if_calibrated")
    ]
    if floors:
        lines += ["", "ECE that a perfectly calibrated model would score with the same predictions (labels drawn "
                  f"from them; median over {BOOTSTRAP_CI} draws): " + "; ".join(floors) + "."]  # fmt: skip
    for name in ("leave-architecture-out", "leave-norm-family-out"):
        if by_family := report["validations"].get(name, {}).get("auroc_by_family"):
            cells = ", ".join(f"{f or '?'} {fmt(a)}" for f, a in by_family.items())
            lines += ["", f"{name}, AUROC within each normalisation family: {cells}."]
    lines += [
        "",
        f"**{report['verdict']}.**",
        "",
        "## Feature sets (leave-architecture-out) and baselines",
        "",
        "| model / score | AUROC | 95% CI | AUROC within no-norm | Brier | ECE (10 bins, 95% CI) |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in {**report["models"], **report["baselines"]}.items():
        lines.append(f"| {name} | " + " | ".join(_metric_cells(m)) + " |")
    if report.get("token_samples"):
        lines += [
            "",
            f"## The edge over token samples (each run screened on {report['token_samples']} token samples)",
            "",
            "How far each run's predicted edge moves between token samples of its screen (max / min), from the "
            f"leave-architecture-out fits, which never saw the run (issue 13's bar: {EDGE_SPREAD_BAR}x).",
            "",
            f"| model | runs | median | 90th percentile | within {EDGE_SPREAD_BAR}x |",
            "|---|---|---|---|---|",
        ]
        for name, m in report["models"].items():
            if (e := m.get("edge_spread")) and "median" in e:
                lines.append(f"| {name} | {e['runs']} | {e['median']:.2f}x | {e['p90']:.2f}x | {e['within_bar']:.0%} |")
    lines += [
        "",
        "The gradient-norm-at-step-100 baseline is near-perfect by construction: a run that diverges before step "
        "100 does so by crossing the label's own gradient threshold, which that baseline then reads. It is a "
        "step-100 signal, not a pre-launch one. The fitted models and the spectral scores exist before training; "
        "the initial gradient norm and the output change per unit lr after one backward pass; the variance and "
        "spike count after 100 steps.",
    ]
    for name in ("leave-scale-out", "leave-architecture-out"):
        if rel := report["validations"].get(name, {}).get("reliability"):
            lines += ["", f"Reliability, {name}:", "", "| predicted | n | mean predicted | observed |"]
            lines.append("|---|---|---|---|")
            lines += [f"| {r['bin']} | {r['n']} | {r['predicted']:.3f} | {r['observed']:.3f} |" for r in rel]
    return "\n".join(lines) + "\n"


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 30) -> str:
    values = [v for v in values[-width:] if math.isfinite(v)]
    if not values:
        return ""
    lo, hi = min(values), max(values)
    return "".join(SPARKS[int((v - lo) / (hi - lo) * (len(SPARKS) - 1)) if hi > lo else 0] for v in values)


def watch_dashboard(log: MetricsLog, recent: int = 8) -> Group:
    """The monitors of a running job: each signal's latest value, its extreme so far and its trend."""
    last = log.checks[-1] if log.checks else {}
    title = (
        f"{log.path}  ·  monitors: {', '.join(log.monitors) or '-'}  ·  every {log.every or '-'} steps  ·  "
        f"{len(log.checks)} checks, last step {last.get('step', '-')}"
    )
    signals = Table(title="signals", title_justify="left", expand=True)
    for header in ("signal", "latest", "extreme so far", "trend"):
        signals.add_column(
            header, justify="right" if header in ("latest", "extreme so far") else "left", overflow="fold"
        )
    for label, family, combine in HEADLINES:
        points = log.series(family, combine)
        if points:
            values = [v for _, v in points]
            signals.add_row(label, fmt(values[-1]), fmt(combine(values)), sparkline(values))
    tables = []
    for level, style, shown in (("alarm", "red", recent), ("warning", "yellow", recent // 2)):
        found = [a for a in log.alerts() if a.get("level") == level]
        table = Table(title=f"{level}s: {len(found)} in all, latest {shown}", title_justify="left", expand=True)
        for header in ("step", "monitor", "layer", "reason"):
            table.add_column(header, style=style if header == "monitor" else None, overflow="fold")
        for a in found[-shown:]:
            table.add_row(str(a["step"]), a["monitor"], Text(a.get("layer") or "-"), Text(a["reason"]))
        tables.append(table)
    parts = [Panel(Text(title), title="rksp watch", title_align="left"), signals, *tables]
    if log.unreadable:
        parts.append(Text(f"{log.unreadable} unreadable lines skipped", style="yellow"))
    return Group(*parts)


def fault_rows(runs: list[FaultRun]) -> list[dict]:
    """Every run's per-monitor rows, faulted runs timed against the clean run (the first of ``runs``)."""
    clean = next((r for r in runs if r.fault is None), None)
    return [row for run in runs for row in run.summary(clean)]


def render_faults(runs: list[FaultRun], console: Console) -> None:
    """One small table per run (a fault, or the clean run), its outcome in the title: 80 columns."""

    def cell(value: object) -> str:
        return "-" if value is None else str(value)

    rows = fault_rows(runs)
    for fault in dict.fromkeys(row["fault"] for row in rows):
        mine = [row for row in rows if row["fault"] == fault]
        first = mine[0]
        outcome = [
            "did not diverge" if first["diverged_step"] is None else f"diverged at step {first['diverged_step']}"
        ]
        if fault != "clean":
            departs = first["loss_departs"]
            outcome.append("loss never departs" if departs is None else f"loss departs at step {departs}")
        table = Table(title=f"{fault}: {', '.join(outcome)}", title_justify="left", box=box.SIMPLE_HEAD)
        table.add_column("monitor", no_wrap=True, min_width=max(len(row["monitor"]) for row in mine))
        for header in ("first\nalarm", "lead over\ndivergence", "lead over\nloss", "false\nalarms", "overhead"):
            table.add_column(header, justify="right")
        for row in mine:
            table.add_row(
                row["monitor"], cell(row["first_alarm"]), cell(row["lead_steps"]), cell(row["lead_over_loss"]),
                str(row["false_alarms"]), f"{row['overhead_pct']:.2f}%",
            )  # fmt: skip
        console.print(table)
    job = runs[0].job
    console.print(
        f"{job.steps} steps, fault at step {job.inject_at}, checks every {job.every} steps. 'loss departs': the "
        "first step the faulted loss runs 5% above the clean run's (20-step means, same batches). Leads are in "
        "steps (negative: after). Alarms before the fault, or on the clean run, are false alarms. Overhead: mean "
        "check time over 50 median training steps (Monitor's default interval)."
    )


def _value(v: object) -> str:
    if isinstance(v, float):
        return fmt(v) if not math.isfinite(v) else f"{v:.3g}"
    return "-" if v is None else str(v)


def _delta(change: Change) -> str:
    d = change.delta
    return "" if d is None or d == 0 else f"{d:+.3g}"


def render_comparison(c: Comparison, console: Console) -> None:
    table = Table(title=f"{c.before.name} → {c.after.name}", title_justify="left")
    for header in ("", "before", "after", "change"):
        table.add_column(header, justify="left" if not header else "right", overflow="fold")
    for change in c.outcome:
        style = "bold" if change.item == "verdict" and c.verdict_changed else None
        table.add_row(change.item, _value(change.before), _value(change.after), _delta(change), style=style)
    console.print(table)
    if c.config:
        config = Table(title="config changes", title_justify="left")
        for header in ("field", "before", "after"):
            config.add_column(header, overflow="fold")
        for change in c.config:
            config.add_row(Text(change.item), Text(_value(change.before)), Text(_value(change.after)))
        console.print(config)
    else:
        console.print("config: identical")


def comparison_markdown(c: Comparison) -> str:
    """A summary for a CI comment: the verdict line first, then the numbers and the config diff."""
    verdict = c.outcome[0]
    risk = c.outcome[1]
    head = (
        f"**rksp: verdict {verdict.before} → {verdict.after}**"
        if c.verdict_changed
        else f"**rksp: verdict unchanged ({verdict.after})**"
    )
    lines = [
        head + f", risk {_value(risk.before)} → {_value(risk.after)}",
        "",
        "| | before | after | change |",
        "|---|---|---|---|",
    ]
    lines += [f"| {ch.item} | {_value(ch.before)} | {_value(ch.after)} | {_delta(ch)} |" for ch in c.outcome]
    if c.config:
        lines += ["", "| config field | before | after |", "|---|---|---|"]
        lines += [f"| `{ch.item}` | {_value(ch.before)} | {_value(ch.after)} |" for ch in c.config]
    else:
        lines += ["", "Config: identical."]
    return "\n".join(lines) + "\n"


def ladder_plan(target: Target, widths: list[int], depths: list[int], seeds: list[int], search: Search) -> str:
    """What a ladder will probe, before it starts: the cost is the first round plus a few per proxy."""
    n = len(widths) * len(depths) * len(seeds)
    lo, hi = search.lr_range
    lines = [
        f"ladder for width {target.width}, depth {target.depth}: {n} proxies",
        f"  widths {', '.join(map(str, widths))}; depths {', '.join(map(str, depths))}; "
        f"seeds {', '.join(map(str, seeds))}",
        f"  round 1: {search.lr_points} lrs from {lo:g} to {hi:g} each ({n * search.lr_points} probes)",
        f"  then 2 per proxy and round, to a {search.resolution:g}x bracket",
    ]
    return "\n".join(lines + [f"note: {note}" for note in target.notes])


def render_ladder(fit: LadderFit, lr: float | None, console: Console) -> None:
    """Each proxy's bracketed edge, the fitted power law, and the target's predicted edge."""
    table = Table(title="edges: largest lr that trained, smallest that diverged", title_justify="left")
    for column in ("width", "depth", "seed", "trained", "diverged", "edge", "probes"):
        table.add_column(column, justify="right")
    for row in fit.edges.itertuples():
        table.add_row(
            str(row.width), str(row.depth), str(row.seed), fmt(row.lo), fmt(row.hi),
            "outside the range" if row.censored else fmt(row.edge), str(row.probes),
        )  # fmt: skip
    console.print(table)
    law = " · ".join(f"{axis}^{power:+.2f}" for axis, power in fit.law.exponents.items()) or "constant"
    console.print(f"law: edge ∝ {law} ({len(fit.law.proxies_)} proxies, {fit.law.dof_} residual dof)", markup=False)
    console.print(_ladder_prediction(fit, lr), markup=False)


def ladder_lines(fit: LadderFit, lr: float | None) -> list[Text]:
    """The ladder's prediction for a screen's panel: the edge, its interval, extrapolation and lr."""
    styles = {"extrapolated": "yellow", "note": "dim"}
    return [Text(line, style=styles.get(line.split(":")[0], "")) for line in _ladder_prediction(fit, lr).split("\n")]


def _ladder_prediction(fit: LadderFit, lr: float | None) -> str:
    p = fit.prediction
    lo, hi = p.interval
    lines = [f"ladder edge at width {p.width}, depth {p.depth}: {p.edge:.2g} (90% interval {lo:.2g} to {hi:.2g})"]
    if p.extrapolated:
        lines.append("extrapolated: " + "; ".join(p.extrapolated))
    if lr is not None:
        lines.append(_lr_line(fit, lr))
    return "\n".join(lines + [f"note: {n}" for n in p.notes])


def _lr_line(fit: LadderFit, lr: float) -> str:
    p = fit.prediction
    return f"training.lr {lr:g} is {lr / p.edge:.2g}x that edge; P(edge below it) {format_risk(p.p_above_edge(lr))}"
