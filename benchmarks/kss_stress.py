"""KSS stress test: the no-normalisation GPT at learning rates where most baseline runs diverge.

Three arms, 24 runs each (4 learning rates x 6 seeds), 200 AdamW steps of the synthetic LM, the
paper's divergence label: baseline, KSS (alpha 0.15, every 10 steps, half the layers) and gradient
clipping at 1.0. Reports the divergence rate, the median final loss of the stable runs, and the
training time per step over all the arm's steps (the KSS overhead; the init screen excluded).
Run: make bench-kss (about 5 minutes on 2 cores).
"""

from __future__ import annotations

import statistics

import torch

from rksp_cli.probe import probe
from rksp_cli.spec import spec_from_dict

LRS = (0.012, 0.015, 0.02, 0.025)
SEEDS = range(6)
ARMS = {"baseline": {}, "KSS alpha 0.15": {"kss_alpha": 0.15}, "grad clip 1.0": {"grad_clip": 1.0}}


def main() -> None:
    torch.set_num_threads(1)
    print("| arm | diverged | median final loss (stable runs) | ms per step |")
    print("|---|---|---|---|")
    for arm, extra in ARMS.items():
        diverged, finals, seconds, steps = 0, [], 0.0, 0
        for lr in LRS:
            for seed in SEEDS:
                spec = spec_from_dict({
                    "model": {"norm": "none"},
                    "training": {"lr": lr, "steps": 200, **extra},
                    "probe": {"seed": seed},
                })  # fmt: skip
                result = probe(spec)
                diverged += result.diverged
                seconds += result.train_seconds
                steps += len(result.losses)
                if not result.diverged:
                    finals.append(result.losses[-1])
        n = len(LRS) * len(SEEDS)
        final = f"{statistics.median(finals):.3f}" if finals else "-"
        rate = f"{diverged}/{n} ({100 * diverged / n:.0f}%)"
        print(f"| {arm} | {rate} | {final} | {1000 * seconds / steps:.1f} |", flush=True)


if __name__ == "__main__":
    main()
