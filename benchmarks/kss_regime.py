"""KSS and the usual fixes in the slow-divergence regime (issue 15).

``regime``: the baseline of the RKSP paper's KSS stress setting, as far as the paper names it (no
normalisation, width 128, associative recall with sequence 64, vocabulary 256 and 4 pairs, AdamW
with warmup), over an lr grid, 4 seeds each: how often it diverges, and when. The setting the
arms use is the one where the baseline diverges in 40-80% of runs after warmup. Measured here
(README, "KSS results"): every run diverged at lr >= 0.005 (median step 142 at 0.005, 51 at
0.015) and none at 0.003, so the arms run at 0.0035-0.0045, across that edge.

``arms``: at least 24 runs per arm (lrs x seeds) in that setting: the baseline; KSS as published
(alpha 0.10 / 0.15 / 0.20, every 10 steps on half the layers) and its operator-norm variant
(``kss.py``, ``variant="growth"``, alpha 0.15); gradient clipping 0.5 / 1.0;
qk-layernorm; z-loss 1e-4; a 4x longer warmup; sigmaReparam on every linear weight. Per arm:
runs diverged, Fisher's exact p against the baseline (two-sided), median diverging step, final
accuracy of the runs that trained (mean and standard error), and time per training step as a
ratio to the baseline's, from ``overhead`` when it has been run (else from the arms' own runs,
whose times move with whatever else shares the machine over hours; ``time_source`` says which).
KSS alpha 0.015 on every step (the published alpha's total over 10 steps, spread out) tests a
hypothesis of the first pass: that KSS every 10 steps fails as a periodic kick. The last arm is
issue 15's "lr back-off driven by the spectra": every rksp monitor checks every 10 steps and each
alarm halves the lr (``training.guard: backoff``); its rows also say how many runs it acted on,
when it first did and how far it cut the lr, and it runs again on controls, 4 seeds at lr 0.003
where the baseline trained: a screen recommends it only if it acted on none of them.

``arms --rerun TAG`` runs the baseline again into arms/baseline@TAG.parquet (on another machine:
two CPUs round differently, and at this edge that changes which runs diverge) and gives every
arm's Fisher p against it too.

``learning``: nothing learns the task in the arms' 1000 steps, so "final accuracy no worse" cannot
separate them there. The baseline and each arm that passed the divergence bar run at lr 0.003,
where the baseline does not diverge, for 3000 steps, 2 seeds; an arm that learns less than the
baseline there (beyond 2 standard errors) is not shipped.

``overhead``: every arm's time per step measured in one process, 1 thread, each arm between two
baseline runs (30 training steps each at the arms' lowest lr, inside warmup, 3 rounds; about 20
minutes): per arm the median over rounds of its ratio to the mean of its two neighbouring
baselines, with the range, so that the machine's drift cancels.

``maxlr``: issue 15's second bar. For no-norm, pre-LN and RMSNorm in the same setting, the
largest lr of a x2 grid (0.0025 ... 1.28) at which fewer than 20% of 4 seeds diverge or stall, with and
without each prevention the arms ship (every arm that passed ``rksp_cli.risk.preventions``),
found by bisection over the grid (it assumes divergence is monotone in lr; 4 levels per search
instead of 10). Each level is its own sweep, kept as benchmarks/results/kss/maxlr/<...>.parquet.

``mechanism``: baseline and KSS (alpha 0.15) at lr 0.004, seeds 0-3, with the screen's spectra
tracked every 50 steps (``training.track_every``) and KSS's own soft near-unit mass: does KSS move
the near-unit mass (the paper: 0.85 -> 0.58), and does the movement come before survival?

Every probe runs through the sweep machinery (journals under benchmarks/results/kss/, so a rerun
resumes; each completed arm is kept as benchmarks/results/kss/arms/<arm>.parquet, and the results
cover the arms completed so far). Writes benchmarks/results/kss.json and prints Markdown; ``arms`` and
``learning`` also write rksp_cli/preventions.json, from which ``rksp screen`` recommends a prevention for a model of the
regime's normalisation only when it measurably helped (``rksp_cli.risk.preventions``).
Run: python benchmarks/kss_regime.py [regime|arms|overhead|learning|maxlr|mechanism] (make bench-kss-regime)
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from statistics import median
from typing import Any

import pandas as pd
import torch
from scipy.stats import fisher_exact

from rksp_cli.files import atomic_path
from rksp_cli.probe import probe
from rksp_cli.risk.preventions import helpful
from rksp_cli.spec import ScreenSpec, set_field, spec_from_dict
from rksp_cli.sweep import Point, run_sweep

HERE = Path(__file__).parent / "results"
RESULTS = HERE / "kss.json"
PREVENTIONS = Path(__file__).parent.parent / "rksp_cli" / "preventions.json"  # what `rksp screen` recommends
REGIME = {  # the paper's stress setting, as far as it names it
    "model": {"norm": "none", "d_model": 128, "n_layers": 4, "n_heads": 4, "seq_len": 64, "vocab_size": 256},
    "training": {"task": "assoc_recall", "warmup_steps": 100, "batch_size": 32, "steps": 1000},
}
REGIME_LRS = (0.003, 0.005, 0.0075, 0.01, 0.015)
REGIME_SEEDS = range(4)
ARMS: dict[str, dict[str, Any]] = {  # in the order they run: the likeliest to help first after KSS
    "baseline": {},
    "KSS alpha 0.10": {"training.kss_alpha": 0.10},
    "KSS alpha 0.15": {"training.kss_alpha": 0.15},
    "KSS growth 0.15": {"training.kss_alpha": 0.15, "training.kss_variant": "growth"},
    "clip 1.0": {"training.grad_clip": 1.0},
    "sigmaReparam": {"model.sigma_reparam": True},
    "qk-layernorm": {"model.qk_norm": True},
    "z-loss 1e-4": {"training.z_loss": 1e-4},
    "warmup x4": {"training.warmup_steps": 400},
    "clip 0.5": {"training.grad_clip": 0.5},
    "KSS alpha 0.20": {"training.kss_alpha": 0.20},
    "KSS alpha 0.015 every step": {"training.kss_alpha": 0.015, "training.kss_every": 1},
    # issue 15's "lr back-off driven by the spectra": every rksp monitor (spectral alignment among
    # them) checks every 10 steps and each alarm halves the lr (Guard); at the default 50 steps none
    # alarmed at all in 1000 steps (seeds 0-2 at lr 0.004, one diverging at step 415)
    "monitor back-off": {"training.guard": "backoff", "training.guard_every": 10},
}


OVERHEAD = "overhead (interleaved)"  # where an arm's time ratio came from


def _spec(lr: float, seed: int, changes: dict[str, Any]) -> ScreenSpec:
    raw = json.loads(json.dumps(REGIME))
    set_field(raw, "training.lr", lr)
    set_field(raw, "probe.seed", seed)
    for name, value in changes.items():
        set_field(raw, name, value)
    return spec_from_dict(raw, source="kss benchmark")


def _point(lr: float, seed: int, changes: dict[str, Any]) -> Point:
    return Point.of(_spec(lr, seed, changes))


def _run(points: list[Point], name: str, workers: int) -> pd.DataFrame:
    """The runs of ``points``, probed through a sweep whose journal resumes an interrupted run.

    A completed sweep's export is tracked, but its journal is not (it is a local SQLite file), so a
    fresh checkout would probe every finished arm and level again: when the tracked export already
    holds every point without an error, it is the result."""
    out = HERE / "kss" / f"{name}.parquet"
    keys = {p.key for p in points}
    if out.is_file() and not out.with_name(out.name + ".journal").exists():
        done = pd.read_parquet(out)
        done = done[done["key"].isin(keys)]
        if set(done["key"]) == keys and done["error"].isna().all():
            return done
    out.parent.mkdir(parents=True, exist_ok=True)
    frame = run_sweep(points, out, probe=True, workers=workers)
    failed = frame["error"].notna().sum()
    if failed:
        raise SystemExit(f"{failed} probes failed; see benchmarks/results/kss/{name}.parquet")
    return frame[frame["key"].isin(keys)]


def _summary(runs: pd.DataFrame) -> dict[str, Any]:
    diverged = runs["label"].astype(bool)
    stalled = runs["label_stall"].fillna(0).astype(bool) & ~diverged
    steps = runs.loc[diverged, "diverged_step"]
    accuracy = runs.loc[~diverged, "final_accuracy"]
    ms = 1000 * runs["train_seconds"] / runs["steps_run"]
    return {
        "runs": len(runs),
        "diverged": int(diverged.sum()),
        "stalled": int(stalled.sum()),  # trained to nothing without exploding (the probe's label_stall)
        "median_diverged_step": float(steps.median()) if len(steps) else None,
        "final_accuracy": float(accuracy.mean()) if len(accuracy) else None,
        # its standard error (0 from a single trained run: a point comparison)
        "final_accuracy_se": float(accuracy.sem()) if len(accuracy) > 1 else 0.0,
        "ms_per_step": float(ms.median()),
        **_guarded(runs),
    }


def _guarded(runs: pd.DataFrame) -> dict[str, Any]:
    """For an arm with ``training.guard``: how many runs it acted on, its first action's step and the
    lr's final multiplier (medians over the runs it acted on); {} for other arms."""
    if "config.training.guard" not in runs or runs["config.training.guard"].isna().all():
        return {}
    acted = [json.loads(a) for a in runs["guard_actions"].dropna()] if "guard_actions" in runs else []
    return {
        "guard_acted": len(acted),
        "guard_first_step": float(median(a[0]["step"] for a in acted)) if acted else None,
        "guard_lr_scale": float(median(a[-1]["lr_scale"] for a in acted)) if acted else None,
    }


