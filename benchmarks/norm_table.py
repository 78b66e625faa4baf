"""Reproduce the RKSP paper's Table 1 comparison across normalisations at initialisation.

Built-in GPT (4 blocks, d=64, 4 heads, context 32, init std 0.02), N = 2048 token states, five
init seeds; layer-mean M~1, M>1 and rho, with the ResDMD filter (rksp default) and without it.
Prints a Markdown table beside the paper's numbers.  Run: make bench-norms
"""

from __future__ import annotations

import statistics

import torch

from rksp_cli.screen import screen
from rksp_cli.spec import spec_from_dict

PAPER = {  # Table 1: M~1, M>1, rho
    "pre": (0.16, 0.54, 2.29),
    "post": (0.66, 0.31, 7.48),
    "rms": (0.16, 0.54, 2.28),
    "deepnorm": (0.00, 1.00, 3.94),
    "subln": (0.13, 0.54, 2.23),
    "none": (0.80, 0.19, 1.11),
}
SEEDS = range(5)


def _stat(values: list[float]) -> str:
    return f"{statistics.mean(values):.2f}±{statistics.pstdev(values):.2f}"


def main() -> None:
    torch.set_num_threads(1)
    print(
        "| norm | paper M≈1 | rksp M≈1 (ResDMD) | rksp M≈1 (no filter) "
        "| paper M>1 | rksp M>1 (no filter) | paper ρ | rksp ρ |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for norm, (p_near, p_exp, p_rho) in PAPER.items():
        cols: dict[str, list[float]] = {"near": [], "near_raw": [], "exp_raw": [], "rho": []}
        for seed in SEEDS:
            for tol, suffix in ((0.1, ""), (None, "_raw")):
                spec = spec_from_dict({"model": {"norm": norm}, "probe": {"seed": seed, "residual_tol": tol}})
                f = screen(spec).features
                cols["near" + suffix].append(f["near_unit_mass_mean"])
                if suffix:
                    cols["exp_raw"].append(f["expansive_mass_mean"])
                    cols["rho"].append(f["spectral_radius_mean"])
        print(
            f"| {norm} | {p_near:.2f} | {_stat(cols['near'])} | {_stat(cols['near_raw'])} | {p_exp:.2f} "
            f"| {_stat(cols['exp_raw'])} | {p_rho:.2f} | {_stat(cols['rho'])} |"
        )


if __name__ == "__main__":
    main()
