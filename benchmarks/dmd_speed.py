"""Per-layer DMD time at d = 768, N = 2048 (GPT-2 small's width), against PyDMD on the same matrices.

Snapshots are block-like (Y = X + tanh(B X)) in float64, and the same rounded to float32, the
precision a screen reads the residual stream in (its Gram matrix and products are then formed in
float32). rksp's `layer_spectrum` does the screen's profile: whitening, DMD, eigenvalues, eta_nl
and masses (the default), and with ``kappa=True`` also the eigenvectors and kappa(V). PyDMD's
`DMD(svd_rank=-1)` on the same whitened snapshots computes eigenvalues and modes. Medians of 5 runs
per thread count; the eigenvalues of both are compared.
Run: make bench-dmd
(PyDMD is a benchmark-only dependency: pip install pydmd).
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from rksp_cli.koopman import DMDSettings, layer_spectrum, whiten

D, N, REPEATS = 768, 2048, 5


def snapshots() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    X = torch.randn(D, N, generator=g, dtype=torch.float64)
    B = torch.randn(D, D, generator=g, dtype=torch.float64) / D**0.5
    return X, X + torch.tanh(B @ X)


def median_time(fn) -> float:
    times = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    X, Y = snapshots()
    Xw, Yw, _, _ = whiten(X, Y, DMDSettings().eps)
    try:
        from pydmd import DMD
    except ImportError:
        DMD = None
    print(f"d = {D}, N = {N}, float64, median of {REPEATS}")
    for threads in (1, 2):
        torch.set_num_threads(threads)
        ours = median_time(lambda: layer_spectrum(X, Y))
        single = median_time(lambda: layer_spectrum(X.float(), Y.float()))
        with_kappa = median_time(lambda: layer_spectrum(X, Y, DMDSettings(kappa=True)))
        line = f"  threads={threads}: rksp profile {ours:.3f} s (float32 states {single:.3f} s)"
        line += f", with kappa(V) {with_kappa:.3f} s"
        if DMD is not None:
            from threadpoolctl import threadpool_limits

            with threadpool_limits(threads):
                theirs = median_time(lambda: DMD(svd_rank=-1).fit(Xw.numpy(), Yw.numpy()))
            line += f"; PyDMD eigenvalues+modes {theirs:.3f} s; ratio rksp/PyDMD {ours / theirs:.2f}"
        print(line)
    if DMD is not None:
        lam = layer_spectrum(X, Y).eigenvalues.numpy()
        ref = DMD(svd_rank=-1).fit(Xw.numpy(), Yw.numpy()).eigs
        dist = np.abs(lam[:, None] - ref[None, :])
        gap = max(dist.min(0).max(), dist.min(1).max())
        print(f"  eigenvalues: {lam.size} vs {ref.size}; largest distance to the nearest match {gap:.2e}")


if __name__ == "__main__":
    main()