def _controls(changes: dict[str, Any]) -> list[Point]:
    """A guarded arm at the regime's stable lr, where the baseline did not diverge: what the guard
    does to runs that need no help (the cost a divergence count cannot show)."""
    return [_point(REGIME_LRS[0], s, changes) for s in REGIME_SEEDS]


def regime(workers: int) -> list[dict[str, Any]]:
    points = {(lr, s): _point(lr, s, {}) for lr in REGIME_LRS for s in REGIME_SEEDS}
    frame = _run(list(points.values()), "regime", workers)
    rows = []
    for lr in REGIME_LRS:
        keys = {points[(lr, s)].key for s in REGIME_SEEDS}
        rows.append({"lr": lr, **_summary(frame[frame["key"].isin(keys)])})
    return rows


def arms(
    workers: int,
    lrs: list[float],
    seeds: list[int],
    only: list[str] | None = None,
    timing: dict | None = None,
    rerun: str | None = None,
) -> list[dict[str, Any]]:
    """Each arm is its own sweep, exported to benchmarks/results/kss/arms/<arm>.parquet (tracked) when
    it completes, so an interrupted benchmark loses at most the arm in progress. Rows come from every
    completed arm on disk with this setting, not only those run now; ``only`` runs a subset.
    ``timing``: ``overhead``'s results, the source of each arm's time ratio where it has one.
    ``rerun``: run the baseline again, the same points, into arms/baseline@<rerun>.parquet (e.g. on
    another machine: two CPUs round differently, and at this edge that changes which runs diverge);
    every arm's row then also gets its Fisher p against each such re-run (``fisher_p_reruns``)."""
    if rerun is not None:  # the baseline again, nothing else
        _run([_point(lr, s, {}) for lr in lrs for s in seeds], f"arms/baseline@{rerun}", workers)
    to_run = [] if rerun is not None else only or list(ARMS)
    for arm in to_run:
        _run([_point(lr, s, ARMS[arm]) for lr in lrs for s in seeds], f"arms/{_slug(arm)}", workers)
        if "training.guard" in ARMS[arm]:
            _run(_controls(ARMS[arm]), f"arms/{_slug(arm)}_controls", workers)
    rows = []
    for arm, changes in ARMS.items():
        path = HERE / "kss" / "arms" / f"{_slug(arm)}.parquet"
        keys = {_point(lr, s, changes).key for lr in lrs for s in seeds}
        done = pd.read_parquet(path) if path.is_file() else None
        if done is None or not keys <= set(done["key"]):
            continue  # not run (completely) at this setting
        rows.append({"arm": arm, "changes": changes, **_summary(done[done["key"].isin(keys)])})
        controls = HERE / "kss" / "arms" / f"{_slug(arm)}_controls.parquet"
        if "training.guard" in changes and controls.is_file():
            rows[-1]["controls"] = {"lr": REGIME_LRS[0], **_summary(pd.read_parquet(controls))}
    if not rows or rows[0]["arm"] != "baseline":
        raise SystemExit("the baseline arm has not been run at this setting; run it first (--arms baseline)")
    base = rows[0]
    keys = {_point(lr, s, {}).key for lr in lrs for s in seeds}
    reruns = {}
    for path in sorted((HERE / "kss" / "arms").glob("baseline@*.parquet")):
        again = pd.read_parquet(path)
        if keys <= set(again["key"]):
            reruns[path.stem.split("@", 1)[1]] = _summary(again[again["key"].isin(keys)])
    for row in rows:
        row["fisher_p"] = _fisher(row, base)
        if reruns:
            row["fisher_p_reruns"] = {tag: _fisher(row, again) for tag, again in reruns.items()}
        if timing and row["arm"] in timing:
            row["time_ratio"], row["time_source"] = timing[row["arm"]]["ratio"], OVERHEAD
        else:
            row["time_ratio"], row["time_source"] = row["ms_per_step"] / base["ms_per_step"], "arm runs"
    if reruns:
        base["reruns"] = reruns
    return rows


