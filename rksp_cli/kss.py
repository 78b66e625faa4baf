"""Koopman Spectral Shaping (KSS): a training-time penalty on the residual stream's DMD spectra.

RKSP paper, Eqs. 14-15 (method reference, section 4)::

    L_total = L_task + alpha * mean_{l in S} L_KSS^l             S = a random half of the layers
    L_KSS^l = sum_j sig(T(|lam_j| - tau_u)) softplus(|lam_j| - tau_u)^2 + beta (m_soft - gamma)^2
    m_soft  = (1/r) sum_j sig(T(|lam_j| - tau_l)) sig(T(tau_u - |lam_j|))

``variant="growth"`` (ours, issue 15; the published form is ``variant="paper"``, the default)
replaces the eigenvalue terms by a penalty on the whitened operator's largest singular value,
softplus(sigma_max(A) - tau_u)^2. Eigenvalue moduli bound only the operator's asymptotic growth;
a non-normal operator (kappa(V) of 1e3-1e4 is common here) can amplify a state by far more than
|lambda_max| in one application, and sigma_max bounds that transient growth: |A^k| <= sigma_max^k.

Usage in a plain PyTorch loop (the hooks read the states of the training forward pass itself)::

    kss = KoopmanSpectralShaping(blocks, alpha=0.15, every=10)
    loss = task_loss + kss(step)

Design choices where the paper is silent:

* beta = 1, gamma = 0.4, every 10 steps, layers sampled uniformly, at most 2048 token states.
* Gradients flow through the centred snapshots; the rank-r subspace and the whitening matrix are
  constants. The estimator is the screen's own rank-r one (``koopman.subspace_whitening`` and
  ``fit_operator``): the leading principal subspace of the *centred* states (exact top singular
  vectors), whitened inside. Finding the subspace on
  already-whitened states, as a literal reading of the paper suggests, picks random directions
  (whitened, every direction is equally loud) including near-null ones whose whitening gain
  multiplies the penalty's gradient: measured on the no-norm GPT, KSS steps then carried gradient
  norms of 20-550 by themselves and "diverged" runs whose task loss was fine. Eigenvalues are
  unchanged by whitening inside the subspace (a similarity transform); it only conditions B B^T.
* Mixed precision: the DMD runs with autocast switched off, in float64, whatever the dtype of
  the hidden states; the penalty is cast back to their dtype.
* Safety: the eigen-decomposition runs in float64 with a tiny random diagonal jitter (separating
  repeated eigenvalues, where eigenvalue gradients blow up), |lambda| is smoothed at 0, gradients
  reaching the operator are cleaned of non-finite values and clipped to ``max_grad`` in norm,
  and a non-finite penalty is skipped (and counted in ``skipped``) rather than returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rksp_cli.koopman import fit_operator, subspace_whitening

VARIANTS = ("paper", "growth")


class KoopmanSpectralShaping:
    def __init__(
        self,
        blocks: Sequence[nn.Module],
        alpha: float = 0.15,
        every: int = 10,
        fraction: float = 0.5,
        rank: int = 32,
        tau_u: float = 1.05,
        tau_l: float = 0.90,
        temperature: float = 20.0,
        beta: float = 1.0,
        gamma: float = 0.4,
        max_tokens: int = 2048,
        eps: float = 1e-5,
        max_grad: float = 1.0,
        seed: int = 0,
        variant: str = "paper",
    ):
        if not blocks:
            raise ValueError("KSS needs at least one residual block")
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
        self.variant = variant
        self.blocks = list(blocks)
        self.alpha, self.every, self.fraction, self.rank = alpha, every, fraction, rank
        self.tau_u, self.tau_l, self.temperature = tau_u, tau_l, temperature
        self.beta, self.gamma, self.max_tokens, self.eps, self.max_grad = beta, gamma, max_tokens, eps, max_grad
        self.generator = torch.Generator().manual_seed(seed)
        self.applied = 0  # on-schedule steps that returned a penalty
        self.skipped = 0  # layer penalties dropped as non-finite
        self.last_soft_mass: float | None = None  # m_soft averaged over the last application's layers
        self._soft_masses: list[float] = []
        self._states: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._handles = [b.register_forward_hook(self._hook(i), with_kwargs=True) for i, b in enumerate(self.blocks)]

    def _hook(self, index: int):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            if not torch.is_grad_enabled():  # evaluation passes are not training steps
                return
            x = args[0] if args else kwargs["hidden_states"]  # transformers layers may take it by name
            y = output[0] if isinstance(output, (tuple, list)) else output
            self._states[index] = (x, y)

        return hook

    def remove(self) -> None:
        """Detach the hooks from the model."""
        for handle in self._handles:
            handle.remove()

    def __call__(self, step: int) -> torch.Tensor:
        """The weighted penalty for this step's forward pass (zero off schedule)."""
        states, self._states = self._states, {}
        if step % self.every or not states:
            return torch.zeros(())
        indices = sorted(states)
        k = max(1, round(self.fraction * len(indices)))
        chosen = [indices[i] for i in torch.randperm(len(indices), generator=self.generator)[:k].tolist()]
        self._soft_masses = []
        terms = [self.layer_penalty(*states[i]) for i in chosen]
        terms = [t for t in terms if t is not None]
        if not terms:
            return torch.zeros(())
        self.applied += 1
        if self._soft_masses:  # the published variant's m_soft; the growth variant has none
            self.last_soft_mass = sum(self._soft_masses) / len(self._soft_masses)
        return self.alpha * torch.stack(terms).mean()

    def layer_penalty(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        """L_KSS for one transition from hidden states (..., d) with their autograd graph."""
        if self.variant == "growth":
            with torch.autocast(x.device.type, enabled=False):
                sigma = torch.linalg.matrix_norm(self.operator(x, y), 2)
            penalty = F.softplus(sigma - self.tau_u).square()
            if not torch.isfinite(penalty):
                self.skipped += 1
                return None
            return penalty.to(x.dtype)
        lam = self.eigenvalues(x, y)
        mod = torch.sqrt(lam.real.square() + lam.imag.square() + 1e-12)  # |lambda|, smooth at 0
        t = self.temperature
        unstable = (torch.sigmoid(t * (mod - self.tau_u)) * F.softplus(mod - self.tau_u).square()).sum()
        m_soft = (torch.sigmoid(t * (mod - self.tau_l)) * torch.sigmoid(t * (self.tau_u - mod))).mean()
        penalty = unstable + self.beta * (m_soft - self.gamma) ** 2
        if not torch.isfinite(penalty):
            self.skipped += 1
            return None
        self._soft_masses.append(float(m_soft.detach()))
        return penalty.to(x.dtype)

    def eigenvalues(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Rank-r whitened DMD eigenvalues, differentiable in the snapshots (float64, even under autocast)."""
        with torch.autocast(x.device.type, enabled=False):
            A = self.operator(x, y)
            jitter = 1e-9 * torch.randn(A.shape[0], generator=self.generator, dtype=A.dtype).to(A.device)
            return torch.linalg.eigvals(A + torch.diag(jitter))

    def operator(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The rank-r whitened DMD operator (r x r, float64), differentiable in the snapshots."""
        X = x.reshape(-1, x.shape[-1]).to(torch.float64)
        Y = y.reshape(-1, y.shape[-1]).to(torch.float64)
        if X.shape[0] > self.max_tokens:
            keep = torch.randperm(X.shape[0], generator=self.generator)[: self.max_tokens].to(X.device)
            X, Y = X[keep], Y[keep]
        X, Y = X.T, Y.T  # (d, N): columns are token states
        Xc = X - X.mean(1, keepdim=True)
        Yc = Y - Y.mean(1, keepdim=True)
        # the screen's rank-r estimator (koopman.py): subspace and whitening constant, as the paper
        # detaches Omega and W; the regulariser is relative to the states' mean variance
        scale = float(Xc.detach().square().mean()) * Xc.shape[1] / (Xc.shape[1] - 1)
        W = subspace_whitening(Xc, self.rank, self.eps * scale)
        A = fit_operator(W @ Xc, W @ Yc)  # differentiable through Xc and Yc
        if A.requires_grad:
            A.register_hook(self._clean_gradient)
        return A

    def _clean_gradient(self, grad: torch.Tensor) -> torch.Tensor:
        grad = torch.nan_to_num(grad, nan=0.0, posinf=0.0, neginf=0.0)
        norm = torch.linalg.norm(grad)
        return grad * (self.max_grad / norm) if norm > self.max_grad else grad

    def __repr__(self) -> str:
        return (
            f"KoopmanSpectralShaping(alpha={self.alpha}, every={self.every}, fraction={self.fraction}, "
            f"rank={self.rank}, beta={self.beta}, gamma={self.gamma}, layers={len(self.blocks)}, "
            f"variant={self.variant!r})"
        )
