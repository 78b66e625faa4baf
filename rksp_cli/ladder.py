"""Small-scale proxies of a target: probe them across learning rates, fit the edge against scale.

``rksp ladder target`` builds width- and depth-scaled copies of the target (the built-in GPT with
the target's normalisation, init and training settings), finds each proxy's stable-lr edge by
probing, and fits the edge as a power law of width and depth (``risk.edge_law``) to predict the
target's. Wortsman et al. (2023) did this by hand; their point is that small models at high lr
show the instabilities of large models at lower lr.

The search, per proxy and seed, is a bracketing one, run with the sweep machinery (same journal,
same resume, local or Ray): a log-spaced first round over ``lr_range``; then, while the bracket
(largest lr that trained, smallest that diverged) is wider than ``resolution``, two lrs that
split it in three. An edge outside the range is chased by two grid steps at a time, up to 100x
past either end. Every round is a function of the rows already in the journal, so a rerun of the
same command replays the finished rounds from the journal and resumes where it stopped.

Design choices, written down because the literature is silent:
* proxies keep the target's head width (d_model / n_heads), with at least one head;
* a transformers target is translated to the built-in GPT: its width, depth, heads, MLP ratio and
  ``initializer_range``; RMSNorm if the config has ``rms_norm_eps``, else pre-LayerNorm (said so);
  vocabulary and sequence length stay the probe's small ones;
* proxies keep the target's training settings (warmup, clipping, batch, optimizer, horizon);
  ``--set`` changes them for the proxies only (e.g. a warmup scaled to the probe's horizon).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rksp_cli.errors import InputError
from rksp_cli.files import atomic_path
from rksp_cli.risk.edge_law import DEPTH, LR, SEED, WIDTH, EdgeLaw, EdgePrediction, bracket, proxy_edges
from rksp_cli.spec import ScreenSpec, apply_override, flatten, spec_from_dict
from rksp_cli.sweep import Point, Store, fill_added_later, run_sweep

# columns that differ between the rows of one ladder; every other config column is its family
SCALED = (WIDTH, DEPTH, "config.model.n_heads", LR, SEED)
LABEL = "label"  # the paper's explosion label: what the edge is the edge of
OVERRIDES = "ladder.overrides"
MAX_ROUNDS = 12  # a first round, refinements and range extensions; 1.25x from 4.6x takes 2
CHASE_STEPS, CHASE_LIMIT = 2, 100.0  # an edge outside the range: two grid steps at a time, up to 100x past it

Round = Callable[[int, int], Callable[[int, int, int], None] | None]  # (round, points) -> progress callback


@dataclass(frozen=True)
class Target:
    """What a ladder is for: the proxies' shared config, and the target's own width and depth."""

    base: dict[str, Any]  # resolved built-in GPT config the proxies copy (lr and size replaced)
    width: int
    depth: int
    head_dim: int
    overrides: tuple[str, ...] = ()  # --set items applied to the proxies, kept in the ladder file
    notes: tuple[str, ...] = ()  # how a transformers config was translated

    def family(self) -> dict[str, Any]:
        """The config columns every proxy shares: what a ladder file must match to serve this target."""
        return {k: v for k, v in flatten(self.base, "config").items() if _in_family(k)}


def target_of(spec: ScreenSpec, overrides: list[str] | None = None) -> Target:
    """The ladder target of a screen config; ``overrides`` (``--set``) change the proxies only."""
    model = spec.model
    if model.checkpoint is not None:
        raise InputError("model.checkpoint: a ladder trains fresh proxies of an architecture; give its config.json")
    raw = spec.resolved()
    notes: list[str] = []
    if model.arch == "gpt":
        width, depth, heads = model.d_model, model.n_layers, model.n_heads
    else:
        raw["model"], width, depth, heads, notes = _translate(model.hf_config, model.init_std)
    raw["training"]["lr"] = None
    for item in overrides or []:
        name = item.partition("=")[0].strip()
        if name in ("model.d_model", "model.n_layers", "model.n_heads", "training.lr"):
            raise InputError(f"--set {name}: the ladder sets this per proxy; use --widths, --depths, --lr-range")
        apply_override(raw, item)
    base = spec_from_dict(raw, source="ladder proxies").resolved()
    return Target(base, width, depth, max(1, width // heads), tuple(overrides or ()), tuple(notes))


def _translate(path: Path, init_std: float | None) -> tuple[dict[str, Any], int, int, int, list[str]]:
    """A transformers config as the built-in GPT's model section (see the module doc), and notes."""
    from rksp_cli.models.hf import read_config

    config = read_config(Path(path))
    try:
        width, depth, heads = config.hidden_size, config.num_hidden_layers, config.num_attention_heads
    except AttributeError as exc:
        raise InputError(f"{path}: no {exc.name} in this {config.model_type} config to build proxies from") from None
    inner = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * width
    norm = "rms" if hasattr(config, "rms_norm_eps") else "pre"
    init_std = init_std or float(getattr(config, "initializer_range", 0.02))
    notes = [
        f"proxies: the built-in GPT with {config.model_type}'s width, depth, heads, MLP ratio "
        f"{max(1, round(inner / width))} and init std {init_std:g}; norm {norm}"
        + ("" if norm == "rms" else " (LayerNorm taken as pre-LN; else --set model.norm=post)")
    ]
    gpt = {"arch": "gpt", "norm": norm, "d_model": width, "n_layers": depth, "n_heads": heads,
           "init_std": init_std, "mlp_ratio": max(1, round(inner / width))}  # fmt: skip
    return gpt, int(width), int(depth), int(heads), notes