def _fisher(arm: dict[str, Any], base: dict[str, Any]) -> float:
    """Fisher's exact p (two-sided) of the arm's divergences against the baseline's."""
    table = [[arm["diverged"], arm["runs"] - arm["diverged"]], [base["diverged"], base["runs"] - base["diverged"]]]
    return float(fisher_exact(table)[1])


# An arm "learned" the recall task when its trained runs recall at least this multiple of chance
# (1 / the number of values, half the vocabulary). Design choice: below it, "final accuracy no
# worse" compares noise around chance and cannot tell a prevention that stops learning.
LEARNED_OVER_CHANCE = 10


def unlearned(rows: list[dict[str, Any]]) -> str | None:
    """The caveat the arms carry when no arm learned the task, else None."""
    chance = 2 / REGIME["model"]["vocab_size"]
    best = max((r["final_accuracy"] for r in rows if r["final_accuracy"] is not None), default=0.0)
    if best >= LEARNED_OVER_CHANCE * chance:
        return None
    head = (
        f"no arm learned the benchmark's task in {REGIME['training']['steps']} steps (final accuracy at most "
        f"{best:.3f}, chance {chance:.3f})"
    )
    checked = [r["learning"] for r in rows if "learning" in r]
    if checked:  # the learning check compared what the passing arms learn, on few seeds
        c = checked[0]
        return (f"{head}; what the arms that passed learn was compared over {c['steps']} steps at lr "
                f"{c['lr']:g} on {c['runs']} seeds only")  # fmt: skip
    return f"{head}, so the arms are compared on divergence, not on what a run learns"


