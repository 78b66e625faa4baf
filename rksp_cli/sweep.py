"""Grids of screens (and, with ``probe=True``, short labelled trainings), resumable, local or on Ray.

A grid file names a base screen config and, per field, a list or a range, plus seeds::

    base: ../screens/gpt-small-noln.yaml      # relative to the grid file
    axes:
      training.lr: {log: [1e-4, 1e-1], num: 7}
      model.n_layers: [2, 4, 6]
      model.norm: [pre, post, none]
    seeds: [0, 1, 2]                           # probe.seed values; default [0]
    sample: 200                                # optional: a seeded random subset of the configurations
    sample_seed: 0

The store is an SQLite journal (``<out>.journal``): each finished point is one committed row, so a
kill at any moment loses at most the points in flight, and a restart skips every key it holds
(the key hashes the resolved config, seed included). When the sweep ends, the journal is exported
to ``<out>`` (Parquet, written to a temporary file and renamed).
"""

from __future__ import annotations

import itertools
import json
import math
import random
import sqlite3
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from rksp_cli.errors import InputError
from rksp_cli.files import atomic_path
from rksp_cli.spec import ADDED_LATER, ScreenSpec, load_spec, set_field, spec_from_dict

Progress = Callable[[int, int, int], None]  # (done, total, failed)

# A sweep's size limit (design choice): 100,000 screens is days of CPU time; a grid past it is a
# typo (num: 1e8) far more often than a plan, and `sample:` draws a subset of any size of grid.
MAX_POINTS = 100_000


@dataclass(frozen=True)
class Point:
    key: str
    config: dict[str, Any]  # a full raw config: base plus this point's values

    @classmethod
    def of(cls, spec: ScreenSpec) -> Point:
        """The point of a validated config: its run key and its resolved config."""
        return cls(spec.key(), spec.resolved())


