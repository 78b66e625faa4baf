"""Properties of the whitened-DMD estimators, checked against textbook formulas."""

import math

import pytest
import torch

from rksp_cli.koopman import (
    DMDSettings,
    LayerSpectrum,
    _gram_eigh,
    aggregate,
    layer_spectrum,
    spectral_masses,
    whiten,
)
from tests.tolerances import (
    EPS32,
    EPS64,
    condition,
    eigenvalue_tolerance,
    eigenvector_tolerance,
    float32_solve_tolerance,
    residual_tolerance,
    zca_condition,
)


def _snapshots(d: int, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Anisotropic inputs and a nonlinear residual map, like a block: Y = X + tanh(B X)."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(-1, 1, d, dtype=torch.float64)
    X = scales[:, None] * torch.randn(d, n, generator=g, dtype=torch.float64) + 0.3
    B = torch.randn(d, d, generator=g, dtype=torch.float64) / math.sqrt(d)
    return X, X + torch.tanh(B @ X)


def _reference_whitened(X, Y, eps=1e-5):
    """Eqs. 7-9 literally: one W from X's covariance (eigh), applied to both."""
    n = X.shape[1]
    Xc, Yc = X - X.mean(1, keepdim=True), Y - Y.mean(1, keepdim=True)
    s, U = torch.linalg.eigh(Xc @ Xc.T / (n - 1) + eps * torch.eye(X.shape[0], dtype=X.dtype))
    W = U @ torch.diag(s.rsqrt()) @ U.T
    return W @ Xc, W @ Yc, Xc, Yc


def _max_matching_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest distance from an eigenvalue of either set to the nearest of the other."""
    dist = (a[:, None] - b[None, :]).abs()
    return float(max(dist.min(1).values.max(), dist.min(0).values.max()))


def test_whitening_is_an_exact_similarity_at_full_rank():
    X, Y = _snapshots(d=16, n=400)
    Xw, Yw, Xc, Yc = _reference_whitened(X, Y)
    whitened = torch.linalg.eigvals(Yw @ torch.linalg.pinv(Xw))
    raw = torch.linalg.eigvals(Yc @ torch.linalg.pinv(Xc))
    kappa_v = layer_spectrum(X, Y, DMDSettings(kappa=True)).kappa
    norm_a = float(raw.abs().max())
    tol = eigenvalue_tolerance(16, kappa_v, condition(Xc), norm_a)
    assert _max_matching_distance(whitened, raw) < tol
    tol += float32_solve_tolerance(16, kappa_v, norm_a)  # the default path solves in float32
    for rank in ("auto", "full"):
        ours = layer_spectrum(X, Y, DMDSettings(rank=rank)).eigenvalues
        assert ours.numel() == 16
        assert _max_matching_distance(ours, raw) < tol, rank


def test_known_linear_map_is_recovered_with_zero_residual():
    target = torch.tensor([0.5, 0.85, 0.95 + 0.1j, 0.95 - 0.1j, 1.0, 1.2, 0.3, 1.04], dtype=torch.complex128)
    g = torch.Generator().manual_seed(1)
    basis = torch.randn(8, 8, generator=g, dtype=torch.float64)
    # real block form of the complex pair keeps A real
    L = torch.diag(target.real.to(torch.float64))
    L[2, 3], L[3, 2] = 0.1, -0.1
    A = basis @ L @ torch.linalg.inv(basis)
    X = torch.randn(8, 300, generator=g, dtype=torch.float64)
    spec = layer_spectrum(X, A @ X, DMDSettings(kappa=True))
    kappa_x = condition(X - X.mean(1, keepdim=True))
    assert _max_matching_distance(spec.eigenvalues, target) < eigenvalue_tolerance(8, spec.kappa, kappa_x, 1.2)
    assert spec.n_kept == 8  # an exactly linear map leaves no ResDMD residual
    assert spec.eta_nl < residual_tolerance(8, kappa_x, A @ X, X)
    assert spec.near_unit_mass == pytest.approx(4 / 8)  # 0.95+-0.1i (|.|=0.955), 1.0, 1.04
    assert spec.expansive_mass == pytest.approx(1 / 8)
    assert spec.gap_mass == pytest.approx(1 / 8)
    assert spec.contractive_mass == pytest.approx(2 / 8)
    assert spec.spectral_radius == pytest.approx(1.2)


def test_masses_on_hand_made_spectra_respect_band_edges():
    lam = torch.tensor([1.06, 1.05, 0.90, 0.6 + 0.8j, 0.89, 0.80, 0.79, 0.0], dtype=torch.complex128)
    m = spectral_masses(lam)
    assert m == {"expansive_mass": 1 / 8, "near_unit_mass": 3 / 8, "gap_mass": 2 / 8, "contractive_mass": 2 / 8}
    assert sum(m.values()) == pytest.approx(1.0)


def test_identity_transition_is_degenerate_and_excluded_from_aggregates():
    X, Y = _snapshots(d=8, n=200)
    identity = layer_spectrum(X, X.clone())
    assert identity.degenerate and identity.update_ratio < 1e-12
    assert identity.near_unit_mass == 1.0  # what the paper warns about: A ~ I looks "near-unit"
    live = layer_spectrum(X, Y)
    assert not live.degenerate
    agg = aggregate([identity, live])
    assert agg["near_unit_mass_mean"] == pytest.approx(live.near_unit_mass)


def test_auto_equals_textbook_full_dmd_when_full_rank():
    X, Y = _snapshots(d=24, n=500, seed=3)
    auto = layer_spectrum(X, Y, DMDSettings(rank="auto", kappa=True))
    full = layer_spectrum(X, Y, DMDSettings(rank="full", kappa=True))
    kappa_x = condition(X - X.mean(1, keepdim=True))
    tol = eigenvalue_tolerance(24, auto.kappa, kappa_x, auto.spectral_radius)
    # masses count eigenvalues in bands: equal unless one lies within tol of a band edge (none here)
    for name in ("near_unit_mass", "expansive_mass", "contractive_mass", "gap_mass"):
        assert getattr(auto, name) == getattr(full, name), name
    assert auto.spectral_radius == pytest.approx(full.spectral_radius, abs=tol)
    assert auto.eta_nl == pytest.approx(full.eta_nl, abs=tol)  # ||fit error|| moves with A, no faster
    assert auto.kappa == pytest.approx(full.kappa, rel=eigenvector_tolerance(24, auto.kappa, kappa_x))
    assert torch.equal(auto.kept.sum(), full.kept.sum())


def test_data_subspace_estimator_drops_only_the_structural_zeros_when_d_exceeds_n():
    X, Y = _snapshots(d=40, n=25, seed=4)
    full = layer_spectrum(X, Y, DMDSettings(rank="full", kappa=True))
    auto = layer_spectrum(X, Y, DMDSettings(rank="auto"))
    assert full.eigenvalues.numel() == 40 and auto.eigenvalues.numel() == 24  # rank N-1 after centring
    # full DMD whitens a rank-deficient covariance: its round-off is amplified by kappa(W), and its
    # eigenvector matrix (structural zeros included) by full.kappa; its structural zeros are that small too
    tol = eigenvalue_tolerance(40, full.kappa, zca_condition(X, DMDSettings().eps), full.spectral_radius)
    structural = full.eigenvalues[full.eigenvalues.abs() < tol]
    assert structural.numel() == 40 - 24
    nonzero = full.eigenvalues[full.eigenvalues.abs() >= tol]
    tol += float32_solve_tolerance(24, full.kappa, full.spectral_radius)  # auto's default float32 solve
    assert _max_matching_distance(auto.eigenvalues, nonzero) < tol
    # the structural zeros are what caps full DMD's near-unit mass at (N-1)/d
    assert full.near_unit_mass <= 24 / 40
    assert auto.near_unit_mass == pytest.approx(full.near_unit_mass * 40 / 24)


def test_rank_r_is_dmd_in_the_leading_principal_subspace_and_full_rank_is_auto():
    X, Y = _snapshots(d=32, n=300, seed=5)
    a = layer_spectrum(X, Y, DMDSettings(rank=8, kappa=True))
    assert a.eigenvalues.numel() == 8 and "leading 8-dim principal subspace" in a.estimator
    default = DMDSettings(rank=8)
    assert torch.equal(layer_spectrum(X, Y, default).eigenvalues, layer_spectrum(X, Y, default).eigenvalues)
    # by hand: project the centred snapshots on the top-8 left singular vectors, then least squares
    Xc, Yc = X - X.mean(1, keepdim=True), Y - Y.mean(1, keepdim=True)
    P = torch.linalg.svd(Xc, full_matrices=False).U[:, :8].T
    reference = torch.linalg.eigvals((P @ Yc) @ torch.linalg.pinv(P @ Xc))
    tol = eigenvalue_tolerance(8, a.kappa, condition(P @ Xc), a.spectral_radius)
    assert _max_matching_distance(a.eigenvalues, reference) < tol
    # at or above the data's rank, the subspace is all of it: the same operator as `auto`
    whole, auto = layer_spectrum(X, Y, DMDSettings(rank=64)), layer_spectrum(X, Y, DMDSettings(kappa=True))
    tol = eigenvalue_tolerance(32, auto.kappa, condition(Xc), auto.spectral_radius)
    tol += float32_solve_tolerance(32, auto.kappa, auto.spectral_radius)  # `whole` solves in float32
    assert _max_matching_distance(whole.eigenvalues, auto.eigenvalues) < tol


def test_eigenvalues_alone_unless_kappa_or_the_filter_needs_the_eigenvectors():
    X, Y = _snapshots(d=24, n=300, seed=7)
    fast, slow = layer_spectrum(X, Y), layer_spectrum(X, Y, DMDSettings(kappa=True))
    assert math.isnan(fast.kappa) and math.isfinite(slow.kappa) and slow.kappa >= 1.0
    # the eigenvalues alone come from a float32 solve; the eigenvector path stays in float64
    tol = float32_solve_tolerance(24, slow.kappa, slow.spectral_radius)
    assert _max_matching_distance(fast.eigenvalues, slow.eigenvalues) < tol
    assert _max_matching_distance(fast.eigenvalues, slow.eigenvalues) < tol
    assert fast.eta_nl == pytest.approx(slow.eta_nl, rel=1e-12)
    assert math.isnan(layer_spectrum(X, Y, DMDSettings(residual_tol=0.1)).kappa)  # filter alone: no kappa


@pytest.mark.parametrize(("d", "n"), [(24, 300), (40, 25)])
def test_the_fit_from_gram_products_equals_the_fit_on_whitened_snapshots(d, n):
    X, Y = _snapshots(d=d, n=n, seed=8)
    gram = layer_spectrum(X, Y, DMDSettings(kappa=True))
    # any ResDMD cut makes `auto` whiten the snapshots explicitly; an infinite one keeps every eigenvalue
    direct = layer_spectrum(X, Y, DMDSettings(kappa=True, residual_tol=math.inf))
    assert direct.n_kept == gram.eigenvalues.numel() == min(d, n - 1)
    _assert_profiles_agree(gram, direct, condition(X - X.mean(1, keepdim=True)), d, n, EPS64)
    if n - 1 <= d:  # an exact fit: no residual to measure either way
        assert math.isnan(gram.eta_nl) and math.isnan(direct.eta_nl)


def _assert_profiles_agree(
    ours: LayerSpectrum, reference: LayerSpectrum, kappa_x: float, d: int, n: int, eps: float
) -> None:
    """Two profiles of the same (d, n) snapshots, one with products at precision ``eps``, agree within
    first-order bounds: Bauer-Fike for the eigenvalues (``reference`` computed kappa(V)), and for
    squared norms formed as differences of Gram terms, round-off relative to ||Y~||^2 <= ||X~||^2 (1 + u)^2."""
    tol = eigenvalue_tolerance(max(d, n), reference.kappa, kappa_x, reference.spectral_radius, eps=eps)
    assert _max_matching_distance(ours.eigenvalues, reference.eigenvalues) < tol
    u = reference.update_ratio
    assert ours.update_ratio == pytest.approx(u, rel=n * eps * kappa_x * (1 + u) ** 2 / u**2)
    if n - 1 > d:
        scale = (1 + u) ** 2 / (reference.eta_nl * u) ** 2
        assert ours.eta_nl == pytest.approx(reference.eta_nl, rel=n * eps * kappa_x * scale)


def _precision_taken(X: torch.Tensor) -> torch.dtype:
    """The precision ``auto`` forms the Gram matrix and products of float32 states in."""
    X = X.to(torch.float64)
    return _gram_eigh(X - X.mean(1, keepdim=True), torch.float32)[3]


@pytest.mark.parametrize(("d", "n"), [(24, 300), (40, 25)])
def test_float32_states_are_profiled_in_float32_within_its_round_off(d, n):
    """A screen's states are float32: `auto` then forms its Gram matrix and products in float32
    when that resolves them, and must agree with the float64 computation on the same values
    within the float32 version of the same error bounds (d > N: the structural zero is allowed)."""
    X, Y = (M.to(torch.float32) for M in _snapshots(d=d, n=n, seed=10))
    assert _precision_taken(X) == torch.float32  # the fast path is the one under test
    single = layer_spectrum(X, Y, DMDSettings(kappa=True))  # eigenvalues from float64 eig: products alone differ
    double = layer_spectrum(X.double(), Y.double(), DMDSettings(kappa=True))
    assert single.eigenvalues.numel() == double.eigenvalues.numel() == min(d, n - 1)
    Xc = X.double() - X.double().mean(1, keepdim=True)
    _assert_profiles_agree(single, double, condition(Xc), d, n, EPS32)


def test_float32_states_float32_cannot_resolve_are_profiled_in_float64():
    """States in a low-dim span (a small vocabulary's embeddings) carry float32 round-off in the
    other directions; a float32 Gram matrix cannot tell those from signal, so `auto` forms it in
    float64, and the result is the float64 computation's to the bit: same rank, same numbers."""
    g = torch.Generator().manual_seed(11)
    X = torch.randn(24, 10, generator=g) @ torch.randn(10, 300, generator=g)  # float32, rank 10
    Y = X + torch.tanh(torch.randn(24, 24, generator=g) / 5 @ X)
    assert _precision_taken(X) == torch.float64
    single, double = layer_spectrum(X, Y), layer_spectrum(X.double(), Y.double())
    assert single.eigenvalues.numel() == 10
    assert torch.equal(single.eigenvalues, double.eigenvalues)
    assert single.eta_nl == double.eta_nl and single.update_ratio == double.update_ratio


def test_float32_states_beyond_float32_products_are_profiled_in_float64():
    X = torch.randn(6, 100, generator=torch.Generator().manual_seed(12))
    Y = 8e37 * X  # float32 states, finite; in float32 their products overflow (inf - inf: NaN norms)
    assert torch.isfinite(Y).all()
    spec = layer_spectrum(X, Y)
    assert spec.spectral_radius == pytest.approx(8e37, rel=1e-5)
    assert spec.expansive_mass == 1.0


def test_resdmd_filter_falls_back_and_flags_when_nothing_survives():
    X, Y = _snapshots(d=12, n=300, seed=6)
    unfiltered = layer_spectrum(X, Y, DMDSettings(residual_tol=None))
    assert unfiltered.n_kept == 12 and not unfiltered.filter_fallback
    strict = layer_spectrum(X, Y, DMDSettings(residual_tol=1e-12))
    assert strict.filter_fallback and strict.n_kept == 12
    assert strict.notes


def _ill_conditioned_snapshots(d: int, n: int, cond: float, noise: float, seed: int = 0):
    """Y = A X + noise for an operator A = V diag(lambda) V^-1 whose eigenvectors have condition ~``cond``."""
    g = torch.Generator().manual_seed(seed)
    Q1, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    Q2, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    V = Q1 @ torch.diag(torch.logspace(0, -math.log10(cond), d, dtype=torch.float64)) @ Q2
    lam = 0.2 + 1.2 * torch.rand(d, generator=g, dtype=torch.float64)  # real, distinct, across every band
    A = V @ torch.diag(lam) @ torch.linalg.inv(V)
    X = torch.randn(d, n, generator=g, dtype=torch.float64)
    return X, A @ X + noise * torch.randn(d, n, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("cond", [1e2, 1e5])
def test_resdmd_residuals_equal_eq10_with_lapack_s_own_left_eigenvectors(cond):
    """The filter reads u* from the rows of V^-1 and the residual from Gram matrices; Eq. 10 directly,
    with the left eigenvectors LAPACK computes for the same operator, gives the same residuals up
    to the round-off kappa(V) amplifies."""
    from scipy.linalg import eig
    from scipy.optimize import linear_sum_assignment

    d, n = 48, 400
    X, Y = _ill_conditioned_snapshots(d, n, cond, noise=0.05)
    spec = layer_spectrum(X, Y, DMDSettings(kappa=True, residual_tol=math.inf))
    Xc, Yc = X - X.mean(1, keepdim=True), Y - Y.mean(1, keepdim=True)
    Xw, Yw, Vh, sx = whiten(Xc, Yc, DMDSettings().eps)  # the auto estimator's basis
    lam, vl = eig(((Yw @ Vh.T) / sx).numpy(), left=True, right=False)  # vl[:, j]^H A = lam_j vl[:, j]^H
    U = torch.from_numpy(vl).conj().T
    Xz, Yz = Xw.to(torch.complex128), Yw.to(torch.complex128)
    lam = torch.from_numpy(lam)
    direct = torch.linalg.vector_norm(U @ Yz - lam[:, None] * (U @ Xz), dim=1) / torch.linalg.vector_norm(U @ Xz, dim=1)
    direct = direct * math.sqrt((n - 1) / (n - 1 - d))
    rows, cols = linear_sum_assignment((spec.eigenvalues[:, None] - lam[None, :]).abs().numpy())
    assert spec.kappa > cond / 10  # the operator is as ill-conditioned as built
    tol = eigenvector_tolerance(d, spec.kappa, condition(Xc)) * float(direct.max())
    assert float((spec.residuals[rows] - direct[cols]).abs().max()) < tol
    # what a wrong formula would give is far outside that: the uncorrected residual differs by 6%
    assert float((direct * math.sqrt((n - 1 - d) / (n - 1)) - direct).abs().max()) > 1e3 * tol


@pytest.mark.parametrize("d", [32, 256, 768])
def test_resdmd_residual_estimates_the_noise_at_every_width(d):
    """Noise of size sigma in every whitened direction: the corrected residual reads sigma whether the
    fit spent 3% or 75% of the sample's degrees of freedom; uncorrected it would read 0.5 sigma at d = 768."""
    sigma, n = 0.05, 1024
    X, Y = _ill_conditioned_snapshots(d, n, cond=10.0, noise=sigma, seed=d)
    spec = layer_spectrum(X, Y, DMDSettings(residual_tol=math.inf))
    # per eigenvalue, ||u*E||^2 / sigma^2 ||u*X~||^2 ~ chi^2 over N - 1 - r; the median over d of them is
    # far tighter than its 4 standard errors sqrt(2 / (N - 1 - r)) used here
    assert float(spec.residuals.median()) == pytest.approx(sigma, rel=4 * math.sqrt(2 / (n - 1 - d)))
    assert spec.n_kept == d  # an infinite cut keeps everything


def test_the_filter_keeps_at_every_width_what_its_threshold_says():
    sigma, n = 0.05, 1024
    for d in (32, 768):
        X, Y = _ill_conditioned_snapshots(d, n, cond=10.0, noise=sigma, seed=d)
        assert layer_spectrum(X, Y, DMDSettings(residual_tol=1.5 * sigma)).n_kept == d, d
        assert layer_spectrum(X, Y, DMDSettings(residual_tol=0.5 * sigma)).filter_fallback, d


def test_rejects_mismatched_snapshots():
    with pytest.raises(ValueError, match="shape"):
        layer_spectrum(torch.zeros(4, 10), torch.zeros(5, 10))


@pytest.mark.parametrize("d", [64, 256])
def test_known_spectrum_is_recovered_at_every_width(d):
    """Issue 13's test bed: a 32-dim system with known masses (nonlinearity and noise included),
    embedded in d dims. Both estimators recover the exact counts; with 1% ambient noise in all d
    directions only the rank-32 principal subspace does (auto fits the noise directions too)."""
    from benchmarks.known_spectrum import recovery

    clean = recovery(d)
    assert clean["max_mass_error"] == 0.0 and clean["eigenvalues"] == 32
    assert recovery(d, settings=DMDSettings(rank=32), ambient=0.01)["max_mass_error"] == 0.0
    assert recovery(d, ambient=0.01)["max_mass_error"] > 0.2  # the documented limitation of `auto`


def test_an_operator_beyond_float32_range_is_solved_in_float64():
    X, _ = _snapshots(d=6, n=100, seed=9)
    spec = layer_spectrum(X, 1e40 * X)  # a block that scales its input by 1e40: A = 1e40 I
    assert spec.spectral_radius == pytest.approx(1e40, rel=1e-9)
    assert spec.expansive_mass == 1.0


def _sequences(n_seq: int, per_seq: int, d: int, seed: int, B: torch.Tensor):
    """Token states that share their sequence's context, as a prefix makes them: Y = X + tanh(B X)."""
    g = torch.Generator().manual_seed(seed)
    context = torch.randn(d, n_seq, generator=g, dtype=torch.float64)
    X = context.repeat_interleave(per_seq, 1) + 0.5 * torch.randn(d, n_seq * per_seq, generator=g, dtype=torch.float64)
    return X, X + torch.tanh(B @ X), torch.arange(n_seq).repeat_interleave(per_seq)


def test_eta_nl_of_a_larger_screen_is_read_on_the_calibrations_sample_design():
    """A linear map fits states of fewer sequences better, so eta_nl over all of a 4x larger sample
    (4x the sequences) reads higher than a calibration-size sample's; read on groups of whole
    sequences of the calibration's size it estimates the same value. Tolerance: 3 standard errors of
    the difference, from the samples' own spread."""
    d = 24
    B = 1.5 * torch.randn(d, d, generator=torch.Generator().manual_seed(99), dtype=torch.float64) / math.sqrt(d)
    settings = DMDSettings(eta_tokens=256)
    small = torch.tensor([layer_spectrum(*_sequences(32, 8, d, k, B)[:2], settings).eta_nl for k in range(20)])
    grouped, whole = [], []
    for k in range(5):
        X, Y, sequences = _sequences(128, 8, d, 100 + k, B)
        grouped.append(layer_spectrum(X, Y, settings, sequences).eta_nl)
        whole.append(layer_spectrum(X, Y, settings).eta_nl)  # no sequences: the whole sample
    grouped, whole = torch.tensor(grouped), torch.tensor(whole)
    se = math.sqrt(small.var() / small.numel() + grouped.var() / grouped.numel())
    assert abs(float(grouped.mean() - small.mean())) < 3 * se
    assert float(whole.mean() - small.mean()) > 3 * se


def test_eta_nl_groups_are_whole_sequences_and_the_eigenvalues_use_every_state():
    X, Y = _snapshots(6, 250)
    sequences = torch.arange(250) // 25  # 10 sequences of 25 states; 100 states = 4 sequences
    spec = layer_spectrum(X, Y, DMDSettings(eta_tokens=100), sequences)
    whole = DMDSettings(eta_tokens=None)
    groups = [(0, 100), (100, 200), (150, 250)]  # sequences 0-3, 4-7 and the last four, 6-9
    parts = [layer_spectrum(X[:, a:b], Y[:, a:b], whole).eta_nl for a, b in groups]
    assert spec.eta_nl == pytest.approx(sum(parts) / 3, rel=1e-12)
    assert torch.equal(spec.eigenvalues, layer_spectrum(X, Y, whole).eigenvalues)


def test_eta_nl_groups_change_nothing_at_or_below_eta_tokens_or_when_a_group_would_fit_exactly():
    X, Y = _snapshots(6, 100)
    sequences = torch.arange(100) // 10
    whole = layer_spectrum(X, Y, DMDSettings(eta_tokens=None)).eta_nl
    assert layer_spectrum(X, Y, DMDSettings(eta_tokens=100), sequences).eta_nl == whole
    X, Y = _snapshots(12, 40)  # d >= eta_tokens - 1: a group's fit is exact, so the whole sample is read
    exact = layer_spectrum(X, Y, DMDSettings(eta_tokens=10), torch.arange(40) // 4)
    assert math.isfinite(exact.eta_nl)
    assert exact.eta_nl == layer_spectrum(X, Y, DMDSettings(eta_tokens=None)).eta_nl
