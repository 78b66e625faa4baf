"""The ``rksp`` command line: parse, call the library, render. Nothing else lives here.

Exit codes: 0 screened and scored (and under the gate), 1 risk above ``--fail-above``, 2 bad
input (one line naming the field, option or file), 3 nothing could be scored. No input that could
not be scored exits 0, and no bad input exits 1.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import typer.core
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from rksp_cli import MAX_SEED, __version__
from rksp_cli.budget import DEFAULT_MAX_MINUTES
from rksp_cli.errors import InputError, UnassessableError
from rksp_cli.files import check_writable

if TYPE_CHECKING:
    from rksp_cli.budget import Cost
    from rksp_cli.risk import RiskModel
    from rksp_cli.screen import ScreenResult


class _OneLineUsageErrors(typer.core.TyperGroup):
    """Usage errors (a bad flag value, a missing argument) as one line on stderr, exit 2, like every
    other bad input, rather than click's usage block: CI logs and scripts read the first line."""

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None, standalone_mode: bool = True,
             **extra: Any) -> Any:  # fmt: skip
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.TyperException as exc:  # click's exceptions, as typer vendors them
            if not standalone_mode:
                raise
            message = exc.format_message()
            if "\n" in message:  # `rksp` alone: the help text itself
                Console(stderr=True).print(message, markup=False, highlight=False)
            else:
                Console(stderr=True).print(Text.assemble(("error:", "bold red"), " ", message), highlight=False)
            sys.exit(exc.exit_code)
        except typer.Abort:
            if not standalone_mode:
                raise
            Console(stderr=True).print("Aborted.")
            sys.exit(130)
        if standalone_mode:
            sys.exit(rv if isinstance(rv, int) else 0)
        return rv


# where a command's models run; weights and tokens are drawn on the CPU first, so only round-off depends on it
DeviceOption = Annotated[str, typer.Option("--device", help="cpu or cuda[:N]: where the models run.")]

