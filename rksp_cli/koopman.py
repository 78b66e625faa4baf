"""Whitened DMD of one residual-stream transition, and the spectral features built on it.

Pure tensor math: nothing here knows about models. Snapshots are ``(d, N)`` matrices whose
columns are token states (RKSP paper, App. D.3): ``X`` holds h_l and ``Y`` holds h_{l+1} for the
same N tokens. Every formula and constant follows ``shared/docs/method-reference.md`` (sections
1.2-1.6); the choices the paper leaves open are marked "design choice" where they are made.

Three estimators (``rank``):

* ``"auto"`` (default): exact DMD in the data subspace. X is centred and factored by a thin SVD,
  X_c = U S V^T, and the whitened operator is formed in the r-dimensional span of U, where r is
  the numerical rank of X_c. When X_c has full row rank (N - 1 >= d) this is
  *the same operator* as full DMD, Y~ X~^+, expressed in an orthonormal basis, so every
  eigenvalue agrees. When d > N - 1, full DMD has d - r structural zero eigenvalues that come
  from the sample size alone (they cap the near-unit mass at r/d); the data-subspace estimator
  keeps exactly the r non-structural ones. Whitening stays an exact similarity in that subspace.
  Cost: O(d N min(d, N)) for the SVD plus O(r^3) for the eigendecomposition, never d x d.
* ``"full"``: the textbook d x d estimator (eigh whitening, pseudo-inverse, d x d eig), as the
  paper writes it, structural zeros included; the pseudo-inverse is cut at the numerical rank of
  X_c. Kept for reproduction and as the reference
  the tests compare ``"auto"`` against.
* an integer r: DMD in the leading r-dim principal subspace of the centred states (the standard
  truncation of exact DMD, exact top singular vectors, no random test matrix), whitened inside
  that subspace: the operator fitted to the snapshots projected on the data's r dominant
  directions, and the masses over its r eigenvalues. The paper's recipe instead runs a random range finder
  *after* whitening, where every direction is equally loud, so the subspace is whatever the test
  matrix picks (method reference 1.3). Koopman Spectral Shaping (``kss.py``) uses this very
  estimator, through ``subspace_whitening`` and ``fit_operator`` below, with gradients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch

# Spectral bands on |lambda| (RKSP paper, Def. 1: eps_u = 0.05, eps_n = 0.10, delta_c = 0.20).
EXPANSIVE_ABOVE = 1.05
NEAR_UNIT_FROM = 0.90
GAP_FROM = 0.80

Rank = Literal["auto", "full"] | int


@dataclass(frozen=True)
class DMDSettings:
    """Estimator settings; defaults are the paper's where it gives them."""

    rank: Rank = "auto"
    eps: float = 1e-5  # ZCA regulariser on the X covariance (Eq. 8)
    # ResDMD cut tau (Eq. 10); None (the default) keeps every eigenvalue. Off by default, by measurement:
    # at d = 512 the filter was the main source of the masses' spread across token samples (near-unit
    # mass: 0.05 with it, 0.02 without) and sample sizes (0.15 against 0.003, N = 1024-8192).
    residual_tol: float | None = None
    residual_eps: float = 1e-12  # design choice: denominator guard in the ResDMD residual
    eta_eps: float = 1e-8  # design choice: denominator guard in eta_nl
    # kappa(V) needs the eigenvectors (float64) and an SVD of them: 2.4x the default profile's time at
    # d = 768, N = 2048 (AMD EPYC, 2 threads), and the risk model does not read it. Off by default
    # (design choice, issue 13's cost bar); NaN when off.
    kappa: bool = False
    degenerate_tol: float = 1e-3  # design choice: ||Y~ - X~|| / ||X~|| below this is "identity"
    # With the token states' sequences known, eta_nl is read on groups of whole sequences holding about
    # this many states and averaged (``_eta_on_sequence_groups``): the sample every calibration screen drew, so
    # that the risk model reads eta_nl as it was fitted at any probe.tokens >= it. None: whole sample.
    eta_tokens: int | None = 2048


