"""Numeric tolerances derived from the conditioning of each problem, never from one CPU's output.

Two backward-stable computations of the same quantity differ by round-off that the problem's
condition numbers amplify; BLAS and LAPACK differ between Intel and AMD machines (blocking, FMA,
reduction order), so the difference is of that size on any machine but not the same number. A
tolerance is therefore a first-order error bound, written from the quantities that set it:

* **Eigenvalues of a DMD operator** A = Y X^+. Forming A in floating point perturbs it by
  ||dA|| <= n eps kappa(X) ||A|| (the least-squares forward error, Higham, *Accuracy and Stability
  of Numerical Algorithms*, ch. 20), and Bauer-Fike turns that into |d lambda| <= kappa(V) ||dA||,
  kappa(V) being the condition number of the eigenvector matrix. Hence
  ``eigenvalue_tolerance = n * eps * kappa(V) * kappa(X) * ||A||``. Whitening by W multiplies
  kappa(X) by at most kappa(W); for the ZCA whitening with regulariser eps_w on a rank-deficient
  covariance kappa(W) = sqrt((lambda_max + eps_w) / eps_w).
* **Eigenvalues from the float32 solve** (the default path, ``koopman._eigenvalues``): the solve
  is backward stable in float32, ||dA|| <= n eps32 ||A||, so Bauer-Fike adds
  ``float32_solve_tolerance = n * eps32 * kappa(V) * ||A||`` to the bound above.
* **Eigenvector-derived quantities** (kappa(V) itself): an eigenvector moves by about
  kappa(V) ||dA|| / gap, so relative changes of kappa(V) are bounded by ``n eps kappa(V)^2 kappa(X)``.
* **A residual norm of an exactly solvable fit** (eta_nl of a linear map):
  ``n * eps * kappa(X) * ||Y|| / ||Y - X||``.
* **Float32 states** (what a screen reads): the ``auto`` estimator forms its Gram matrix and
  products in float32 when that resolves them, so the bounds above hold with eps32 in place of
  eps64 (``eigenvalue_tolerance(..., eps=EPS32)``).

The bounds hold with margin (measured: observed / bound between 0.002 and 0.4 on AMD EPYC and
Intel Xeon) and stay many orders of magnitude below any difference a wrong formula would make.
"""

from __future__ import annotations

import math

import torch

EPS64 = torch.finfo(torch.float64).eps
EPS32 = torch.finfo(torch.float32).eps


def condition(M: torch.Tensor) -> float:
    """2-norm condition number of a matrix (the ratio of its extreme non-zero singular values)."""
    s = torch.linalg.svdvals(M)
    s = s[s > s[0] * max(M.shape) * EPS64]
    return float(s[0] / s[-1])


def eigenvalue_tolerance(n: int, kappa_v: float, kappa_x: float, norm_a: float, eps: float = EPS64) -> float:
    """Bauer-Fike with the least-squares perturbation of A = Y X^+ (see the module docstring), its
    products formed at precision ``eps``."""
    return n * eps * kappa_v * kappa_x * norm_a


def float32_solve_tolerance(n: int, kappa_v: float, norm_a: float) -> float:
    """What the default path's float32 eigenvalue solve adds to ``eigenvalue_tolerance``."""
    return n * EPS32 * kappa_v * norm_a


def eigenvector_tolerance(n: int, kappa_v: float, kappa_x: float) -> float:
    """Relative change of eigenvector-derived quantities such as kappa(V)."""
    return n * EPS64 * kappa_v**2 * kappa_x


def residual_tolerance(n: int, kappa_x: float, Y: torch.Tensor, X: torch.Tensor) -> float:
    """The round-off floor of ||Y - A X|| / ||Y - X|| when Y = A X exactly."""
    return n * EPS64 * kappa_x * float(torch.linalg.norm(Y) / torch.linalg.norm(Y - X))


def zca_condition(X: torch.Tensor, eps: float) -> float:
    """kappa(W) of the ZCA whitening of X's covariance with regulariser ``eps`` (rank-deficient allowed)."""
    Xc = X - X.mean(1, keepdim=True)
    top = float(torch.linalg.matrix_norm(Xc, 2) ** 2 / (X.shape[1] - 1))
    return math.sqrt((top + eps) / eps)


def entropy_tolerance(s: torch.Tensor, n: int, eps: float) -> float:
    """Normalised entropy of p = s / sum(s) computed at precision ``eps`` from an n-dim matrix.

    Each singular value moves by at most n eps s_max (backward-stable SVD of a matrix formed with
    n-term sums); |dH/ds_i| <= (|ln p_i| + 2) / (sum(s) ln k) for k values, summed over the k values.
    """
    k = s.numel()
    p_min = float((s / s.sum()).min())
    return k * n * eps * float(s.max() / s.sum()) * (abs(math.log(p_min)) + 2) / math.log(k)