app = typer.Typer(
    cls=_OneLineUsageErrors,
    name="rksp",
    help="Screen a transformer training run for divergence before launch.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
out = Console()
err = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        out.print(f"rksp {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    ctx: typer.Context,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
    threads: Annotated[
        int | None,
        typer.Option(
            "--threads",
            min=1,
            metavar="N",
            help="torch threads. Default: 1 for probe and faults (small models lose to thread "
            "overhead, badly on a busy machine), torch's own (one per core) for screen.",
        ),
    ] = None,
) -> None:
    """rksp: residual Koopman spectral profiling, from a config to a calibrated verdict."""
    ctx.obj = {"threads": threads}


def _use_threads(ctx: typer.Context, default: int | None) -> None:
    """Pin torch's thread count: --threads, else the command's own default (None: torch's)."""
    threads = (ctx.obj or {}).get("threads") or default
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


@app.command()
def screen(
    ctx: typer.Context,
    path: Annotated[
        Path, typer.Argument(help="Screen config (.yaml), transformers config.json, checkpoint dir or .safetensors.")
    ],
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a field, e.g. --set training.lr=3e-3 (repeatable).")
    ] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the result as JSON (stdout holds only JSON).")] = False,
    csv: Annotated[bool, typer.Option("--csv", help="Print the per-layer rows as CSV.")] = False,
    fail_above: Annotated[
        float | None, typer.Option("--fail-above", min=0.0, max=1.0, help="Exit 1 when risk exceeds this (a CI gate).")
    ] = None,
    allow_pickle: Annotated[
        bool, typer.Option("--allow-pickle", help="Load .bin/.pt checkpoints (with weights_only=True).")
    ] = False,
    calibration: Annotated[
        str | None, typer.Option("--calibration", help="Calibration file, or 'none' for the paper's rule.")
    ] = None,
    stream: Annotated[
        bool | None,
        typer.Option("--stream/--no-stream", help="Materialise one block at a time (default: above 2 GiB of weights)."),
    ] = None,
    profile: Annotated[bool, typer.Option("--profile", help="Print where the time went, per layer.")] = False,
    device: DeviceOption = "cpu",
    report: Annotated[Path | None, typer.Option("--report", help="Write a self-contained HTML report (.html).")] = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", metavar="FILE", help="Write the eigenvalue figure alone (.png).")
    ] = None,
    max_minutes: Annotated[
        float,
        typer.Option("--max-minutes", min=0.0, metavar="MIN", help="Refuse a screen estimated to take longer."),
    ] = DEFAULT_MAX_MINUTES,
    force: Annotated[
        bool, typer.Option("--force", help="Run even if the estimated memory or time does not fit.")
    ] = False,
    spread: Annotated[
        int | None,
        typer.Option(
            "--spread",
            min=1,
            metavar="N",
            help="Screen N token samples and report the spread of the risk, the edge and the main "
            "features (1: off). Default: 3 when that takes under a minute, else 1.",
        ),
    ] = None,
    ladder: Annotated[
        Path | None,
        typer.Option("--ladder", help="A proxy ladder from `rksp ladder` (.parquet): also predict the edge from it."),
    ] = None,
) -> None:
    """Profile the residual stream at init and score the risk that training diverges.

    Exit codes: 0 scored (and under --fail-above), 1 risk above --fail-above, 2 bad input,
    3 not assessable (no risk could be scored: the exit is never 0 then).
    """
    from rksp_cli import render
    from rksp_cli.budget import Budget
    from rksp_cli.models import BuildOptions
    from rksp_cli.risk import RuleBasedRisk, default_risk_model
    from rksp_cli.screen import DEFAULT_SPREAD, SPREAD_WITHIN_SECONDS
    from rksp_cli.screen import screen as run_screen
    from rksp_cli.spec import load_spec

    _use_threads(ctx, None)
    if json_ and csv:
        _fail(InputError("--json and --csv are exclusive: pick one output format"))
    _check_output("--report", report, ".html")
    _check_output("--plot", plot, ".png")
    console = err if json_ or csv else out
    budget = Budget(seconds=max_minutes * 60, force=force, notify=lambda cost: _announce(cost, console))
    try:
        spec = load_spec(path, set_)
        options = BuildOptions(allow_pickle=allow_pickle, stream=stream, device=device)
        risk_model = default_risk_model(calibration)
        if fail_above is not None and spec.training.lr is None and not isinstance(risk_model, RuleBasedRisk):
            raise InputError("training.lr: --fail-above needs the learning rate the run will use")
        ladder_fit = None
        if ladder is not None:  # read and fitted before the screen: a wrong ladder is a bad input
            from rksp_cli.ladder import fit_ladder, ladder_target, read_ladder

            frame = read_ladder(ladder)
            ladder_fit = fit_ladder(frame, ladder_target(ladder, frame, spec))
        with _layer_progress() as on_layer:
            result = run_screen(
                spec, risk_model, options, on_layer, budget, repeats=spread or DEFAULT_SPREAD,
                repeats_within=SPREAD_WITHIN_SECONDS if spread is None else None,
            )  # fmt: skip
        result.ladder = ladder_fit
    except (InputError, UnassessableError) as exc:
        _fail(exc)

    if json_:
        typer.echo(render.to_json(result))
    elif csv:
        typer.echo(render.to_csv(result), nl=False)
    else:
        render.render(result, out)
    if profile:
        render.render_profile(result, console)
    _write_figures(result, risk_model, report, plot, console)
    risk = result.risk.risk
    if not math.isfinite(risk):  # never a pass: exit 3 with the reason
        hint = "; set it (--set training.lr=...) to score the run" if "lr is not set" in result.risk.reason else ""
        _fail(UnassessableError(f"no risk was scored: {result.risk.reason}{hint}"))
    if fail_above is not None:  # the risk, or the interval's top when extrapolated, or the spread's highest
        gated, what = result.risk.gated
        if result.spread is not None and result.spread["gated"] is not None and result.spread["gated"][1] >= gated:
            gated, what = result.spread["gated"][1], f"highest {what} over {result.spread['samples']} token samples"
        lr = spec.training.lr
        if result.ladder is not None and lr is not None and (p := result.ladder.prediction.p_above_edge(lr)) > gated:
            gated, what = p, "the ladder's P(edge below training.lr)"
        if gated > fail_above:
            err.print(f"gate: {what} {gated:.2f} > --fail-above {fail_above}: fail", style="red", markup=False)
            raise typer.Exit(1)
        console.print(f"gate: {what} {gated:.2f} <= --fail-above {fail_above}: pass", markup=False)


