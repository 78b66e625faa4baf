"""Ground truth for the estimator: snapshot pairs whose operator spectrum is known, at any width.

A k-dimensional linear system with chosen eigenvalues, plus a controlled nonlinearity and noise,
embedded in d dimensions by a random orthonormal map (issue 13, item 2):

    z' = A z + eta * (z^2 - 1) + sigma * xi,     z, xi ~ N(0, I_k)
    X = E z,  Y = E z'                           E: d x k, orthonormal columns

* A = Q blockdiag(eigenvalues) Q^T with Q orthogonal: a normal operator (kappa(V) = 1) whose 32
  eigenvalues (9 contractive, 4 in the gap, 10 near-unit, 9 expansive) sit well inside the bands
  (|lambda| 0.3-0.6, 0.85, 0.97-0.99, 1.2-1.3), so round-off or sampling cannot move one across
  an edge: the known masses are exact counts.
* The nonlinearity z^2 - 1 is uncorrelated with z for Gaussian z (E[z_i (z_j^2 - 1)] = 0), so the
  best linear operator, which DMD estimates, is exactly A; it shows up in eta_nl instead.
* Noise enters inside the system (xi); the d - k ambient directions carry nothing, which is the
  case the data-subspace estimator handles exactly (its rank cut finds k at every d). Ambient noise
  in all d directions would add d - k eigenvalues that belong to no operator; see the README.

Run: make bench-known-spectrum (d = 64, 256, 1024, 4096 at the default N = 2048, without and with
1% ambient noise, the default estimator against rank 32; about half a minute). The test suite
checks d = 64 and 256 (tests/test_koopman.py).
"""

from __future__ import annotations

import math

import torch

from rksp_cli.koopman import DMDSettings, layer_spectrum, spectral_masses

# 32 eigenvalues: (modulus, angle) pairs give complex-conjugate pairs, angle 0 a real eigenvalue
CONTRACTIVE = [(0.3, 0.0), (0.45, 0.0), (0.5, 0.4), (0.6, 0.0), (0.55, 1.0), (0.4, 2.0)]  # 9 eigenvalues
GAP = [(0.85, 0.0), (0.85, 0.2), (0.85, 0.0)]  # 4
NEAR_UNIT = [(0.97, 0.0), (0.98, 0.1), (0.99, 0.0), (0.975, 0.3), (0.97, 0.0), (0.985, 0.05), (0.98, 0.0)]  # 10
EXPANSIVE = [(1.2, 0.0), (1.25, 0.1), (1.3, 0.0), (1.22, 0.5), (1.28, 0.0), (1.27, 0.2)]  # 9
EIGENVALUES = [*CONTRACTIVE, *GAP, *NEAR_UNIT, *EXPANSIVE]


def known_operator() -> tuple[torch.Tensor, torch.Tensor]:
    """(A, its eigenvalues): a real normal 32 x 32 operator with the eigenvalues above."""
    blocks, eigenvalues = [], []
    for modulus, angle in EIGENVALUES:
        if angle == 0.0:
            blocks.append(torch.tensor([[modulus]], dtype=torch.float64))
            eigenvalues.append(complex(modulus, 0.0))
        else:
            c, s = modulus * math.cos(angle), modulus * math.sin(angle)
            blocks.append(torch.tensor([[c, -s], [s, c]], dtype=torch.float64))
            eigenvalues += [complex(c, s), complex(c, -s)]
    L = torch.block_diag(*blocks)
    Q = torch.linalg.qr(torch.randn(L.shape[0], L.shape[0], generator=torch.Generator().manual_seed(0),
                                    dtype=torch.float64)).Q  # fmt: skip
    return Q @ L @ Q.T, torch.tensor(eigenvalues, dtype=torch.complex128)


def snapshots(d: int, n: int = 2048, eta: float = 0.3, sigma: float = 0.1, ambient: float = 0.0, seed: int = 0):
    """(X, Y) of shape (d, n) from the embedded system; ``eta`` and ``sigma`` as in the docstring,
    ``ambient``: the std of independent noise added to X and Y in all d directions."""
    A, _ = known_operator()
    k = A.shape[0]
    if d < k:
        raise ValueError(f"the system has {k} dimensions; d must be at least that")
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(k, n, generator=g, dtype=torch.float64)
    z_next = A @ z + eta * (z.square() - 1) + sigma * torch.randn(k, n, generator=g, dtype=torch.float64)
    E = torch.linalg.qr(torch.randn(d, k, generator=g, dtype=torch.float64)).Q
    noise = [ambient * torch.randn(d, n, generator=g, dtype=torch.float64) for _ in range(2)]
    return E @ z + noise[0], E @ z_next + noise[1]


def known_masses() -> dict[str, float]:
    return spectral_masses(known_operator()[1])


def recovery(d: int, n: int = 2048, settings: DMDSettings | None = None, ambient: float = 0.0) -> dict[str, float]:
    """The largest error of any mass, the estimator's eigenvalue count and eta_nl, at width d."""
    spectrum = layer_spectrum(*snapshots(d, n, ambient=ambient), settings or DMDSettings())
    truth = known_masses()
    error = max(abs(getattr(spectrum, name) - value) for name, value in truth.items())
    return {"d": d, "max_mass_error": error, "eigenvalues": spectrum.eigenvalues.numel(), "eta_nl": spectrum.eta_nl}


def main() -> None:
    torch.set_num_threads(2)
    print("known masses:", {k: round(v, 4) for k, v in known_masses().items()})
    print("| d | ambient noise | estimator | max mass error | eigenvalues | η_nl |")
    print("|---|---|---|---|---|---|")
    for ambient in (0.0, 0.01):
        for name, settings in (("auto", DMDSettings()), ("rank 32", DMDSettings(rank=32))):
            for d in (64, 256, 1024, 4096):
                r = recovery(d, settings=settings, ambient=ambient)
                cells = (d, ambient, name, f"{r['max_mass_error']:.4f}", r["eigenvalues"], f"{r['eta_nl']:.3f}")
                print("| " + " | ".join(map(str, cells)) + " |")


if __name__ == "__main__":
    main()