@dataclass
class LayerSpectrum:
    """The Koopman profile of one transition h_l -> h_{l+1}."""

    eigenvalues: torch.Tensor  # complex128, every eigenvalue before the ResDMD filter
    kept: torch.Tensor  # bool mask: survivors of the ResDMD filter
    spectral_radius: float  # over all eigenvalues, before filtering (design choice)
    kappa: float  # condition number of the unit-norm eigenvector matrix, before filtering; NaN if not computed
    eta_nl: float  # ||Y~ - A X~||_F / ||Y~ - X~||_F: how far the transition is from linear
    update_ratio: float  # ||Y~ - X~||_F / ||X~||_F: the size of the block's update
    expansive_mass: float
    near_unit_mass: float
    gap_mass: float
    contractive_mass: float
    degenerate: bool  # the block is (numerically) the identity: its spectrum carries no signal
    filter_fallback: bool  # the ResDMD filter removed everything, so all eigenvalues were used
    estimator: str
    notes: list[str] = field(default_factory=list)
    # each eigenvalue's ResDMD residual (Eq. 10, corrected for the fit's degrees of freedom), in the
    # order of ``eigenvalues``; None when the filter is off or the fit is exact
    residuals: torch.Tensor | None = None

    @property
    def n_kept(self) -> int:
        return int(self.kept.sum())


def spectral_masses(eigenvalues: torch.Tensor) -> dict[str, float]:
    """Unweighted fractions of eigenvalues in each |lambda| band (RKSP paper, Def. 1)."""
    mod = eigenvalues.abs()
    n = mod.numel()
    if n == 0:
        nan = float("nan")
        return dict(expansive_mass=nan, near_unit_mass=nan, gap_mass=nan, contractive_mass=nan)
    near = (mod >= NEAR_UNIT_FROM) & (mod <= EXPANSIVE_ABOVE)
    gap = (mod >= GAP_FROM) & (mod < NEAR_UNIT_FROM)
    return dict(
        expansive_mass=float((mod > EXPANSIVE_ABOVE).sum()) / n,
        near_unit_mass=float(near.sum()) / n,
        gap_mass=float(gap.sum()) / n,
        contractive_mass=float((mod < GAP_FROM).sum()) / n,
    )


def layer_spectrum(
    X: torch.Tensor, Y: torch.Tensor, settings: DMDSettings = DMDSettings(), sequences: torch.Tensor | None = None
) -> LayerSpectrum:
    """Profile one transition from snapshot matrices ``X`` (h_l) and ``Y`` (h_{l+1}), each (d, N).

    ``sequences`` (N ints, optional): the input sequence each token state comes from, which fixes
    the sample eta_nl is read on (``DMDSettings.eta_tokens``).
    """
    if X.shape != Y.shape or X.ndim != 2:
        raise ValueError(f"X and Y must be (d, N) matrices of one shape, got {tuple(X.shape)} and {tuple(Y.shape)}")
    if X.shape[1] < 2:
        raise ValueError("DMD needs at least 2 token states")
    fitted = _fit(X, Y, settings)
    if fitted is None:
        return _no_variance(X.shape[0])
    fit, name = fitted
    return _analyse(fit, settings, name, _eta_on_sequence_groups(X, Y, sequences, settings, fit))


def _fit(X: torch.Tensor, Y: torch.Tensor, settings: DMDSettings) -> tuple[_Fit, str] | None:
    """The whitened operator of ``settings.rank``'s estimator and its name; None when X has no variance.

    Computed in float64; ``auto`` forms its (d x N)-sized products in float32 when the states are
    float32 or narrower and float32 resolves them (``_gram_eigh``).
    """
    precision = torch.float64 if X.dtype == torch.float64 else torch.float32  # the states' own, at most
    X, Y = X.to(torch.float64), Y.to(torch.float64)
    if settings.rank == "full":
        Xw, Yw = _whiten_full(X, Y, settings.eps)
        U, S, Vh = torch.linalg.svd(Xw, full_matrices=False)
        # Y~ X~^+ cut at the rank `auto` uses: pinv's own cut keeps round-off the whitening amplified
        r = _thin_svd(X - X.mean(1, keepdim=True))[1].numel()
        A = Yw @ (Vh[:r].T / S[:r]) @ U[:, :r].T
        return _Fit.of(A, Xw, Yw, r, grams=settings.residual_tol is not None), "full whitened DMD (d x d)"
    Xc, Yc = X - X.mean(1, keepdim=True), Y - Y.mean(1, keepdim=True)
    if settings.rank != "auto":
        W = subspace_whitening(Xc, int(settings.rank), settings.eps)
        if W.shape[0] == 0:
            return None
        Xw, Yw, r = W @ Xc, W @ Yc, W.shape[0]
        fit = _Fit.of(fit_operator(Xw, Yw), Xw, Yw, r, grams=settings.residual_tol is not None)
        return fit, f"whitened DMD in the leading {r}-dim principal subspace"
    fit = _data_subspace_fit(Xc, Yc, settings, precision)
    if fit is None:
        return None
    r, d = fit.rank, X.shape[0]
    return fit, "whitened DMD" if r == d else f"whitened DMD in the {r}-dim data subspace (d={d})"