@app.command()
def probe(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="Screen config (.yaml) of a built-in gpt.")],
    steps: Annotated[
        int | None, typer.Option("--steps", min=1, help="Training steps (default training.steps).")
    ] = None,
    task: Annotated[str | None, typer.Option("--task", help="synthetic_lm, assoc_recall or a text file.")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a field (repeatable).")] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the labelled row as JSON.")] = False,
    kss: Annotated[bool, typer.Option("--kss", help="Train with Koopman Spectral Shaping (alpha 0.15).")] = False,
    device: DeviceOption = "cpu",
) -> None:
    """Train the configuration briefly and label whether it diverged (ground truth for calibration)."""
    from rksp_cli import render
    from rksp_cli.probe import probe as run_probe
    from rksp_cli.spec import load_spec

    _use_threads(ctx, 1)
    overrides = list(set_ or [])
    overrides += [f"training.steps={steps}"] if steps else []
    overrides += [f"training.task={task}"] if task else []
    overrides += ["training.kss_alpha=0.15"] if kss else []
    try:
        spec = load_spec(path, overrides)
        with _progress("training", spec.training.steps) as advance:
            result = run_probe(spec, on_step=lambda step, loss, grad: advance(step + 1), device=_device(device))
    except InputError as exc:
        _fail(exc)
    if json_:
        typer.echo(render.dumps(result.row()))
    else:
        render.render_probe(result, out)


@app.command()
def sweep(
    grid: Annotated[Path, typer.Argument(help="Grid file (.yaml): base config, axes, seeds.")],
    out_path: Annotated[Path, typer.Option("--out", help="Results (.parquet); a .journal beside it resumes.")],
    probe_: Annotated[bool, typer.Option("--probe", help="Also train each point briefly and label it.")] = False,
    workers: Annotated[int, typer.Option("--workers", min=1, help="Local worker processes.")] = 1,
    backend: Annotated[str, typer.Option("--backend", help="local or ray.")] = "local",
    address: Annotated[str | None, typer.Option("--address", help="Ray cluster address (e.g. auto).")] = None,
    heatmap: Annotated[
        str | None, typer.Option("--heatmap", help="Two axes for the risk heatmap, e.g. training.lr,model.norm.")
    ] = None,
    report: Annotated[
        bool, typer.Option("--report", help="Also write an HTML report beside the results (<out>-report.html).")
    ] = False,
    device: DeviceOption = "cpu",
) -> None:
    """Screen (and with --probe, label) every point of a grid; rerun the same command to resume."""
    from rksp_cli import render
    from rksp_cli.report import heatmap_axes, heatmap_figure, save_png, sweep_html, write_html
    from rksp_cli.sweep import load_grid, run_sweep

    if backend not in ("local", "ray"):
        _fail(InputError(f"--backend: expected local or ray, got {backend!r}"))
    _check_output("--out", out_path, ".parquet")
    try:
        device = _device(device)
        points = load_grid(grid)
        with _progress("sweep", len(points), failures=True) as advance:
            frame = run_sweep(points, out_path, probe_, workers, backend, address, advance, device)
    except InputError as exc:
        _fail(exc)
    render.render_sweep(frame, out_path, out)
    ok = frame[frame["error"].isna()] if "error" in frame else frame
    axes = [f"config.{a.strip().removeprefix('config.')}" for a in heatmap.split(",")] if heatmap else heatmap_axes(ok)
    if "risk" in ok and len(axes) == 2 and all(a in ok for a in axes):
        png = save_png(heatmap_figure(ok, axes[0], axes[1]), out_path.with_name(out_path.stem + "-heatmap.png"))
        out.print(f"heatmap: {png}", markup=False)
    elif heatmap:
        err.print(f"no heatmap: {heatmap} are not two columns of the results", style="yellow", markup=False)
    if report:
        page = write_html(out_path.with_name(out_path.stem + "-report.html"), sweep_html(frame, axes, grid))
        out.print(f"report: {page}", markup=False)


