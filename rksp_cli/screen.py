"""The screen pipeline: spec -> model -> captured states -> spectra -> features -> risk.

This is the library entry point (``from rksp_cli.screen import screen``); the CLI only parses,
calls this and renders the result.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from rksp_cli import __version__
from rksp_cli.budget import Budget, Cost, ModelShape, concurrent_transitions, screen_cost
from rksp_cli.capture import capture_residual_stream, sample_positions
from rksp_cli.data import screen_batch
from rksp_cli.errors import UnassessableError
from rksp_cli.koopman import DMDSettings, LayerSpectrum, aggregate, layer_features, layer_spectrum
from rksp_cli.models import BuildOptions, Subject, build_subject
from rksp_cli.models.norm import NormFinder
from rksp_cli.models.streaming import release_free_memory
from rksp_cli.risk import RiskAssessment, RiskModel, default_risk_model
from rksp_cli.risk.assessment import TOKENS_PER_WIDTH, fits_exactly
from rksp_cli.risk.preventions import advice
from rksp_cli.spec import ScreenSpec, flatten

if TYPE_CHECKING:
    from rksp_cli.ladder import LadderFit

ProgressCallback = Callable[[int, int], None]  # (layers done, layers total)


@dataclass
class ScreenResult:
    spec: ScreenSpec
    model: dict[str, Any]  # what was built: source, architecture, parameter count
    spectra: list[LayerSpectrum]
    stream_rms: list[float]  # RMS of h_0 .. h_L over the sampled tokens
    features: dict[str, float]
    risk: RiskAssessment
    timings: dict[str, Any]  # seconds: build, forward, dmd, and per layer under "layers"
    warnings: list[str] = field(default_factory=list)
    cost: Cost | None = None  # the estimate the screen was admitted on (None for a model built by the caller)
    # over independent token samples (``repeats`` > 1): {"samples", "risk", "gated", "lr_edge", "features"},
    # each a [min, max] (None where some sample gave no finite value); None when not measured
    spread: dict[str, Any] | None = None
    # the features of every token sample measured, ``features`` first (one entry when ``repeats`` is 1)
    samples: list[dict[str, float]] = field(default_factory=list)
    ladder: LadderFit | None = None  # `screen --ladder`: the edge predicted from probed proxies

    @property
    def config(self) -> dict[str, Any]:
        """The resolved screen config."""
        return self.spec.resolved()

    def layer_rows(self) -> list[dict[str, Any]]:
        """One row per block transition, the shape of ``--csv`` and of ``layers`` in ``--json``."""
        rows = []
        for i, spec in enumerate(self.spectra):
            row: dict[str, Any] = {"layer": i, **layer_features(spec)}
            row.update(
                n_eigenvalues=spec.eigenvalues.numel(),
                n_kept=spec.n_kept,
                update_ratio=spec.update_ratio,
                stream_rms=self.stream_rms[i + 1],
                degenerate=spec.degenerate,
                filter_fallback=spec.filter_fallback,
                estimator=spec.estimator,
            )
            rows.append(row)
        return rows

    def row(self) -> dict[str, Any]:
        """A flat record for sweeps and calibration: key, config.*, feature.*, risk and verdict."""
        return screen_row(self.spec, self.features, self.risk, self.model.get("norm"))

    def to_dict(self) -> dict[str, Any]:
        """Everything a report needs, as plain data (``render.dumps`` makes it strict JSON)."""
        return {
            "rksp_version": __version__,
            "risk": self.risk.risk,
            "verdict": self.risk.verdict,
            "reason": self.risk.reason,
            "risk_model": {"name": self.risk.model, "calibrated": self.risk.calibrated, "notes": self.risk.notes},
            "risk_interval": self.risk.interval,
            "extrapolated": self.risk.extrapolated,
            "lr_edge": self.risk.lr_edge,
            "lr_edge_interval": self.risk.edge_interval,
            "out_of_range": self.risk.out_of_range,
            "features": self.features,
            "layers": self.layer_rows(),
            "model": self.model,
            "config": self.config,
            "warnings": self.warnings,
            "timings_s": self.timings,
            "spread": self.spread,
            "ladder": None if self.ladder is None else self.ladder.to_dict(self.spec.training.lr),
            "estimate": None
            if self.cost is None
            else {"memory_bytes": self.cost.memory_bytes, "seconds": self.cost.seconds},
        }


def screen(
    spec: ScreenSpec,
    risk_model: RiskModel | None = None,
    options: BuildOptions | None = None,
    on_layer: ProgressCallback | None = None,
    budget: Budget | None = None,
    repeats: int = 1,
    repeats_within: float | None = None,
) -> ScreenResult:
    """Screen one configuration. Raises ``InputError`` (exit 2) or ``UnassessableError`` (exit 3).

    ``budget`` (default: this machine's available memory and an hour) is checked against the
    screen's estimated cost before any weight is made; a config that does not fit is an
    ``InputError`` naming the field to change. ``repeats`` > 1 also measures the spread over that
    many token samples (``screen_subject``); with ``repeats_within`` (seconds), only if all of them
    are estimated to take no longer, else the model is screened once and a warning says so.
    """
    options = options or BuildOptions()
    budget = budget or Budget()
    admitted: list[Cost] = []
    skipped: list[str] = []

    def check(shape: ModelShape, fields: str) -> None:
        nonlocal repeats
        once = screen_cost(shape, spec.probe.tokens)
        if repeats > 1 and repeats_within is not None and once.seconds * repeats > repeats_within:
            skipped.append(
                f"spread over token samples not measured: one screen takes ≈ {once.seconds:.0f} s, and "
                f"{repeats} would take ≈ {once.seconds * repeats:.0f} s (ask for them with --spread {repeats})"
            )
            repeats = 1
        admitted.append(replace(once, seconds=once.seconds * repeats))
        budget.check(admitted[-1], fields)

    t = time.perf_counter()
    subject = build_subject(spec.model, spec.probe.seed, options, check)
    timings = {"build": time.perf_counter() - t}
    result = screen_subject(subject, spec, risk_model, on_layer, timings, options.device, repeats)
    result.cost = admitted[-1] if admitted else None
    result.warnings += skipped
    return result


# design choice: `rksp screen` measures a spread over 3 token samples by default, but only while
# that stays under a minute; asked for explicitly, it is measured whatever it costs
DEFAULT_SPREAD = 3
SPREAD_WITHIN_SECONDS = 60.0


def screen_subject(
    subject: Subject,
    spec: ScreenSpec,
    risk_model: RiskModel | None = None,
    on_layer: ProgressCallback | None = None,
    timings: dict[str, float] | None = None,
    device: str = "cpu",
    repeats: int = 1,
) -> ScreenResult:
    """Screen a model already built from ``spec`` (the probe trains the same object afterwards).

    ``repeats`` > 1 screens the same weights on that many independent token samples: the first
    (``probe.seed``'s own) gives the numbers, the others their spread (``ScreenResult.spread``).
    """
    risk_model = risk_model or default_risk_model()
    timings = dict(timings or {})
    settings = DMDSettings(rank=spec.probe.rank, residual_tol=spec.probe.residual_tol, kappa=spec.probe.kappa)
    t = time.perf_counter()
    with NormFinder(subject.blocks[0]) as finder:
        first = _measure(subject, spec, spec.probe.seed, settings, device, on_layer)
    norm = subject.summary.setdefault("norm", finder.family)  # the built-in GPT's is its config's
    timings["dmd"] = sum(first.dmd_seconds)
    timings["forward"] = time.perf_counter() - t - timings["dmd"]
    layer_timings = [{"forward": f, "dmd": d} for f, d in zip(first.block_seconds, first.dmd_seconds, strict=True)]
    for row, load in zip(layer_timings, subject.load_seconds or [], strict=False):
        row["materialize"] = load
    timings["layers"] = layer_timings

    spectra = first.spectra
    warnings = _warnings(spectra, subject.d_model, spec.probe.tokens, first.distinct, settings)
    n_degenerate = sum(s.degenerate for s in spectra)
    if n_degenerate == len(spectra):
        raise UnassessableError(
            f"all {n_degenerate} blocks are the identity at initialisation (as with ReZero, Fixup or "
            "zero-initialised residual branches), so their spectra carry no signal; re-screen a "
            "checkpoint after a few hundred training steps"
        )
    features = _features(first, subject, spec)
    risk = risk_model.assess(screen_row(spec, features, norm=norm))
    if risk.verdict == "high":
        risk.notes.append(advice(norm, builtin=spec.model.arch == "gpt"))
    result = ScreenResult(spec, subject.summary, spectra, first.stream_rms, features, risk, timings, warnings)
    result.samples = [features]
    if repeats > 1:
        t = time.perf_counter()
        others = [
            _features(_measure(subject, spec, spec.probe.seed + SPREAD_SEED_STEP * k, settings, device), subject, spec)
            for k in range(1, repeats)
        ]
        result.samples += others
        others_risk = [risk_model.assess(screen_row(spec, f, norm=norm)) for f in others]
        result.spread = _spread(result.samples, [risk, *others_risk])
        timings["spread"] = time.perf_counter() - t
    return result


# Token samples of the spread: seed + k * this, far from the seeds a sweep steps through (0, 1, 2 ...)
SPREAD_SEED_STEP = 1_000_003
# The features whose spread a screen reports, beside the risk and the edge.
SPREAD_FEATURES = ("near_unit_mass_mean", "expansive_mass_mean", "gap_mass_mean", "contractive_mass_mean",
                   "spectral_radius_mean", "log10_kappa_mean", "eta_nl_mean")  # fmt: skip


@dataclass
class _Measurement:
    """One token sample's pass: the spectra and what was read on the way."""

    spectra: list[LayerSpectrum]
    stream_rms: list[float]
    distinct: int  # the fewest distinct token states of any transition
    init_loss: float | None
    dmd_seconds: list[float]
    block_seconds: list[float]


def _measure(
    subject: Subject,
    spec: ScreenSpec,
    token_seed: int,
    settings: DMDSettings,
    device: str,
    on_layer: ProgressCallback | None = None,
) -> _Measurement:
    """One forward pass on a token sample drawn with ``token_seed``, the transitions profiled in
    pairs as soon as their states exist (at most two transitions' states are held at a time).

    The forward pass waits while a pair is profiled (``_profile``). An earlier release solved each
    transition's eigenvalues on a worker thread beside the next block's forward pass; on a 2-core
    AVX-512 EPYC that made the GPT-2 124M screen 8% slower (a third thread competing with the
    forward pass's two) and a streamed one 1-3% slower, so it was dropped. ``dmd_seconds`` counts
    the de-duplication of the states too (work the spectra need and a bare forward pass does not);
    a pair's profile is split evenly between its two transitions.

    A streamed model's freed memory is handed back to the OS after each pair: its peak is one block
    plus these temporaries, and the hand-backs keep it flat over depth. A resident model's peak is
    its weights, and there the hand-back only made the next pair fault its pages in again (GPT-2
    124M: 0.15-0.3 s of 2.4 s of spectra, AMD EPYC)."""
    gen = torch.Generator().manual_seed(token_seed)
    ids = screen_batch(spec.probe.input, spec.probe.tokens, subject.vocab_size, subject.seq_len, gen)
    positions = sample_positions(ids.numel(), spec.probe.tokens, gen)
    sequences = positions // ids.shape[1]  # which sequence each sampled state comes from
    spectra: list[LayerSpectrum] = []
    stream_rms: list[float] = []
    dmd_seconds: list[float] = []
    distinct = spec.probe.tokens
    previous: list[torch.Tensor] = []
    pending: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (index, X, Y, sequences)
    at_once = concurrent_transitions(torch.get_num_threads(), device)
    dedup_seconds = 0.0

    def flush() -> None:
        """Profile the pending transitions, at once, and report each."""
        nonlocal dedup_seconds
        if not pending:
            return
        t = time.perf_counter()
        spectra.extend(_profile([(X.to(device), Y.to(device), seq) for _, X, Y, seq in pending], settings, at_once))
        if subject.streamed:
            release_free_memory()
        share = (time.perf_counter() - t + dedup_seconds) / len(pending)
        dmd_seconds.extend([share] * len(pending))
        indices = [index for index, *_ in pending]
        pending.clear()
        dedup_seconds = 0.0
        if on_layer is not None:
            for index in indices:
                on_layer(index, subject.n_layers)

    def consume(index: int, state: torch.Tensor) -> None:
        """Queue transition index-1 -> index as soon as h_index exists; keep only h_index."""
        nonlocal distinct, dedup_seconds
        if not torch.isfinite(state).all():
            where = "the embeddings (h_0)" if index == 0 else f"the output of block {index - 1}"
            raise UnassessableError(
                f"{where} holds NaN or inf values: the forward pass overflows at this init (is the init "
                "scale too large?), so there is no spectrum to measure; a run from it diverges at step 0"
            )
        stream_rms.append(float(state.to(torch.float64).square().mean().sqrt()))
        if previous:
            t = time.perf_counter()
            X, Y, kept = _distinct_columns(previous.pop().T, state.T)
            distinct = min(distinct, X.shape[1])
            pending.append((index, X, Y, sequences[kept]))
            dedup_seconds += time.perf_counter() - t
            if len(pending) == at_once:
                flush()
        previous.append(state)

    capture = capture_residual_stream(subject.blocks, lambda: subject.forward(ids), positions, on_state=consume)
    flush()  # an odd last transition
    init_loss = None if capture.result is None else float(capture.result)
    return _Measurement(spectra, stream_rms, distinct, init_loss, dmd_seconds, capture.block_seconds)


def _profile(
    transitions: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], settings: DMDSettings, at_once: int
) -> list[LayerSpectrum]:
    """``layer_spectrum`` of each (X, Y, sequences), ``at_once`` at a time, each on an equal share
    of torch's threads.

    Every transition gets the same share whether or not it has a partner (an odd last one
    included), so a layer's numbers do not depend on its position: torch's CPU kernels may sum
    in another order on another thread count. The thread count is torch's global setting, so it
    is set here, while the caller's forward pass waits, and restored after."""
    threads = torch.get_num_threads()
    if at_once == 1:
        return [layer_spectrum(X, Y, settings, seq) for X, Y, seq in transitions]
    torch.set_num_threads(max(1, threads // at_once))
    try:  # fresh worker threads: each takes torch's thread count when it starts
        with ThreadPoolExecutor(max_workers=at_once, thread_name_prefix="rksp-dmd") as pool:
            futures = [pool.submit(layer_spectrum, X, Y, settings, seq) for X, Y, seq in transitions]
            return [future.result() for future in futures]
    finally:
        torch.set_num_threads(threads)


def _features(m: _Measurement, subject: Subject, spec: ScreenSpec) -> dict[str, float]:
    """The flat features of one measurement: aggregates over depth, plus size and init facts."""
    features = aggregate(m.spectra)
    features.update(
        stream_growth=m.stream_rms[-1] / m.stream_rms[0] if m.stream_rms[0] > 0 else math.inf,
        degenerate_layers=float(sum(s.degenerate for s in m.spectra)),
        n_layers=float(subject.n_layers),
        d_model=float(subject.d_model),
        token_states=float(m.distinct),  # the fewest distinct states of any transition
        n_experts=float(subject.summary.get("n_experts", 0)),
    )
    if m.init_loss is not None:
        features["init_loss"] = m.init_loss
    init_std = spec.model.init_std if spec.model.init_std is not None else subject.summary.get("initializer_range")
    features["init_std"] = math.nan if spec.model.checkpoint is not None or init_std is None else float(init_std)
    return features


def _spread(features: list[dict[str, float]], risks: list[RiskAssessment]) -> dict[str, Any]:
    """(min, max) over token samples of the risk, the edge and the main features."""

    def span(values: list[float | None]) -> list[float] | None:
        finite = [v for v in values if v is not None and math.isfinite(v)]
        return [min(finite), max(finite)] if len(finite) == len(values) else None

    columns = {name: [f.get(name) for f in features] for name in SPREAD_FEATURES}
    # a feature computed in no sample (kappa without probe.kappa) is left out, not reported as unresolved
    measured = {n: v for n, v in columns.items() if any(x is not None and not math.isnan(x) for x in v)}
    return {
        "samples": len(features),
        "risk": span([r.risk for r in risks]),
        "gated": span([r.gated[0] for r in risks]),  # what --fail-above compares, per sample
        "lr_edge": span([r.lr_edge for r in risks]),
        "features": {name: span(values) for name, values in measured.items()},
    }


def screen_row(
    spec: ScreenSpec,
    features: dict[str, float] | None = None,
    risk: RiskAssessment | None = None,
    norm: str | None = None,
) -> dict[str, Any]:
    """The flat record of a screen; without features (an unassessable init) only the config.
    ``norm`` is the normalisation family the screen found (``model.norm``; ``models.norm``)."""
    row: dict[str, Any] = {"key": spec.key(), "config_id": spec.key(with_seed=False)}
    row.update(flatten(spec.resolved(), "config"))
    if norm is not None:
        row["model.norm"] = norm
    row.update({f"feature.{k}": v for k, v in (features or {}).items()})
    if risk is not None:
        row.update(risk=risk.risk, verdict=risk.verdict, lr_edge=risk.lr_edge)
    return row


def _distinct_columns(X: torch.Tensor, Y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drop repeated token states (identical prefixes give identical columns), keeping order; also
    the indices of the columns kept.

    Columns are bucketed by an exact integer hash of the bits of a fixed sample of their rows
    (``_column_hash``): identical columns always share a bucket, and only columns that share one
    are compared in full, so a collision costs a comparison, never a wrong answer. A row-wise
    ``torch.unique`` took 0.09 s per d = 768 transition; hashing every row 0.03 s; the sample of
    rows 0.003 s (AMD EPYC, 2 threads).
    """
    rows = torch.cat([X[_hashed_rows(X.shape[0])], Y[_hashed_rows(Y.shape[0])]]) + 0.0  # -0.0 -> 0.0, as == sees it
    _, bucket, counts = torch.unique(_column_hash(rows), return_inverse=True, return_counts=True)
    keep = torch.ones(X.shape[1], dtype=torch.bool)
    shared = (counts[bucket] > 1).nonzero().squeeze(1)
    if shared.numel():
        pairs = torch.cat([X[:, shared], Y[:, shared]]) + 0.0
        _, inverse = torch.unique(pairs.T, dim=0, return_inverse=True)
        first = torch.full((int(inverse.max()) + 1,), shared.numel(), dtype=torch.long)
        first.scatter_reduce_(0, inverse, torch.arange(shared.numel()), reduce="amin")
        keep[shared] = False
        keep[shared[first]] = True
    kept = keep.nonzero().squeeze(1)
    return X[:, kept], Y[:, kept], kept


def _hashed_rows(d: int, k: int = 32) -> torch.Tensor:
    """The rows of each state that ``_distinct_columns`` hashes: k of them, fixed by the width alone."""
    return torch.randperm(d, generator=torch.Generator().manual_seed(0))[:k].sort().values


def _column_hash(M: torch.Tensor) -> torch.Tensor:
    """An exact integer hash of each column's bits: the column read as 16-bit integers, times
    random weights below 2^16, summed in int64 (no term reaches 2^31, so no sum of fewer than 2^32
    of them overflows). Identical columns get identical hashes."""
    words = M.T.contiguous().view(torch.int16).to(torch.int64)  # (N, 16-bit words of one column)
    weights = torch.randint(1, 2**16, (words.shape[1],), generator=torch.Generator().manual_seed(0))
    return (words * weights).sum(1)


def _warnings(spectra: list[LayerSpectrum], d: int, n_tokens: int, distinct: int, settings: DMDSettings) -> list[str]:
    out, rank = [], settings.rank
    if n_tokens - distinct > 0.01 * n_tokens:
        out.append(f"{n_tokens - distinct} of {n_tokens} sampled token states were duplicates and were dropped")
    if settings.eta_tokens is not None and d < n_tokens < settings.eta_tokens:
        out.append(
            f"probe.tokens {n_tokens} is below the {settings.eta_tokens} token states the risk model was "
            "calibrated at: η_nl reads lower on fewer states (layer mean 0.33 at 1024 against 0.36 at "
            "2048, measured at d=512), and the risk and edge move with it"
        )
    if fits_exactly(distinct, d) and rank == "auto":
        out.append(
            f"{distinct} distinct token states for d={d}: spectra are estimated in the "
            f"{distinct - 1}-dim data subspace, where the fit is exact and η_nl undefined; raise "
            f"probe.tokens to at least {TOKENS_PER_WIDTH * d} for a measurement"
        )
    elif fits_exactly(distinct, d) and rank == "full":
        out.append(
            f"full DMD on {distinct} token states for d={d} has {d - distinct + 1} structural zero "
            f"eigenvalues: near-unit mass is capped at {(distinct - 1) / d:.2f}; prefer rank: auto"
        )
    defective = [i for i, s in enumerate(spectra) if not s.degenerate and math.isinf(s.kappa)]
    if defective:
        out.append(
            f"κ(V) is infinite (a defective operator: its eigenvectors do not span) in layer(s) {defective}; "
            "the κ aggregates leave them out"
        )
    degenerate = [i for i, s in enumerate(spectra) if s.degenerate]
    if degenerate:
        out.append(
            f"{len(degenerate)} near-identity block(s) {degenerate} excluded from the aggregates; "
            "re-profile after a few hundred training steps"
        )
    return out
