"""KSS benchmarks (issue 6): a divergence stress test and the maximum stable learning rate.

``stress``: the no-normalisation GPT at learning rates where most baseline runs diverge; 24 runs
per arm (4 learning rates x 6 seeds), 200 AdamW steps of the synthetic LM, the paper's divergence
label. Arms: baseline, KSS as published (alpha 0.15 every 10 steps on half the layers), KSS every
step (can the penalty act before a fast blow-up?), and gradient clipping at 1.0. Reports the
divergence rate, the median diverging step, the median final loss of the stable runs, and the
training time per step (the KSS overhead; init screen excluded). Run it on a quiet machine.

``max-lr``: for pre-LN, RMSNorm and no-norm, with and without KSS, the largest learning rate on a
x1.5 grid from 0.004 at which none of 4 seeds diverges (the RKSP paper's Table 5 criterion, <20%
diverged, at 4 seeds), scanning upwards and stopping at the first failing rate.

Run: make bench-kss (``python benchmarks/kss_stress.py [stress|max-lr]``; about 10 + 15 minutes on 2 cores).
"""

from __future__ import annotations

import statistics
import sys
from multiprocessing import get_context

import torch

from rksp_cli.probe import probe
from rksp_cli.spec import spec_from_dict

LRS = (0.012, 0.015, 0.02, 0.025)
SEEDS = range(6)
ARMS = {
    "baseline": {},
    "KSS alpha 0.15, every 10": {"kss_alpha": 0.15},
    "KSS alpha 0.15, every step": {"kss_alpha": 0.15, "kss_every": 1},
    "grad clip 1.0": {"grad_clip": 1.0},
}
MAX_LR_GRID = tuple(0.004 * 1.5**k for k in range(14))
MAX_LR_SEEDS = range(4)


def _run(norm: str, lr: float, seed: int, extra: dict) -> tuple[bool, int | None, float, float, int]:
    torch.set_num_threads(1)
    spec = spec_from_dict({
        "model": {"norm": norm},
        "training": {"lr": lr, "steps": 200, **extra},
        "probe": {"seed": seed},
    })  # fmt: skip
    r = probe(spec)
    return r.diverged, r.diverged_step, r.losses[-1], r.train_seconds, len(r.losses)


def stress() -> None:
    print("| arm | diverged | median diverging step | median final loss (stable runs) | ms per step |")
    print("|---|---|---|---|---|")
    for arm, extra in ARMS.items():
        runs = [_run("none", lr, seed, extra) for lr in LRS for seed in SEEDS]
        steps_at = [step for diverged, step, *_ in runs if diverged]
        finals = [final for diverged, _, final, *_ in runs if not diverged]
        ms = 1000 * sum(r[3] for r in runs) / sum(r[4] for r in runs)
        print(
            f"| {arm} | {len(steps_at)}/{len(runs)} ({100 * len(steps_at) / len(runs):.0f}%) "
            f"| {statistics.median(steps_at) if steps_at else '-'} "
            f"| {f'{statistics.median(finals):.3f}' if finals else '-'} | {ms:.1f} |",
            flush=True,
        )


def max_lr() -> None:
    print("| norm | max stable lr, AdamW | with KSS (alpha 0.15, every 10) | first failing lr: diverged / seeds |")
    print("|---|---|---|---|")
    with get_context("spawn").Pool(2) as pool:
        for norm in ("pre", "rms", "none"):
            cells = []
            for extra in ({}, {"kss_alpha": 0.15}):
                best, failing = None, "none up to the grid's end"
                for lr in MAX_LR_GRID:
                    runs = pool.starmap(_run, [(norm, lr, seed, extra) for seed in MAX_LR_SEEDS])
                    diverged = sum(r[0] for r in runs)
                    if diverged:
                        failing = f"{lr:.3g}: {diverged}/{len(runs)}"
                        break
                    best = lr
                label = f"{best:.3g}" if best else f"< {MAX_LR_GRID[0]}"
                cells.append((f">= {label}" if best == MAX_LR_GRID[-1] else label, failing))
            print(f"| {norm} | {cells[0][0]} | {cells[1][0]} | {cells[0][1]} / with KSS {cells[1][1]} |", flush=True)


if __name__ == "__main__":
    parts = sys.argv[1:] or ["stress", "max-lr"]
    for part in parts:
        {"stress": stress, "max-lr": max_lr}[part]()