def _eta_on_sequence_groups(
    X: torch.Tensor, Y: torch.Tensor, sequences: torch.Tensor | None, settings: DMDSettings, whole: _Fit
) -> float:
    """eta_nl on the sample a calibration screen draws: the mean over groups of whole sequences
    that hold about ``settings.eta_tokens`` token states each.

    Why: eta_nl is an in-sample fit error, and the states of one sequence share its prefix, so the
    fewer sequences a sample holds, the better a linear map fits it. Measured at d = 512 (pre-LN, 4
    blocks, 32-token sequences, layer 2 of an N = 8192 screen): 0.30 on groups of 64 sequences
    (2048 states, an N = 2048 screen's sample), 0.37 on random 2048 of the 8192 states and on all of
    them. The degrees-of-freedom correction (``_eta``) makes the estimate independent of N at a
    fixed number of sequences, not of the sequences; a larger screen draws more of them. The risk
    model was fitted on eta_nl at N = 2048, so an N = 8192 screen fed it a value from another
    sample design and moved the edge 1.27x from N = 4096 (issue 13). Groups of whole sequences keep
    the design fixed, and averaging them uses every state to lower the noise. The last group ends
    at the last sequence and may overlap the one before. Design choice. Without ``sequences``, at
    or below ``eta_tokens`` states, with ``eta_tokens=None``, and when d >= ``eta_tokens`` - 1
    (a group's fit would be exact), the whole sample (the screen warns when N < ``eta_tokens``).
    """
    block, (d, n) = settings.eta_tokens, X.shape
    if sequences is None or block is None or n <= block or d >= block - 1:
        return _eta(whole, settings.eta_eps)
    ids, column_ids = torch.unique(sequences, return_inverse=True)  # sequence ids -> 0 .. n_seq - 1
    n_seq = ids.numel()
    per_group = max(1, round(block * n_seq / n))
    plain = DMDSettings(rank=settings.rank, eps=settings.eps, eta_eps=settings.eta_eps)  # no filter, no grams
    etas = []
    for first in [*range(0, n_seq - per_group, per_group), n_seq - per_group]:
        cols = ((column_ids >= first) & (column_ids < first + per_group)).nonzero().squeeze(1)
        fitted = _fit(X[:, cols], Y[:, cols], plain) if cols.numel() > d + 1 else None
        etas.append(_eta(fitted[0], settings.eta_eps) if fitted is not None else math.nan)
    if any(math.isnan(e) for e in etas):  # a group without variance or without residual degrees of freedom
        return _eta(whole, settings.eta_eps)
    return float(sum(etas) / len(etas))