OVERHEAD_STEPS, OVERHEAD_ROUNDS = 30, 3


def overhead(lr: float, only: list[str] | None = None) -> dict[str, dict[str, float]]:
    """Per arm (``only``: a subset): ms per training step and its ratio to the baseline's, median over
    rounds, 1 thread.

    The machine's speed drifts by 10% within minutes (a first version, arms timed back to back in
    a fixed order, put identical-cost arms at 0.91-0.98x). So each round runs the baseline between
    every two arms and times each arm against the mean of the baselines just before and after it."""
    torch.set_num_threads(1)

    def ms_per_step(arm: str) -> float:
        result = probe(_spec(lr, 0, {**ARMS[arm], "training.steps": OVERHEAD_STEPS}))
        if result.diverged:
            raise SystemExit(f"overhead: {arm} diverged at lr {lr:g}; time it at a lower lr")
        return 1000 * result.train_seconds / len(result.losses)

    others = [arm for arm in only or ARMS if arm != "baseline"]
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    ratios: dict[str, list[float]] = {arm: [] for arm in others}
    beside: dict[str, list[float]] = {arm: [] for arm in others}  # the baselines each arm was timed against
    for round_ in range(OVERHEAD_ROUNDS):
        before = ms_per_step("baseline")
        times["baseline"].append(before)
        for arm in others:
            ms, after = ms_per_step(arm), ms_per_step("baseline")
            times[arm].append(ms)
            times["baseline"].append(after)
            ratios[arm].append(ms / ((before + after) / 2))
            beside[arm].append((before + after) / 2)
            print(f"overhead round {round_ + 1}/{OVERHEAD_ROUNDS}: {arm} {ms:.0f} ms/step, {ratios[arm][-1]:.2f}x")
            before = after
    out = {"baseline": {"ms_per_step": median(times["baseline"]), "ratio": 1.0, "ratio_min": 1.0, "ratio_max": 1.0}}
    for arm in others:
        out[arm] = {"ms_per_step": median(times[arm]), "baseline_ms_per_step": median(beside[arm]),
                    "ratio": median(ratios[arm]), "ratio_min": min(ratios[arm]),
                    "ratio_max": max(ratios[arm])}  # fmt: skip
    return out