def load_grid(path: str | Path) -> list[Point]:
    """Expand a grid file into validated points. Every error surfaces here, before any work."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such grid file")
    try:
        grid = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        raise InputError(f"{path}: not valid YAML") from None
    if not isinstance(grid, dict):
        raise InputError(f"{path}: expected a mapping with base, axes and seeds")
    unknown = set(grid) - {"base", "axes", "seeds", "sample", "sample_seed"}
    if unknown:
        raise InputError(f"{path}: unknown field {sorted(unknown)[0]}")
    if "base" in grid:
        base_path = path.parent / str(grid["base"])
        base = load_spec(base_path).resolved()
    else:
        base = spec_from_dict({}).resolved()
    axes = grid.get("axes") or {}
    if not isinstance(axes, dict) or not axes:
        raise InputError(f"{path}: axes: give at least one field with a list or range of values")
    values = {name: _axis_values(path, name, spec) for name, spec in axes.items()}
    seeds = grid.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise InputError(f"{path}: seeds: expected a non-empty list of integers")

    sizes = [len(v) for v in values.values()]
    total = math.prod(sizes)
    if "sample" in grid:
        n = grid["sample"]
        if not isinstance(n, int) or n < 1:
            raise InputError(f"{path}: sample: expected a positive integer")
        if min(n, total) * len(seeds) > MAX_POINTS:
            raise InputError(f"{path}: sample: {n:,} x {len(seeds)} seeds is over the {MAX_POINTS:,} a sweep takes")
        # sample indices of the product, never the product itself: a huge grid costs nothing
        chosen_index = random.Random(grid.get("sample_seed", 0)).sample(range(total), min(n, total))
        combos = [_combo(values, i) for i in chosen_index]
    else:
        if total * len(seeds) > MAX_POINTS:
            largest = max(values, key=lambda name: len(values[name]))
            raise InputError(
                f"{path}: axes: {total * len(seeds):,} points (axes.{largest} alone has {len(values[largest]):,} "
                f"values), over the {MAX_POINTS:,} a sweep takes; add sample: N for a random subset"
            )
        combos = list(itertools.product(*values.values()))
    points = []
    for combo in combos:
        for seed in seeds:
            raw = json.loads(json.dumps(base))
            chosen = dict(zip(values, combo, strict=True))
            for name, value in chosen.items():
                set_field(raw, name, value, where=f"{path}: axes.{name}")
            raw["probe"]["seed"] = seed
            where = f"{path} (point {', '.join(f'{k}={v}' for k, v in chosen.items())})"
            spec = spec_from_dict(raw, source=where)
            points.append(Point.of(spec))
    return list({p.key: p for p in points}.values())  # identical points run once


def _combo(values: dict[str, list[Any]], index: int) -> tuple[Any, ...]:
    """The ``index``-th combination of ``itertools.product(*values.values())``."""
    out = []
    for options in reversed(list(values.values())):
        index, i = divmod(index, len(options))
        out.append(options[i])
    return tuple(reversed(out))


def _axis_values(path: Path, name: str, spec: Any) -> list[Any]:
    where = f"{path}: axes.{name}"
    if isinstance(spec, list):
        if not spec:
            raise InputError(f"{where}: empty list")
        return spec
    if isinstance(spec, dict) and len(spec) == 2 and "num" in spec and ({"log", "linear"} & spec.keys()):
        kind = "log" if "log" in spec else "linear"
        bounds, num = spec[kind], spec["num"]
        try:  # PyYAML reads 1e-4 (no dot) as a string
            lo, hi = (float(b) for b in bounds)  # exactly two numbers, or ValueError
        except (TypeError, ValueError):
            lo = hi = math.nan
        if (
            not isinstance(bounds, list)
            or len(bounds) != 2
            or math.isnan(lo + hi)
            or not isinstance(num, int)
            or isinstance(num, bool)
            or num < 1
        ):
            raise InputError(f"{where}: expected {{{kind}: [low, high], num: N}} with numbers and N >= 1")
        if num > MAX_POINTS:
            raise InputError(f"{where}: num {num:,} is over the {MAX_POINTS:,} points a sweep takes")
        if kind == "log":
            if lo <= 0 or hi <= 0:
                raise InputError(f"{where}: log range bounds must be positive")
            lo, hi = math.log(lo), math.log(hi)
        steps = [lo + (hi - lo) * i / (num - 1) if num > 1 else lo for i in range(num)]
        return [float(f"{(math.exp(s) if kind == 'log' else s):.6g}") for s in steps]
    raise InputError(f"{where}: expected a list or {{log|linear: [low, high], num: N}}")


class Store:
    """The durable result journal: one committed SQLite row per finished point.

    The journal records the settings that change what a row holds (today: whether points were
    probed). Resuming with other settings would skip every point and export rows of the wrong
    kind, so it is refused before any work.
    """

    def __init__(self, out: Path, probe: bool = False):
        self.out = Path(out)
        self.journal = self.out.with_name(self.out.name + ".journal")
        try:
            self.db = sqlite3.connect(self.journal)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("CREATE TABLE IF NOT EXISTS points (key TEXT PRIMARY KEY, row TEXT NOT NULL)")
            self.db.execute("CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
            self.db.commit()
        except sqlite3.DatabaseError as exc:
            raise InputError(f"{self.journal}: not a readable sweep journal ({exc})") from None
        self._agree(probe)

    def _agree(self, probe: bool) -> None:
        stored = dict(self.db.execute("SELECT name, value FROM settings"))
        if "probe" not in stored:  # a new journal, or one from before settings were recorded
            first = self.db.execute("SELECT row FROM points LIMIT 1").fetchone()
            if first is None:
                self.db.execute("INSERT INTO settings VALUES ('probe', ?)", (json.dumps(probe),))
                self.db.commit()
                return
            stored["probe"] = json.dumps("label" in json.loads(first[0]))
        if json.loads(stored["probe"]) != probe:
            made, asked = ("with", "without") if json.loads(stored["probe"]) else ("without", "with")
            raise InputError(
                f"{self.journal}: this journal was made {made} --probe and this run is {asked} it; rerun "
                "with the same settings to resume, or give another --out"
            )

    def keys(self) -> set[str]:
        """Points already done; a point that failed is not done, so a rerun tries it again."""
        rows = self.db.execute("SELECT key, row FROM points")  # rows hold NaN: Python's JSON, not SQLite's
        return {key for key, row in rows if json.loads(row).get("error") is None}

    def add(self, row: dict[str, Any]) -> None:
        self.db.execute("INSERT OR REPLACE INTO points VALUES (?, ?)", (row["key"], json.dumps(row, default=str)))
        self.db.commit()

    def frame(self) -> pd.DataFrame:
        rows = [json.loads(r) for (r,) in self.db.execute("SELECT row FROM points ORDER BY rowid")]
        return fill_added_later(pd.DataFrame(rows))

    def export(self) -> pd.DataFrame:
        frame = self.frame()
        with atomic_path(self.out) as tmp:
            frame.to_parquet(tmp, index=False)
        return frame

    def close(self) -> None:
        self.db.close()


def fill_added_later(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows recorded before a config field existed, given the value they had then (``ADDED_LATER``),
    so that old and new rows of one configuration compare equal (journals, ladders, calibration)."""
    if not any(c.startswith("config.") for c in frame):
        return frame
    for (section, name), before in ADDED_LATER.items():
        column = f"config.{section}.{name}"
        frame[column] = frame[column].where(frame[column].notna(), before) if column in frame else before
    return frame