@app.command()
def ladder(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="Target: screen config (.yaml) or transformers config.json.")],
    out_path: Annotated[Path, typer.Option("--out", help="Probed proxies (.parquet); a .journal beside it resumes.")],
    widths: Annotated[
        str | None, typer.Option("--widths", help="Proxy widths, e.g. 32,64,128 (default: up to 128).")
    ] = None,
    depths: Annotated[
        str | None, typer.Option("--depths", help="Proxy depths, e.g. 2,4 (default: the target's if <= 4, else 2,4,8).")
    ] = None,
    seeds: Annotated[str, typer.Option("--seeds", help="Seeds per proxy, e.g. 0,1.")] = "0",
    lr_range: Annotated[str, typer.Option("--lr-range", help="First round's lrs: LOW,HIGH (log-spaced).")] = "1e-4,1",
    lr_points: Annotated[int, typer.Option("--lr-points", min=2, help="lrs in the first round.")] = 7,
    resolution: Annotated[
        float, typer.Option("--resolution", help="Refine each edge until its bracket's hi/lo is at most this.")
    ] = 1.25,
    steps: Annotated[int | None, typer.Option("--steps", min=1, help="Probe horizon (default training.steps).")] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a field for the proxies (repeatable).")
    ] = None,
    workers: Annotated[int, typer.Option("--workers", min=1, help="Local worker processes.")] = 1,
    backend: Annotated[str, typer.Option("--backend", help="local or ray.")] = "local",
    address: Annotated[str | None, typer.Option("--address", help="Ray cluster address (e.g. auto).")] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the fit and prediction as JSON.")] = False,
    device: DeviceOption = "cpu",
) -> None:
    """Probe width/depth-scaled proxies of a target across lrs; fit the edge against scale; predict the target's.

    Rerun the same command to resume. Use the result with `rksp screen TARGET --ladder OUT`.
    """
    from rksp_cli import render
    from rksp_cli.ladder import Search, default_depths, default_widths, fit_ladder, run_ladder, target_of
    from rksp_cli.spec import load_spec

    _use_threads(ctx, 1)
    if backend not in ("local", "ray"):
        _fail(InputError(f"--backend: expected local or ray, got {backend!r}"))
    _check_output("--out", out_path, ".parquet")
    console = err if json_ else out
    try:
        spec = load_spec(path)
        target = target_of(spec, [*(set_ or []), *([f"training.steps={steps}"] if steps else [])])
        search = Search(tuple(_numbers("--lr-range", lr_range, float, 0.0, 2)), lr_points, resolution)
        w = _numbers("--widths", widths, int, 1) if widths else default_widths(target)
        d = _numbers("--depths", depths, int, 1) if depths else default_depths(target)
        s = _numbers("--seeds", seeds, int, 0)
        console.print(render.ladder_plan(target, w, d, s, search), markup=False, highlight=False)

        with _progress("probes", len(w) * len(d) * len(s) * search.lr_points) as advance:

            def on_round(round_: int, points: int) -> Callable[..., None]:
                console.print(f"round {round_ + 1}: {points} probes", style="dim", markup=False)
                return advance

            frame = run_ladder(target, w, d, s, search, out_path, workers, backend, address, on_round, _device(device))
        fit = fit_ladder(frame, target)
    except InputError as exc:
        _fail(exc)
    if json_:
        typer.echo(render.dumps(fit.to_dict(spec.training.lr)))
    else:
        render.render_ladder(fit, spec.training.lr, out)
        out.print(f"wrote {out_path}; use it: rksp screen {path} --ladder {out_path}", markup=False)


def _device(name: str) -> str:
    """``--device`` checked here, before any work, rather than in every worker."""
    from rksp_cli.models import BuildOptions

    return BuildOptions(device=name).device


def _numbers(option: str, text: str, kind: type, least: float, count: int | None = None) -> list[Any]:
    """'32,64,128' as a sorted list of distinct numbers (or ``count`` in order), each >= ``least``."""
    try:
        values = [kind(v) for v in text.split(",")]
    except ValueError:
        raise InputError(f"{option} {text}: expected comma-separated {kind.__name__}s") from None
    if (count is not None and len(values) != count) or any(not v >= least for v in values):
        raise InputError(f"{option} {text}: expected {count or 'some'} {kind.__name__}s, each at least {least:g}")
    return values if count is not None else sorted(set(values))