def default_widths(target: Target) -> list[int]:
    """Three widths a 2-core CPU probes in minutes: 32-128, or a quarter to all of a smaller target."""
    top = min(128, target.width)
    return sorted({max(8, top // 4), max(8, top // 2), top})


def default_depths(target: Target) -> list[int]:
    """The target's own depth when it is small, else 2, 4 (and 8) blocks: the depth law's ladder."""
    if target.depth <= 4:
        return [target.depth]
    return [d for d in (2, 4, 8) if d < target.depth]


def proxy_point(target: Target, width: int, depth: int, lr: float, seed: int) -> Point:
    raw = json.loads(json.dumps(target.base))
    heads = max(1, width // target.head_dim)
    while width % heads:
        heads -= 1
    raw["model"].update(d_model=width, n_layers=depth, n_heads=heads)
    raw["training"]["lr"] = lr
    raw["probe"]["seed"] = seed
    spec = spec_from_dict(raw, source=f"ladder proxy (width {width}, depth {depth}, lr {lr:g})")
    return Point.of(spec)


@dataclass(frozen=True)
class Search:
    """How each proxy's edge is bracketed."""

    lr_range: tuple[float, float] = (1e-4, 1.0)
    lr_points: int = 7
    resolution: float = 1.25  # stop when hi / lo is at most this

    def __post_init__(self) -> None:
        lo, hi = self.lr_range
        if not (0 < lo < hi):
            raise InputError(f"--lr-range: expected 0 < low < high, got {lo:g},{hi:g}")
        if self.lr_points < 2:
            raise InputError("--lr-points: at least 2")
        if self.resolution <= 1.0:
            raise InputError("--resolution: a bracket ratio above 1 (e.g. 1.25)")

    @property
    def step(self) -> float:
        lo, hi = self.lr_range
        return (hi / lo) ** (1 / (self.lr_points - 1))

    def first(self) -> list[float]:
        lo = self.lr_range[0]
        return [_round(lo * self.step**i) for i in range(self.lr_points)]

    def next(self, lrs: np.ndarray, diverged: np.ndarray) -> list[float]:
        """The lrs to probe next for one proxy and seed; [] when its edge is bracketed or out of reach."""
        b = bracket(lrs, diverged)
        lo, hi = self.lr_range
        if b.hi is None:  # everything trained: chase the edge upwards, as far as the reach
            top, reach = float(np.max(lrs)), hi * CHASE_LIMIT
            return [_round(min(top * self.step**CHASE_STEPS, reach))] if top < reach else []
        if b.lo is None:  # everything diverged: chase it downwards
            bottom, reach = float(np.min(lrs)), lo / CHASE_LIMIT
            return [_round(max(bottom / self.step**CHASE_STEPS, reach))] if bottom > reach else []
        if b.ratio <= self.resolution:
            return []
        third = b.ratio ** (1 / 3)
        return [_round(b.lo * third), _round(b.lo * third**2)]


def _round(lr: float) -> float:
    return float(f"{lr:.6g}")  # as sweep grids do: stable keys across rounds and reruns


def run_ladder(
    target: Target,
    widths: list[int],
    depths: list[int],
    seeds: list[int],
    search: Search,
    out: Path,
    workers: int = 1,
    backend: str = "local",
    address: str | None = None,
    on_round: Round | None = None,
    device: str = "cpu",
) -> pd.DataFrame:
    """Bracket every proxy's edge (resuming from ``out``'s journal), each probe trained on
    ``device``; returns every probed row."""
    store = Store(out, probe=True)
    try:
        done = store.frame()
    finally:
        store.close()
    if "error" in done:
        done = done[done["error"].isna()]
    if len(done) and (mismatch := _mismatch(done, target)):
        raise InputError(f"{out}: its journal holds a ladder built with {mismatch}; give another --out")
    proxies = [(w, d, s) for w in widths for d in depths for s in seeds]
    todo = {p: search.first() for p in proxies}
    frame = pd.DataFrame()
    for round_ in range(MAX_ROUNDS):
        points = [proxy_point(target, w, d, lr, s) for (w, d, s), lrs in todo.items() for lr in lrs]
        if not points:
            break
        progress = on_round(round_, len(points)) if on_round else None
        frame = run_sweep(points, out, True, workers, backend, address, progress, device)
        failed = frame[frame["error"].notna()] if "error" in frame else frame.iloc[:0]
        if len(failed):
            raise InputError(f"{out}: a proxy probe failed ({failed['error'].iloc[0]}); see its journal row")
        todo = {}
        for (w, d, s), runs in frame.groupby([WIDTH, DEPTH, SEED]):
            if (w, d, s) in proxies and (lrs := search.next(runs[LR].to_numpy(), runs[LABEL].to_numpy() > 0)):
                todo[(int(w), int(d), int(s))] = lrs
    frame[OVERRIDES] = json.dumps(list(target.overrides))  # so a screen rebuilds the same proxies' family
    with atomic_path(out) as tmp:
        frame.to_parquet(tmp, index=False)
    return frame


def read_ladder(path: Path) -> pd.DataFrame:
    """The probed rows of a ladder file, checked to be one ladder (one family of proxies)."""
    if not path.is_file():
        raise InputError(f"{path}: no such ladder file")
    try:
        frame = fill_added_later(pd.read_parquet(path))
    except Exception as exc:
        raise InputError(f"{path}: cannot read a ladder ({type(exc).__name__})") from None
    missing = [c for c in (WIDTH, DEPTH, LR, SEED, LABEL, OVERRIDES) if c not in frame]
    if missing:
        raise InputError(f"{path}: no {missing[0]!r} column; make ladders with `rksp ladder` (and let it finish)")
    if "error" in frame:
        frame = frame[frame["error"].isna()]
    for column in family_columns(frame):
        if frame[column].astype(str).nunique() > 1:
            raise InputError(f"{path}: {column} varies between rows, so this is not one ladder")
    return frame


def family_columns(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame if _in_family(c)]


def _in_family(column: str) -> bool:
    """A config column every proxy of one ladder shares: not scaled per proxy, not the screen's sampling."""
    return column.startswith("config.") and column not in SCALED and not column.startswith("config.probe.")


def ladder_target(path: Path, frame: pd.DataFrame, spec: ScreenSpec) -> Target:
    """The screened config as the target of the ladder in ``path``, whose proxies it must match
    (same norm, init, warmup...; the ladder's ``--set`` applied to both): else an ``InputError``."""
    target = target_of(spec, json.loads(frame[OVERRIDES].iloc[0]))
    if mismatch := _mismatch(frame, target):
        raise InputError(f"{path}: this ladder was built with {mismatch}; build one for it with `rksp ladder`")
    return target


def _mismatch(frame: pd.DataFrame, target: Target) -> str | None:
    """'model.norm = pre, this config has post' for the first family field the rows do not share."""
    family = target.family()
    for column in family_columns(frame):
        built, wanted = frame[column].iloc[0], family.get(column)
        if not _same(built, wanted):
            return f"{column.removeprefix('config.')} = {_show(built)}, this config has {_show(wanted)}"
    return None


def _same(a: Any, b: Any) -> bool:
    if _missing(a) or _missing(b):
        return _missing(a) and _missing(b)
    if isinstance(a, (int, float, np.number)) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9)
    return str(a) == str(b)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _show(value: Any) -> str:
    return "null" if _missing(value) else str(value)


@dataclass(frozen=True)
class LadderFit:
    """A fitted ladder and its prediction at the target's width and depth."""

    edges: pd.DataFrame  # proxy_edges rows
    law: EdgeLaw
    prediction: EdgePrediction

    def to_dict(self, lr: float | None = None) -> dict[str, Any]:
        data = {
            "exponents": self.law.exponents,
            "proxies": self.edges.to_dict("records"),
            "prediction": self.prediction.to_dict(),
        }
        if lr is not None:
            data["lr"] = lr
            data["p_above_edge"] = self.prediction.p_above_edge(lr)
        return data


def fit_ladder(frame: pd.DataFrame, target: Target) -> LadderFit:
    edges = proxy_edges(frame, LABEL)
    law = EdgeLaw().fit(edges)
    prediction = law.predict(target.width, target.depth)
    notes = list(target.notes) + prediction.notes
    prediction = replace(prediction, notes=notes)
    return LadderFit(edges=edges, law=law, prediction=prediction)