@dataclass(frozen=True)
class _Fit:
    """A whitened operator and the squared Frobenius norms its analysis reads."""

    A: torch.Tensor  # (r, r)
    rank: int
    n: int  # token states
    residual_sq: float | None  # ||Y~ - A X~||^2; None when the fit is exact (rank >= N - 1) or not formed
    update_sq: float  # ||Y~ - X~||^2
    x_sq: float  # ||X~||^2
    # Gram matrices of X~ and of the fit error, formed only for the ResDMD filter
    x_gram: torch.Tensor | None = None
    error_gram: torch.Tensor | None = None

    @classmethod
    def of(cls, A: torch.Tensor, Xw: torch.Tensor, Yw: torch.Tensor, rank: int, grams: bool) -> _Fit:
        """From the whitened snapshots themselves (every estimator can take this path); ``grams``
        for the ResDMD filter. An exact fit (rank >= N - 1) leaves no residual: the filter keeps all."""
        n = Xw.shape[1]
        error = Yw - A @ Xw if n - 1 - rank > 0 else None
        grams = grams and error is not None
        return cls(
            A, rank, n,
            residual_sq=float(error.square().sum()) if error is not None else None,
            update_sq=float((Yw - Xw).square().sum()), x_sq=float(Xw.square().sum()),
            x_gram=Xw @ Xw.T if grams else None, error_gram=error @ error.T if grams else None,
        )  # fmt: skip


# Below this share of ||Y~||^2, a norm obtained as a difference of Gram-matrix terms has lost too
# many digits to cancellation, in the precision of the products (float64: ~1e-16 / 1e-6 relative at
# the cut; float32: ~6e-8 / 1e-2); such fits, and those whose float32 products overflowed, are
# redone on the snapshots, in float64. Design choice; it triggers for near-exact fits and
# near-identity blocks (measured: 27 of 396 transitions in 100 calibration screens, none of GPT-2 124M's).
_CANCELLATION_CUT = {torch.float64: 1e-6, torch.float32: 1e-2}


def _data_subspace_fit(
    Xc: torch.Tensor, Yc: torch.Tensor, settings: DMDSettings, precision: torch.dtype = torch.float64
) -> _Fit | None:
    """The ``auto`` estimator from r x r products: the whitened snapshots are never formed.

    With X_c = U S V^T cut at its numerical rank r, D = (S^2/(N-1) + eps)^-1/2 and sx = D S, the
    whitened snapshots are X~ = diag(sx) V^T and Y~ = diag(D) U^T Y_c (``whiten``), so
    A = Y~ X~^+ = diag(D) (U^T Y_c V) diag(1/sx), and, A X~ being the projection of Y~ on the row
    space of V^T, ||Y~ - A X~||^2 = ||Y~||^2 - ||A diag(sx)||^2. Three (d x N)-sized products instead
    of five (measured at d = 768, N = 2048: 0.34 -> 0.24 s per layer). None when X has no variance.
    """
    if settings.residual_tol is not None:  # the filter reads the fit error itself
        return _whitened_fit(Xc, Yc, settings.eps, grams=True)
    S, vecs, left, precision = _gram_eigh(Xc, precision)
    if S.numel() == 0:
        return None
    n, r = Xc.shape[1], S.numel()
    D = (S.square() / (n - 1) + settings.eps).rsqrt()
    sx = D * S
    T, core = _projections(Xc, Yc, S, vecs, left, precision)
    y_sq = (D.square() * T.square().sum(1)).sum()
    A = D[:, None] * core / sx
    projected_sq = (A * sx).square().sum()
    x_sq = sx.square().sum()
    update_sq = y_sq - 2 * (A.diagonal() * sx.square()).sum() + x_sq
    residual_sq = y_sq - projected_sq if n - 1 - r > 0 else None
    small = min(update_sq, residual_sq if residual_sq is not None else y_sq)
    if not math.isfinite(small) or small < _CANCELLATION_CUT[precision] * y_sq:  # or float32 overflowed
        return _whitened_fit(Xc, Yc, settings.eps, grams=False)
    return _Fit(A, r, n, float(residual_sq) if residual_sq is not None else None, float(update_sq), float(x_sq))