@app.command()
def calibrate(
    runs: Annotated[list[Path], typer.Argument(help="Labelled runs (.parquet) from `rksp sweep --probe`.")],
    out_path: Annotated[Path, typer.Option("--out", help="Calibration file (.json); a .md report goes beside it.")],
    method: Annotated[str, typer.Option("--method", help="sigmoid (Platt) or isotonic.")] = "sigmoid",
    label: Annotated[
        str, typer.Option("--label", help="label (explosion, the paper's) or label_any (explosion or stall).")
    ] = "label",
    report_path: Annotated[
        Path | None, typer.Option("--report", help="Markdown report (default: beside --out, as .md).")
    ] = None,
    bootstrap: Annotated[int, typer.Option("--bootstrap", min=10, help="Resamples for the AUROC CIs.")] = 1000,
    token_samples: Annotated[
        Path | None,
        typer.Option(
            "--token-samples",
            help="More token samples of each run's screen (.parquet, calibration/token_samples.py): the "
            "report adds how far each feature set's held-out edge moves between them.",
        ),
    ] = None,
) -> None:
    """Fit P(diverged) on labelled runs; report how it transfers to held-out scales and architectures."""
    from rksp_cli import render
    from rksp_cli.files import atomic_path
    from rksp_cli.risk.calibration import read_runs, read_token_samples, save_calibration
    from rksp_cli.risk.estimator import DivergenceModel
    from rksp_cli.risk.evaluation import LABELS, evaluate

    if method not in ("sigmoid", "isotonic"):
        _fail(InputError(f"--method: expected sigmoid or isotonic, got {method!r}"))
    if label not in LABELS:
        _fail(InputError(f"--label: expected {' or '.join(LABELS)}, got {label!r}"))
    markdown = report_path or out_path.with_suffix(".md")
    _check_output("--out", out_path, ".json")
    _check_output("--report", markdown, ".md")
    try:
        frame = read_runs(runs, label)
        samples = None if token_samples is None else read_token_samples(token_samples, frame)
        with err.status("held-out validation: by scale, architecture and normalisation family"):
            report = evaluate(frame, label=label, method=method, n_boot=bootstrap, token_samples=samples)
        with err.status("final fit and its group-bootstrap refits"):
            model = DivergenceModel(method=method).fit(frame, frame[label])
    except InputError as exc:
        _fail(exc)
    save_calibration(out_path, model, report, frame)
    with atomic_path(markdown) as tmp:
        tmp.write_text(render.calibration_markdown(report, sources=runs))
    render.render_calibration(report, out)
    out.print(f"wrote {out_path} and {markdown}", markup=False)


@app.command()
def faults(
    ctx: typer.Context,
    fault: Annotated[
        list[str] | None, typer.Option("--fault", help="Inject only this fault (repeatable; default all).")
    ] = None,
    steps: Annotated[int, typer.Option("--steps", min=2, help="Training steps per run.")] = 600,
    inject_at: Annotated[int, typer.Option("--inject-at", min=1, help="Step at which the fault starts.")] = 200,
    every: Annotated[int, typer.Option("--every", min=1, help="Monitor interval in steps.")] = 10,
    seed: Annotated[int, typer.Option("--seed", min=0, max=MAX_SEED, help="Seed of the model and the data.")] = 0,
    json_: Annotated[bool, typer.Option("--json", help="Print the per-monitor rows as JSON.")] = False,
) -> None:
    """Inject training faults into a small job and report which monitors alarm, how early, and false alarms."""
    from dataclasses import replace

    from rksp_cli import render
    from rksp_cli.monitors.faults import FAULTS, FaultJob, run_fault

    _use_threads(ctx, 1)
    chosen = fault or list(FAULTS)
    if unknown := [f for f in chosen if f not in FAULTS]:
        _fail(InputError(f"--fault: unknown {', '.join(unknown)}; choose from {', '.join(FAULTS)}"))
    if inject_at >= steps:
        _fail(InputError(f"--inject-at {inject_at}: must be below --steps {steps}"))
    job = replace(FaultJob(), steps=steps, inject_at=inject_at, every=every, seed=seed)
    runs = []
    with _progress("fault runs", len(chosen) + 1) as advance:
        for i, name in enumerate([None, *chosen]):
            runs.append(run_fault(name, job))
            advance(i + 1)
    if json_:
        typer.echo(render.dumps(render.fault_rows(runs)))
    else:
        render.render_faults(runs, out)


