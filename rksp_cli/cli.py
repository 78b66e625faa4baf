"""The ``rksp`` command line: parse, call the library, render. Nothing else lives here.

Exit codes: 0 screened (and under the gate), 1 risk above ``--fail-above``, 2 bad input,
3 the model cannot be assessed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rksp_cli import __version__
from rksp_cli.errors import InputError, UnassessableError

app = typer.Typer(
    name="rksp",
    help="Screen a transformer training run for divergence before launch.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        out.print(f"rksp {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    """rksp: residual Koopman spectral profiling, from a config to a calibrated verdict."""


@app.command()
def screen(
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
) -> None:
    """Profile the residual stream at init and score the risk that training diverges."""
    from rksp_cli import render
    from rksp_cli.screen import screen as run_screen
    from rksp_cli.spec import load_spec

    if json_ and csv:
        _fail(InputError("--json and --csv are exclusive: pick one output format"))
    try:
        spec = load_spec(path, set_)
        with _layer_progress() as on_layer:
            result = run_screen(spec, allow_pickle=allow_pickle, on_layer=on_layer)
    except (InputError, UnassessableError) as exc:
        _fail(exc)

    if json_:
        typer.echo(render.to_json(result))
    elif csv:
        typer.echo(render.to_csv(result), nl=False)
    else:
        render.render(result, out)
    if fail_above is not None and result.risk.risk > fail_above:
        if not json_ and not csv:
            err.print(f"[red]gate: risk {result.risk.risk:.2f} is above --fail-above {fail_above}[/red]")
        raise typer.Exit(1)


@contextmanager
def _layer_progress() -> Iterator[Callable[[int, int], None]]:
    """A progress bar over the per-layer DMD on stderr, shown only on a terminal."""
    columns = (TextColumn("Koopman spectra"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as progress:
        task = progress.add_task("dmd", total=None)
        yield lambda done, total: progress.update(task, completed=done, total=total)


def _fail(exc: InputError | UnassessableError) -> None:
    label = "cannot assess" if isinstance(exc, UnassessableError) else "error"
    err.print(f"[bold red]{label}:[/bold red] {exc}", highlight=False, soft_wrap=True)
    raise typer.Exit(exc.exit_code)