MAXLR_GRID = tuple(0.0025 * 2**k for k in range(10))
MAXLR_FAMILIES = ("none", "pre", "rms")
MAXLR_SEEDS = range(4)
# the issue's definition, a stable lr diverges in fewer than 20% of runs, with a stall counted as a
# failure: pre-LN at 0.32 trains to nothing in every run without exploding (issue 14: "diverged"
# in practice also means a run that stalls at a high loss)
STABLE_BELOW = 0.2


def max_stable_lr(workers: int, preventions: list[dict[str, Any]]) -> dict[str, Any]:
    """Per family, the largest stable grid lr without and with each of ``preventions`` ({"arm", "changes"})."""
    out = {}
    for family in MAXLR_FAMILIES:
        out[family] = {}
        for arm, changes in (("baseline", {}), *((p["arm"], p["changes"]) for p in preventions)):
            out[family][arm] = _bisect(family, arm, {"model.norm": family, **changes}, workers)
    return out


def _bisect(family: str, arm: str, changes: dict[str, Any], workers: int) -> dict[str, Any]:
    """The largest stable index of MAXLR_GRID: lo is stable (or -1), hi unstable (or len)."""
    lo, hi, levels = -1, len(MAXLR_GRID), []
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lr = MAXLR_GRID[mid]
        points = [_point(lr, s, changes) for s in MAXLR_SEEDS]
        runs = _run(points, f"maxlr/{family}_{_slug(arm)}_{lr:g}", workers)
        summary = _summary(runs)
        levels.append(
            {"lr": lr, "diverged": summary["diverged"], "stalled": summary["stalled"], "runs": summary["runs"]}
        )
        if (summary["diverged"] + summary["stalled"]) / summary["runs"] < STABLE_BELOW:
            lo = mid
        else:
            hi = mid
    return {
        "max_stable_lr": MAXLR_GRID[lo] if lo >= 0 else None,  # None: even the grid's lowest lr diverged
        "first_unstable_lr": MAXLR_GRID[hi] if hi < len(MAXLR_GRID) else None,  # None: stable to the end
        "levels": levels,
    }