@app.command()
def watch(
    log: Annotated[Path, typer.Argument(help="Metrics log (.jsonl) written by Monitor(..., log=...).")],
    follow: Annotated[
        bool, typer.Option("--follow/--once", help="Keep refreshing until Ctrl-C, or render once and exit.")
    ] = True,
    interval: Annotated[float, typer.Option("--interval", min=0.1, help="Seconds between refreshes.")] = 2.0,
) -> None:
    """A live dashboard of a running job's monitors, read from its metrics log."""
    import time

    from rich.live import Live

    from rksp_cli import render
    from rksp_cli.watch import read_log

    try:
        metrics = read_log(log)
        if not follow:
            out.print(render.watch_dashboard(metrics))
            return
        if not out.is_terminal:  # a CI log or a pipe: print the dashboard again whenever a check arrives
            shown = -1
            while True:
                if len(metrics.checks) != shown:
                    out.print(render.watch_dashboard(metrics))
                    shown = len(metrics.checks)
                time.sleep(interval)
                metrics = read_log(log)
        with Live(render.watch_dashboard(metrics), console=out, refresh_per_second=4) as live:
            while True:
                time.sleep(interval)
                live.update(render.watch_dashboard(read_log(log)))
    except InputError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a user stops watching: exit 0


@app.command()
def compare(
    before: Annotated[Path, typer.Argument(help="Screen result (.json from rksp screen --json), before.")],
    after: Annotated[Path, typer.Argument(help="Screen result (.json), after.")],
    format_: Annotated[str, typer.Option("--format", help="table, or markdown (for a CI comment).")] = "table",
    report: Annotated[Path | None, typer.Option("--report", help="Also write the comparison as HTML.")] = None,
) -> None:
    """What changed between two screens: verdict, risk, edge, features and config."""
    from rksp_cli import render
    from rksp_cli.compare import compare_screens
    from rksp_cli.report import compare_html, write_html

    if format_ not in ("table", "markdown"):
        _fail(InputError(f"--format: expected table or markdown, got {format_!r}"))
    _check_output("--report", report, ".html")
    try:
        comparison = compare_screens(before, after)
    except InputError as exc:
        _fail(exc)
    markdown = render.comparison_markdown(comparison)
    if format_ == "markdown":
        typer.echo(markdown, nl=False)
    else:
        render.render_comparison(comparison, out)
    if report is not None:
        write_html(report, compare_html(comparison, markdown))
        err.print(f"report: {report}", markup=False)


def _check_output(option: str, path: Path | None, suffix: str) -> None:
    """An output path is checked before the work: its suffix, and that its folder takes a new file."""
    if path is None:
        return
    if path.suffix.lower() != suffix:
        _fail(InputError(f"{option} {path}: expected a {suffix} path"))
    try:
        check_writable(path, option)
    except InputError as exc:
        _fail(exc)


def _announce(cost: Cost, console: Console) -> None:
    console.print(f"estimate: {cost.describe()}", style="dim", markup=False, highlight=False)


def _write_figures(
    result: ScreenResult, risk_model: RiskModel, report: Path | None, plot: Path | None, console: Console
) -> None:
    from rksp_cli.report import eigenvalue_figure, save_png, screen_html, spectra_layers, write_html

    if report is not None:
        write_html(report, screen_html(result, risk_model))
        console.print(f"report: {report}", markup=False)
    if plot is not None:
        save_png(eigenvalue_figure(spectra_layers(result)), plot)
        console.print(f"plot: {plot}", markup=False)


@contextmanager
def _layer_progress() -> Iterator[Callable[[int, int], None]]:
    """A progress bar over the per-layer DMD on stderr, shown only on a terminal."""
    columns = (TextColumn("Koopman spectra"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as progress:
        task = progress.add_task("dmd", total=None)
        yield lambda done, total: progress.update(task, completed=done, total=total)


@contextmanager
def _progress(label: str, total: int, failures: bool = False) -> Iterator[Callable[..., None]]:
    """done/total, failures, elapsed and ETA on stderr (on a terminal only)."""
    columns = [TextColumn(label), BarColumn(), MofNCompleteColumn()]
    columns += [TextColumn("[red]{task.fields[failed]} failed")] if failures else []
    columns += [TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn()]
    with Progress(*columns, console=err, disable=not err.is_terminal) as progress:
        task = progress.add_task(label, total=total, failed=0)

        def advance(done: int, total: int | None = None, failed: int = 0) -> None:
            progress.update(task, completed=done, failed=failed, **({"total": total} if total else {}))

        yield advance


def _fail(exc: InputError | UnassessableError) -> None:
    """One line on stderr, the message verbatim (never read as markup), then the error's exit code."""
    label = "cannot assess" if isinstance(exc, UnassessableError) else "error"
    line = Text.assemble((f"{label}:", "bold red"), " ", str(exc))
    err.print(line, highlight=False, soft_wrap=True)
    raise typer.Exit(exc.exit_code)