def run_point(config: dict[str, Any], key: str, probe: bool, device: str = "cpu") -> dict[str, Any]:
    """Screen (or probe) one point on ``device``; failures become rows with an ``error``, never exceptions."""
    import torch

    torch.set_num_threads(1)  # one worker per core: more threads per worker only fight each other
    t0 = time.perf_counter()
    try:
        spec = spec_from_dict(config, source=f"point {key}")
        if probe:
            from rksp_cli.probe import probe as run_probe

            row = run_probe(spec, device=device).row()
        else:
            from rksp_cli.models import BuildOptions
            from rksp_cli.screen import screen

            row = screen(spec, options=BuildOptions(device=device)).row()
        row["error"], row["device"] = None, device
    except Exception as exc:  # one failing point must not stop the sweep
        row = {"key": key, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=3)}
    row["key"] = key
    row["seconds"] = time.perf_counter() - t0
    return row


def run_sweep(
    points: list[Point],
    out: Path,
    probe: bool = False,
    workers: int = 1,
    backend: str = "local",
    address: str | None = None,
    on_progress: Progress | None = None,
    device: str = "cpu",
) -> pd.DataFrame:
    """Run every point not yet done in the store (failed points again), then export the store to ``out``.

    ``device`` is where each point's model runs (local workers share it; on Ray, each task asks for
    a GPU when it is cuda)."""
    store = Store(out, probe)
    try:
        done = store.keys()
        todo = [p for p in points if p.key not in done]
        finished, failed = len(points) - len(todo), 0
        if on_progress:
            on_progress(finished, len(points), failed)
        if backend == "ray":
            results = _ray(todo, probe, address, device)
        else:
            results = _local(todo, probe, workers, device)
        for row in results:
            store.add(row)
            finished += 1
            failed += row.get("error") is not None
            if on_progress:
                on_progress(finished, len(points), failed)
        return store.export()
    finally:
        store.close()


def _local(points: list[Point], probe: bool, workers: int, device: str) -> Iterator[dict[str, Any]]:
    if workers <= 1:
        for p in points:
            yield run_point(p.config, p.key, probe, device)
        return
    import multiprocessing

    # spawn, not fork: forking a process that already holds torch's thread pools can deadlock
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        pending = set()
        queue = iter(points)
        for p in itertools.islice(queue, 2 * workers):
            pending.add(pool.submit(run_point, p.config, p.key, probe, device))
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                yield future.result()
                nxt = next(queue, None)
                if nxt is not None:
                    pending.add(pool.submit(run_point, nxt.config, nxt.key, probe, device))


def _ray(points: list[Point], probe: bool, address: str | None, device: str) -> Iterable[dict[str, Any]]:
    try:
        import ray
    except ImportError:
        raise InputError("--backend ray needs Ray: pip install 'rksp[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    remote = ray.remote(num_cpus=1, num_gpus=1 if device.startswith("cuda") else 0)(run_point)
    pending = [remote.remote(p.config, p.key, probe, device) for p in points]
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        yield from ray.get(ready)