def _projections(
    Xc: torch.Tensor, Yc: torch.Tensor, S: torch.Tensor, vecs: torch.Tensor, left: bool, precision: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """U^T Y_c and U^T Y_c V, the (d x N)-sized products of ``_data_subspace_fit``, formed in ``precision``
    from ``_gram_eigh``'s singular values and vectors, returned in X_c's precision."""
    Xp, Yp, Vp = Xc.to(precision), Yc.to(precision), vecs.to(precision)
    if left:  # d <= N, vecs = U: V = X_c^T U / S, so U^T Y_c V = (U^T Y_c) X_c^T U / S
        T = Vp.T @ Yp
        return T.to(Xc.dtype), ((T @ Xp.T) @ Vp).to(Xc.dtype) / S
    # d > N, vecs = V: U^T Y_c = V^T (X_c^T Y_c) / S, and U is never formed
    T = Vp.T @ (Xp.T @ Yp)
    return T.to(Xc.dtype) / S[:, None], (T @ Vp).to(Xc.dtype) / S[:, None]


def _whitened_fit(Xc: torch.Tensor, Yc: torch.Tensor, eps: float, grams: bool) -> _Fit | None:
    """The ``auto`` estimator on explicitly whitened snapshots."""
    Xw, Yw, Vh, sx = whiten(Xc, Yc, eps)
    if Xw.shape[0] == 0:
        return None
    A = (Yw @ Vh.T) / sx  # Y~ X~^+ in the data basis: X~^+ = V diag(1/sx)
    return _Fit.of(A, Xw, Yw, Xw.shape[0], grams)


def _whiten_full(X: torch.Tensor, Y: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """X-based ZCA whitening exactly as Eqs. 7-9 write it."""
    n = X.shape[1]
    Xc = X - X.mean(1, keepdim=True)
    Yc = Y - Y.mean(1, keepdim=True)
    cov = Xc @ Xc.T / (n - 1) + eps * torch.eye(X.shape[0], dtype=X.dtype, device=X.device)
    s, U = torch.linalg.eigh(cov)
    W = (U * s.rsqrt()) @ U.T
    return W @ Xc, W @ Yc


def whiten(
    X: torch.Tensor, Y: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Whitened snapshots in the orthonormal basis U of X's centred column space.

    With X_c = U S V^T, the ZCA matrix acts on span(U) as U diag(D) U^T, D = (S^2/(N-1) + eps)^-1/2,
    so U^T X~ = diag(D S) V^T and U^T Y~ = diag(D) U^T Y_c. Directions beyond the numerical rank
    of X_c are dropped.
    """
    n = X.shape[1]
    Xc = X - X.mean(1, keepdim=True)
    Yc = Y - Y.mean(1, keepdim=True)
    U, S, Vh = _thin_svd(Xc)
    D = (S.square() / (n - 1) + eps).rsqrt()
    sx = D * S
    Xw = sx[:, None] * Vh
    Yw = D[:, None] * (U.T @ Yc)
    return Xw, Yw, Vh, sx


def _thin_svd(Xc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Thin SVD of X_c cut at its numerical rank, through the smaller Gram matrix.

    eigh of the min(d, N)-square Gram matrix is several times faster than an SVD and costs
    O(d N min(d, N)). The rank cut keeps eigenvalues above max(d, N) * machine eps of the largest,
    i.e. singular values above ~7e-7 of the largest at N = 2048. That drops the direction the
    centring removed and float32 round-off directions, such as the mean direction a LayerNorm
    removes from Post-LN states (residual streams are computed in float32): kept, such a direction
    becomes a spurious mode with a near-singular eigenvector (measured: log10 kappa 4.3 instead of
    2.0 on a Post-LN/DeepNorm stream). Deciding the rank before whitening matters: whitening would
    boost round-off directions by eps^-1/2 and make them look real. The cut is written with float64's
    eps but applies to squared singular values, so in singular values it sits at sqrt(max(d, N) eps64),
    3e-7 to 1.3e-6 of the largest for N = 512-8192: above float32's eps (1.2e-7), the round-off level
    of the float32 states it is applied to.
    """
    S, vecs, left, _ = _gram_eigh(Xc)
    if left:
        return vecs, S, (vecs.T @ Xc) / S[:, None]
    return (Xc @ vecs) / S, S, vecs.T


def _gram_eigh(
    Xc: torch.Tensor, precision: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor, bool, torch.dtype]:
    """X_c's singular values (descending, cut at the numerical rank; see ``_thin_svd``), its
    singular vectors on the smaller side (left (d, r) when d <= N, else right (N, r)), and the
    precision the Gram matrix was formed in, which products with X_c can share.

    With a lower ``precision`` than X_c's (float32, for states that were float32), the Gram matrix
    is formed from a copy in it when that resolves it: when every eigenvalue but the structural
    zero of centring (d >= N) clears the same rank cut written with that precision's eps. The
    rounding then perturbs the Gram matrix about as much as rounding the states to float32 already
    did, and nothing is cut that a float64 Gram would keep. Otherwise (a near-singular X_c, such as
    the embeddings' low-dim span in a small-vocabulary model, or a direction a LayerNorm removed)
    it is formed again in X_c's precision and the cut finds its rank as before. Design choice,
    issue 13's cost bar: the Gram and the products after it in half the time (0.14 -> 0.07 s per
    d = 768 transition, one core). The eigendecomposition stays in X_c's precision: in float32 its
    eigenvector error, amplified by 1/S, moved GPT-2's |lambda| by up to 1e-3 (float32 Gram and
    products alone: 5.5e-5, as much as the float32 eigenvalue solve).
    """
    d, n = Xc.shape
    left = d <= n
    structural = max(0, min(d, n) - (n - 1))  # centring leaves rank <= N - 1
    tries = (Xc.dtype,) if precision in (None, Xc.dtype) else (precision, Xc.dtype)
    for dtype in tries:  # the last, X_c's own precision, is always taken
        Xp = Xc.to(dtype)
        gram = (Xp @ Xp.T if left else Xp.T @ Xp).to(Xc.dtype)
        if dtype != Xc.dtype and not torch.isfinite(gram).all():  # beyond float32's range
            continue
        evals, vecs = torch.linalg.eigh(gram)  # ascending
        cut = (evals[-1] if evals.numel() else 0.0) * max(d, n) * torch.finfo(dtype).eps
        if evals.numel() <= structural or evals[structural] > cut:
            break
    evals, vecs = evals.flip(0), vecs.flip(1)  # descending
    if evals.numel() == 0 or evals[0] <= 0:
        return Xc.new_zeros(0), Xc.new_zeros(d if left else n, 0), left, dtype
    keep = evals > cut
    return evals[keep].sqrt(), vecs[:, keep], left, dtype


def subspace_whitening(Xc: torch.Tensor, rank: int, eps: float) -> torch.Tensor:
    """The (r, d) map onto the leading ``rank`` principal directions of the centred snapshots ``Xc``,
    whitened inside them: W = diag((S^2/(N-1) + eps)^-1/2) U_r^T. A constant (no gradient): the
    screen and KSS both treat the subspace and the whitening as fixed, so that the eigenvalues they
    report are of one and the same operator."""
    with torch.no_grad():
        U, S, _ = _thin_svd(Xc.detach())
        r = min(rank, S.numel())
        D = (S[:r].square() / (Xc.shape[1] - 1) + eps).rsqrt()
        return D[:, None] * U[:, :r].T


def fit_operator(Xw: torch.Tensor, Yw: torch.Tensor) -> torch.Tensor:
    """The least-squares operator A = Yw Xw^T (Xw Xw^T)^-1 of full-row-rank snapshots, differentiable
    in both (KSS backpropagates through it)."""
    return Yw @ Xw.T @ torch.linalg.inv(Xw @ Xw.T)


def _analyse(fit: _Fit, settings: DMDSettings, name: str, eta: float) -> LayerSpectrum:
    """Eigenvalues, kappa(V), ResDMD filter and masses of a fitted operator, with its ``eta``.

    Eigenvectors are computed only when kappa(V) or the ResDMD filter needs them; otherwise the
    eigenvalues come from a float32 solve (``_eigenvalues``).
    """
    notes: list[str] = []
    kappa, left = math.nan, None
    if settings.kappa or settings.residual_tol is not None:
        lam, V = torch.linalg.eig(fit.A)
        V = V / torch.linalg.vector_norm(V, dim=0, keepdim=True)
        try:
            if settings.kappa:
                kappa = float(torch.linalg.cond(V))
            if settings.residual_tol is not None:  # only the ResDMD filter needs the left eigenvectors
                left = torch.linalg.inv(V)  # row j is u_j^* with u_j^* A = lambda_j u_j^*
        except RuntimeError:  # defective operator: the eigenvectors do not span
            left, kappa = None, math.inf
            notes.append("eigenvector matrix is singular (defective operator)")
    else:
        lam = _eigenvalues(fit.A)

    kept = torch.ones_like(lam, dtype=torch.bool)
    fallback, residuals = False, None
    if left is not None and fit.error_gram is not None and fit.x_gram is not None:
        residuals = _resdmd_residuals(left, fit, settings.residual_eps)
        kept = residuals <= settings.residual_tol
        if not kept.any():
            kept = torch.ones_like(kept)
            fallback = True
            notes.append("ResDMD filter removed every eigenvalue; using all of them")

    update_ratio = math.sqrt(max(fit.update_sq, 0.0) / max(fit.x_sq, 1e-300))
    return LayerSpectrum(
        eigenvalues=lam,
        kept=kept,
        spectral_radius=float(lam.abs().max()) if lam.numel() else float("nan"),
        kappa=kappa,
        eta_nl=eta,
        update_ratio=update_ratio,
        degenerate=update_ratio < settings.degenerate_tol,
        filter_fallback=fallback,
        estimator=name,
        notes=notes,
        residuals=residuals,
        **spectral_masses(lam[kept]),
    )


def _resdmd_residuals(left: torch.Tensor, fit: _Fit, eps: float) -> torch.Tensor:
    """The ResDMD residual of each eigenvalue (RKSP paper, Eq. 10), ||u*(Y~ - lambda X~)|| / ||u*X~||,
    for the rows u* of ``left`` (left eigenvectors), scaled by sqrt((N - 1) / (N - 1 - r)).

    u*(Y~ - lambda X~) = u*(Y~ - A X~) because u*A = lambda u*, so each residual is a quadratic form
    in two r x r Gram matrices: O(r^2 N + r^3) instead of two complex r x r x N products. The rows
    of V^-1 satisfy u*A = lambda u* only up to round-off, which grows with kappa(V); measured against
    Eq. 10 evaluated directly with LAPACK's own left eigenvectors, the two agree to 4e-9 at
    kappa(V) = 8e5 and 1e-12 at d = 768, kappa(V) = 3e4 (a GPT-2 layer's is 1e3-1e4), far below any
    threshold (``tests/test_koopman.py`` checks it within a bound derived from kappa(V)).

    The scaling makes the threshold mean the same thing at every width (design choice, issue 13):
    the fit error is the part of Y~ outside X~'s r-dim row space, so for noise of size sigma per
    whitened direction ||u*E||^2 / ||u*X~||^2 = sigma^2 (N - 1 - r) / (N - 1): the raw residual
    shrinks as r / N grows (by 0.7x at d = N / 2), and a fixed tau keeps more eigenvalues of a wider
    model. The scaling is eta_nl's (``_eta``); with it the residual estimates sigma at any d < N - 1.
    """
    num = _quadratic_norms(left, fit.error_gram)
    den = _quadratic_norms(left, fit.x_gram) + eps
    return num / den * math.sqrt((fit.n - 1) / (fit.n - 1 - fit.rank))


def _eigenvalues(A: torch.Tensor) -> torch.Tensor:
    """The eigenvalues of A from a float32 solve, as complex128.

    Design choice, for speed (0.26 s against 0.45 s at r = 768, AMD EPYC, 2 threads): the solve's
    backward error, ~eps32 ||A||, is below what A already carries from the float32 states it is
    fitted from (~eps32 kappa(X) ||A|| with kappa(X) >= 1), so no eigenvalue moves by more than the
    data's own round-off does. Measured on GPT-2 124M's 12 operators (r = 768): every |lambda|
    within 4.5e-5 of the float64 solve, no eigenvalue across a band edge. The eigenvector path
    (kappa, the ResDMD filter) stays in float64: kappa(V) is far more sensitive than lambda.
    """
    single = A.to(torch.float32)
    if not torch.isfinite(single).all():  # beyond float32's range (an exploding block): solve in float64
        return torch.linalg.eigvals(A)
    return torch.linalg.eigvals(single).to(torch.complex128)


def _quadratic_norms(rows: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
    """sqrt(w G w*) for each complex row w and a real symmetric G (= ||w M|| when G = M M^T)."""
    re, im = rows.real, rows.imag
    quad = ((re @ gram) * re).sum(1) + ((im @ gram) * im).sum(1)
    return quad.clamp_min(0).sqrt()


def _eta(fit: _Fit, eps: float) -> float:
    """||Y~ - A X~|| / ||Y~ - X~||, corrected for the degrees of freedom the fit used.

    An in-sample least-squares residual is biased low by the r parameters per output that the fit
    spent on N - 1 centred samples: E[RSS] = (N - 1 - r) sigma^2. Scaling by sqrt((N - 1) / (N - 1 - r))
    removes most of the sample-size dependence (design choice; measured at d = 512, layer means:
    0.27 -> 0.40 uncorrected, 0.33 -> 0.41 corrected, for N = 1024 -> 8192); ``_eta_on_sequence_groups``
    removes the rest above the calibration's N. With r >= N - 1 the fit is exact and leaves no
    residual to measure: NaN.
    """
    if fit.residual_sq is None:
        return float("nan")
    raw = math.sqrt(max(fit.residual_sq, 0.0)) / (math.sqrt(max(fit.update_sq, 0.0)) + eps)
    return raw * math.sqrt((fit.n - 1) / (fit.n - 1 - fit.rank))


def _no_variance(d: int) -> LayerSpectrum:
    """A transition whose input states are all identical: nothing to fit, so nothing to assess."""
    empty = torch.zeros(0, dtype=torch.complex128)
    nan = float("nan")
    return LayerSpectrum(
        eigenvalues=empty,
        kept=torch.zeros(0, dtype=torch.bool),
        spectral_radius=nan,
        kappa=nan,
        eta_nl=nan,
        update_ratio=0.0,
        degenerate=True,
        filter_fallback=False,
        estimator="none",
        notes=[f"the {d}-dim input states have no variance"],
        **spectral_masses(empty),
    )


# Per-layer features that are aggregated over depth (method reference 1.5).
LAYER_FEATURES = (
    "expansive_mass",
    "near_unit_mass",
    "gap_mass",
    "contractive_mass",
    "spectral_radius",
    "kappa",
    "log10_kappa",
    "eta_nl",
    "kept_fraction",
)


def layer_features(spec: LayerSpectrum) -> dict[str, float]:
    """The scalar per-layer features of one spectrum."""
    n = spec.eigenvalues.numel()
    return {
        "expansive_mass": spec.expansive_mass,
        "near_unit_mass": spec.near_unit_mass,
        "gap_mass": spec.gap_mass,
        "contractive_mass": spec.contractive_mass,
        "spectral_radius": spec.spectral_radius,
        "kappa": spec.kappa,
        "log10_kappa": math.log10(spec.kappa) if spec.kappa > 0 else float("nan"),
        "eta_nl": spec.eta_nl,
        "kept_fraction": spec.n_kept / n if n else float("nan"),
    }


def aggregate(spectra: list[LayerSpectrum]) -> dict[str, float]:
    """Mean, max, min and std over depth of each layer feature, degenerate layers excluded.

    The std is the population std (a 1-layer model has std 0). With no assessable layer every
    aggregate is NaN; callers decide what that means. kappa's aggregates are absent when it was not
    computed.
    """
    rows = [layer_features(s) for s in spectra if not s.degenerate]
    names = LAYER_FEATURES
    if all(math.isnan(s.kappa) for s in spectra):  # not computed (DMDSettings.kappa): no kappa features
        names = tuple(n for n in names if "kappa" not in n)
    out: dict[str, float] = {}
    for name in names:
        vals = torch.tensor([r[name] for r in rows], dtype=torch.float64)
        vals = vals[torch.isfinite(vals)]
        if vals.numel() == 0:
            out.update({f"{name}_{s}": float("nan") for s in ("mean", "max", "min", "std")})
            continue
        out[f"{name}_mean"] = float(vals.mean())
        out[f"{name}_max"] = float(vals.max())
        out[f"{name}_min"] = float(vals.min())
        out[f"{name}_std"] = float(vals.std(unbiased=False))
    return out