def shipped_preventions(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The arms the screen names for the regime's family, best first, from the arms' results: the
    screen recommends the first and mentions the others, so each must keep every family's stable lr."""
    passed = helpful(results.get("arms", [])) if results.get("arms") else []
    if not passed:
        raise SystemExit("no arm passed the prevention bar (run `arms` first): there is no shipped prevention to test")
    return [{"arm": r["arm"], "changes": ARMS[r["arm"]]} for r in passed]


def _slug(arm: str) -> str:
    return arm.replace(" ", "_").replace(".", "")


# Nothing learns the recall task in the arms' 1000 steps; at the regime's stable lr the baseline
# starts to by 3000 (accuracy 0.05-0.08 on seeds 0-1, chance 0.008). Two seeds: 8 runs of about
# 8 minutes for the baseline and three preventions, the most this check could afford.
LEARNING_STEPS, LEARNING_SEEDS = 3000, range(2)


def learning(workers: int, candidates: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Does a prevention cost learning? The baseline and each of ``candidates`` (the arms that passed
    the divergence bar) at lr 0.003, where the baseline does not diverge, for LEARNING_STEPS steps:
    per arm, the final accuracy (mean, standard error) that ``preventions.helpful`` holds against
    the baseline's, as it does the arms' own."""
    arms = [("baseline", {}), *((c["arm"], c["changes"]) for c in candidates)]
    points = {arm: [_point(REGIME_LRS[0], s, {**changes, "training.steps": LEARNING_STEPS}) for s in LEARNING_SEEDS]
              for arm, changes in arms}  # fmt: skip
    frame = _run([p for ps in points.values() for p in ps], "learning", workers)
    setting = {"lr": REGIME_LRS[0], "steps": LEARNING_STEPS}
    return {arm: setting | _summary(frame[frame["key"].isin({p.key for p in ps})]) for arm, ps in points.items()}


def _with_learning(rows: list[dict[str, Any]], learned: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [r | ({"learning": learned[r["arm"]]} if r["arm"] in learned else {}) for r in rows]


def _ship(rows: list[dict[str, Any]], setting: dict[str, Any]) -> str | None:
    """Write rksp_cli/preventions.json, what the screen recommends from; returns the caveat it carries."""
    shipped = {"source": "benchmarks/kss_regime.py arms and learning", "setting": setting,
               "families": {REGIME["model"]["norm"]: rows}}  # fmt: skip
    if caveat := unlearned(rows):
        shipped["caveat"] = caveat
    with atomic_path(PREVENTIONS) as tmp:
        tmp.write_text(json.dumps(shipped, indent=1))
    return caveat


def mechanism(workers: int) -> list[dict[str, Any]]:
    arms = {"baseline": {}, "KSS alpha 0.15": {"training.kss_alpha": 0.15}}
    points = {(arm, s): _point(0.004, s, {**changes, "training.track_every": 50}) for arm, changes in arms.items()
              for s in range(4)}  # fmt: skip
    frame = _run(list(points.values()), "mechanism", workers).set_index("key")
    rows = []
    for (arm, seed), point in points.items():
        run = frame.loc[point.key]
        track = json.loads(run["trajectory"])
        rows.append({"arm": arm, "seed": seed, "diverged_step": None if not run["label"] else int(run["diverged_step"]),
                     "trajectory": track})  # fmt: skip
    return rows


def markdown(results: dict[str, Any]) -> str:
    def f(x: float | None, fmt: str) -> str:
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)

    lines = []
    if "regime" in results:
        lines += ["| lr | diverged | median diverging step | final accuracy (trained runs) | ms per step |"]
        lines += ["|---|---|---|---|---|"]
        for r in results["regime"]:
            lines.append(f"| {r['lr']:g} | {r['diverged']}/{r['runs']} | {f(r['median_diverged_step'], '.0f')} "
                         f"| {f(r['final_accuracy'], '.3f')} | {r['ms_per_step']:.1f} |")  # fmt: skip
        lines.append("")
    for r in results.get("mechanism", []):
        first, last = r["trajectory"][0], r["trajectory"][-1]
        outcome = "trained" if r["diverged_step"] is None else f"diverged at {r['diverged_step']}"
        lines.append(f"{r['arm']}, seed {r['seed']}: M≈1 {first['near_unit_mass_mean']:.2f} -> "
                     f"{last['near_unit_mass_mean']:.2f} by step {last['step']:.0f}; {outcome}")  # fmt: skip
    if "max_stable_lr" in results:  # "+": stable to the grid's end
        table = results["max_stable_lr"]
        names = list(next(iter(table.values())))
        lines += ["| norm | " + " | ".join(f"max stable lr, {arm}" for arm in names) + " |"]
        lines += ["|---" * (len(names) + 1) + "|"]
        for family, arms in table.items():
            cells = [
                f(a["max_stable_lr"], "g") + ("+" if a["first_unstable_lr"] is None else "") for a in arms.values()
            ]
            lines.append(f"| {family} | " + " | ".join(cells) + " |")
        lines.append("")
    if "arms" in results:
        lines += ["| arm | diverged | Fisher p vs baseline | median diverging step | final accuracy | time/step |"]
        lines += ["|---|---|---|---|---|---|"]
        for r in results["arms"]:
            source = "" if r.get("time_source") == OVERHEAD else " (arm runs)"
            lines.append(f"| {r['arm']} | {r['diverged']}/{r['runs']} | {r['fisher_p']:.3g} "
                         f"| {f(r['median_diverged_step'], '.0f')} | {f(r['final_accuracy'], '.3f')} "
                         f"| {r['time_ratio']:.2f}x{source} |")  # fmt: skip
        for r in results["arms"]:
            if "guard_acted" in r:
                lines.append(f"\n{r['arm']}: acted on {r['guard_acted']}/{r['runs']} runs, first at step "
                             f"{f(r['guard_first_step'], '.0f')} (median), lr x{f(r['guard_lr_scale'], 'g')} "
                             "at the end (median)")  # fmt: skip
            for tag, again in r.get("reruns", {}).items():
                lines.append(f"\n{r['arm']} re-run as @{tag}: {again['diverged']}/{again['runs']} diverged; "
                             "every arm against it, Fisher p: " + ", ".join(
                                 f"{a['arm']} {a['fisher_p_reruns'][tag]:.2g}" for a in results["arms"]))  # fmt: skip
            if "controls" in r:
                c = r["controls"]
                lines.append(f"{r['arm']} at lr {c['lr']:g}, where the baseline trained: acted on "
                             f"{c.get('guard_acted', 0)}/{c['runs']} runs, lr x{f(c.get('guard_lr_scale'), 'g')} "
                             f"at the end (median), {c['diverged']} diverged")  # fmt: skip
        lines.append("")
    if "overhead" in results:
        lines += ["| arm | ms per step (1 thread) | baselines beside it | ratio to baseline (range over rounds) |"]
        lines += ["|---|---|---|---|"]
        for arm, r in results["overhead"].items():
            spread = f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f}"
            base = f(r.get("baseline_ms_per_step"), ".0f")
            lines.append(f"| {arm} | {r['ms_per_step']:.0f} | {base} | {r['ratio']:.2f}x ({spread}) |")
    return "\n".join(lines)


def _results() -> dict[str, Any]:
    return json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}


def _only(names: str, parser: argparse.ArgumentParser) -> list[str] | None:
    """``--arms``: the arms named (None: every arm); an unknown name is the parser's error."""
    only = [a.strip() for a in names.split(",") if a.strip()] or None
    unknown = sorted(set(only or []) - set(ARMS))
    if unknown:
        parser.error(f"--arms: unknown arm(s) {', '.join(unknown)}; choose from {', '.join(ARMS)}")
    return only


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=["regime", "arms", "overhead", "learning", "maxlr", "mechanism"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lrs", default="0.0035,0.004,0.0045", help="arms: lrs (comma-separated)")
    parser.add_argument("--seeds", type=int, default=8, help="arms: seeds per lr")
    parser.add_argument("--rerun", default=None, help="arms: run the baseline again under this tag (another machine)")
    parser.add_argument("--arms", default="", help=f"arms, overhead: a subset, comma-separated ({', '.join(ARMS)})")
    args = parser.parse_args()
    if args.rerun is not None and not re.fullmatch(r"[A-Za-z0-9_-]+", args.rerun):
        parser.error(f"--rerun: a tag of letters, digits, '-' and '_' (it names a file), got {args.rerun!r}")
    results = _results()
    new: dict[str, Any] = {}
    if args.part == "regime":
        new["regime"] = regime(args.workers)
    elif args.part == "mechanism":
        new["mechanism"] = mechanism(args.workers)
    elif args.part == "overhead":
        lrs = [float(x) for x in args.lrs.split(",")]
        # each arm is timed against the baselines beside it, so a subset's ratios join the others'
        # (the baseline's own ms per step stays the full run's, when there was one)
        only = _only(args.arms, parser)
        new["overhead"] = overhead(min(lrs), only)
        if only and "baseline" in results.get("overhead", {}):
            new["overhead"] = results["overhead"] | {k: v for k, v in new["overhead"].items() if k != "baseline"}
        new["overhead_setting"] = {"lr": min(lrs), "steps": OVERHEAD_STEPS, "rounds": OVERHEAD_ROUNDS, "threads": 1}
    elif args.part == "learning":
        if "arms" not in results:
            raise SystemExit("run `arms` first: the learning check is of the arms that passed")
        rows = [{k: v for k, v in r.items() if k != "learning"} for r in results["arms"]]
        new["learning"] = learning(args.workers, shipped_preventions({"arms": rows}))  # passed without it
        new["arms"] = _with_learning(rows, new["learning"])
        new["arms_caveat"] = _ship(new["arms"], results["arms_setting"])
    elif args.part == "maxlr":
        preventions = shipped_preventions(results)
        new["max_stable_lr"] = max_stable_lr(args.workers, preventions)
        new["max_stable_lr_setting"] = {"grid": list(MAXLR_GRID), "seeds": len(MAXLR_SEEDS),
                                        "stable_below": STABLE_BELOW, "preventions": preventions}  # fmt: skip
    else:
        lrs = [float(x) for x in args.lrs.split(",")]
        only = _only(args.arms, parser)
        rows = arms(args.workers, lrs, list(range(args.seeds)), only, results.get("overhead"), args.rerun)
        new["arms"] = _with_learning(rows, results.get("learning", {}))
        new["arms_setting"] = {"base": REGIME, "lrs": lrs, "seeds": args.seeds}
        new["arms_caveat"] = _ship(new["arms"], new["arms_setting"])
    results = _results() | new  # re-read: another part may have written its keys while this one ran
    with atomic_path(RESULTS) as tmp:
        tmp.write_text(json.dumps(results, indent=1))
    print(markdown(results))


if __name__ == "__main__":
    main()
