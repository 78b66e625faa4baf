"""Spectral entropy of the attention QK update (Monitors paper, arXiv 2606.28116; reference section 6.1).

Signal: per head, the bilinear form M = W_Q W_K^T changes over delta steps by
Delta_1 = Delta_2 + Delta_3 with the first-order term Delta_2 = dQ W_K^T + W_Q dK^T = A B^T,
A = [dQ | W_Q], B = [W_K | dK] (weights at t - delta). Its singular values come from the 2 d_k x
2 d_k Gram matrices A^T A and B^T B (O(d d_k^2) per head, never a d x d matrix).
The normalised entropy H = -sum p_i ln p_i / ln(2 d_k), p = s / sum(s), is high while updates spread
over many directions and falls when they concentrate, the footprint of a coherent low-rank
gradient error such as biased low-precision rounding in attention.

Defaults (design choices): delta = 4 check intervals (200 steps at every=50); per layer, the mean
over heads is scored against its own history by a robust z of the drop (median/MAD of the last
``WINDOW`` = 40 checks, after dropping the first ``BURN_IN`` = 10 values and none before 10 more);
warning at z >= ``Z`` = 5, alarm at z >= 5 on 3 consecutive checks, if a second layer breaches at
that check or the layer fell 10% or more below its median (below). Grouped query attention pairs
each query head with its key/value group.

Why (issue 16; the shared ``DriftAlarm`` default is 20 checks, z = 4, no burn-in): with that, 2 of 18
healthy deep Pre-LN runs (12 layers, 5000 steps) alarmed, each on one layer. A median/MAD of 20
checks is itself noisy, and 12 layers x 100 checks give it many chances; 40 checks and z = 5 alarm
on none of them, in a replay of the saved series, and before 7 of 12 deep Post-LN failures (6
before). But in the fault harness (600 steps, a check every 10) 40 checks reach back into early
training, whose fast changes inflate the MAD and hid the attention-precision drop (0 of 6 seeds,
against 5 of 6); dropping the first 10 values brings 4 of 6 back and changes nothing late in a
long run. Neighbours: a window of 30 also stays quiet on every deep control; z = 4.5 does not (1
of 18). Chosen in-sample on those runs, then run on fresh seeds (README).

Only layers whose updates usually spread are scored (``SPREAD``): a drop counts only while the
history's median entropy means at least 4 effective directions, (2 d_k)^H (the exponential of the
unnormalised entropy). Why (issue 16): 3 of the 4 false alarms on 30 healthy deep Post-LN runs (lr
0.001, seeds 0-5 and 30-53) came on block 0, whose QK update settles near H = 0.27, about 3 of its
64 directions, and dips to 0.22 for a few hundred steps mid-run. A failure's coherent low-rank error
turns a spread update into a concentrated one; an update already confined to 3 directions has
nothing left to concentrate. Every alarm before a failure on those seeds' failing runs came on a
layer spread over 23-31 directions; the width-64 runs' alarms (all after their failures) over 5, so
4 sits between the two groups. The fourth false alarm (seed 2, block 1: 0.80 -> 0.72, 27
directions) looks like a failure's and stays. The cost: a layer confined to fewer than 4 directions
is not watched by this monitor. Chosen in-sample on seeds 0-53 (the rule reads only the logged
entropies, so saved runs rescore exactly) before any run of seeds 54-59 was scored; those are its
held-out check (README).

A second layer, or a deep fall (issue 16, from seeds 186 on): a layer's streak alarms at a check
where ``corroborate`` (2) watched layers breach, or where its own entropy lies ``alone_fall`` (10%)
or more below its median; else it stays a warning. Why: the held-out Pre-LN false alarms on seeds
172 and 175 were one layer's fall of 8.9% and 7.5% with every other layer quiet (for seed 78 the
other layers were not recorded), while a failure's coherent error reaches neighbouring layers.
Asking a second layer alone, stated before 174-179, removed 175's alarm there but silenced the
fault harness's stuck gradient, which reaches block 0 only; that fault's lone fall is 86% at its
first alarm, hence the exemption. 10% was chosen on seeds 132-179 and the fault harness, stated
before 180-185 and judged on them by replay (benchmarks/candidate_replay.py): no control alarm
under either rule, one failing run's first alarm 100 steps later, no lead bar lost. Its cost: a
failure whose first sign is one layer's fall of under 10% alarms later or not at all (attention
precision's one-block alarm in the fault harness moves from step 340 to 360). A model with fewer
watched layers than ``corroborate`` asks all of them. ``corroborate`` 1 is the former rule.

Cost per check: copying W_Q and W_K, per head two float64 Gram products of d x 2 d_k matrices on the
weights' device, O(d d_k^2), and on the CPU a Cholesky and a symmetric eigenvalue problem of size 2 d_k.
Memory: one copy of every layer's W_Q and W_K per check in the window. Why Grams, not the thin QRs
and SVD of earlier releases (issue 16): at width 512 on an H100 those cost 25-118% of a training
step. Matrix products are what a GPU does fast; small factorisations are not (cuSOLVER works
through a batch of eigenproblems larger than 32 x 32 one matrix at a time, pytorch/pytorch#175585),
and on the host they cost little. On one CPU core the Grams cost about the same as the QRs at width
512 (0.98-1.22x over nine runs) and 1.4x less at 128 (README); the values agree to float32
round-off (tests). Not yet timed on a GPU.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

import torch
from torch import nn

from rksp_cli.monitors.base import Alert, DriftAlarm, linear_weight

WINDOW = 40  # checks of history the robust z is scored against
Z = 5.0  # robust sd of a drop that counts as a breach
BURN_IN = 10  # first values per layer left out of the history: early training is not a baseline
SPREAD = 4.0  # effective directions a layer's updates must usually spread over for a drop to count
CORROBORATE = 2  # layers that must breach at one check for a streak to alarm ...
ALONE_FALL = 0.1  # ... unless the layer fell this far below its median (math.inf: never alone)


@dataclass
class QKSite:
    """Where one attention layer keeps W_Q and W_K, as (heads x d_k, d) row blocks, and how it makes
    its queries and keys from the input of ``source``."""

    name: str
    weights: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    n_heads: int
    n_kv_heads: int
    source: nn.Module  # the module whose input (tokens x d) the queries and keys are computed from
    project: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]  # tokens x d -> q, k (heads, tokens, d_k)


def _split_heads(x: torch.Tensor, n: int, repeat: int = 1) -> torch.Tensor:
    """(tokens, n x d_k) -> (n x repeat, tokens, d_k); ``repeat`` pairs grouped key heads with their queries."""
    return x.reshape(x.shape[0], n, -1).transpose(0, 1).repeat_interleave(repeat, dim=0)


def find_attention(model: nn.Module) -> list[QKSite]:
    """The built-in GPT's fused qkv, transformers-style q_proj / k_proj pairs, or GPT-2's fused c_attn.

    ``project`` is exact for the built-in GPT (its ``heads``, qk-norm included); for transformers
    layers it is the projections alone: rotary embeddings and any per-head q/k norm are left out.
    """
    from rksp_cli.models.gpt import CausalSelfAttention

    config = getattr(model, "config", None)
    sites = []
    for name, m in model.named_modules():
        if isinstance(m, CausalSelfAttention):
            d = m.qkv.in_features

            def own(x: torch.Tensor, m: CausalSelfAttention = m) -> tuple[torch.Tensor, torch.Tensor]:
                q, k, _ = m.heads(x.unsqueeze(0))
                return q[0], k[0]

            sites.append(
                QKSite(name, lambda m=m, d=d: (m.qkv.weight[:d], m.qkv.weight[d : 2 * d]), m.n_heads, m.n_heads, m, own)
            )
            continue
        heads = getattr(config, "num_attention_heads", None)
        if heads is None:
            continue
        kv = getattr(config, "num_key_value_heads", None) or heads
        q, k = (getattr(m, n, None) for n in ("q_proj", "k_proj"))
        if q is not None and k is not None and linear_weight(q) is not None and linear_weight(k) is not None:

            def pair(x: torch.Tensor, q: nn.Module = q, k: nn.Module = k, h: int = heads, kv: int = kv):
                return _split_heads(q(x), h), _split_heads(k(x), kv, h // kv)

            sites.append(QKSite(name, lambda q=q, k=k: (linear_weight(q), linear_weight(k)), heads, kv, q, pair))
        elif linear_weight(fused := getattr(m, "c_attn", None)) is not None and not getattr(m, "is_cross_attention", 0):
            # GPT-2: one fused Conv1D holds W_Q, W_K and W_V, each d x d
            d = linear_weight(fused).shape[1]

            def split(x: torch.Tensor, f: nn.Module = fused, d: int = d, h: int = heads):
                q, k, _ = f(x).split(d, dim=-1)
                return _split_heads(q, h), _split_heads(k, h)

            sites.append(
                QKSite(
                    name,
                    lambda f=fused, d=d: (linear_weight(f)[:d], linear_weight(f)[d : 2 * d]),
                    heads,
                    heads,
                    fused,
                    split,
                )
            )
    return sites


def delta2_entropy(
    q0: torch.Tensor, k0: torch.Tensor, q1: torch.Tensor, k1: torch.Tensor, n_heads: int, n_kv: int
) -> torch.Tensor:
    """Normalised spectral entropy of Delta_2 for every head, from weights at t - delta (0) and t (1).

    The squared singular values of A B^T are the eigenvalues of L^T G_B L, G_A = A^T A = L L^T: two
    batched matrix products on the weights' device, then 2 d_k x 2 d_k factorisations on the CPU.
    Float64 Grams keep what squaring the condition number would lose in float32.
    """
    d_k = q0.shape[0] // n_heads

    def heads(w: torch.Tensor, n: int) -> torch.Tensor:  # (n, d, d_k)
        return w.double().reshape(n, d_k, -1).transpose(1, 2)

    Q0, K0 = heads(q0, n_heads), heads(k0, n_kv)
    A = torch.cat([heads(q1, n_heads) - Q0, Q0], dim=2)
    B = torch.cat([K0, heads(k1, n_kv) - K0], dim=2)
    # cuSOLVER loops over a batch of eigenproblems larger than 32 x 32 one matrix at a time
    G_A = (A.mT @ A).cpu()
    G_B = (B.mT @ B).cpu().repeat_interleave(n_heads // n_kv, dim=0)
    L, info = torch.linalg.cholesky_ex(G_A)
    if bool((singular := info > 0).any()):  # a head whose W_Q did not move: any square root will do
        lam, V = torch.linalg.eigh(G_A[singular])
        L[singular] = V * lam.clamp_min(0).sqrt().unsqueeze(1)
    return spectral_entropy(torch.linalg.eigvalsh(L.mT @ G_B @ L).clamp_min(0).sqrt()).float()


def spectral_entropy(s: torch.Tensor) -> torch.Tensor:
    """Each row's -sum p ln p / ln(n), p = s / sum(s): 1 for n equal singular values, 0 for one."""
    p = s / s.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)
    return -torch.special.xlogy(p, p).sum(dim=-1) / math.log(s.shape[-1])


def spectrum_widths(sites: Iterable[QKSite]) -> dict[str, int]:
    """Each layer's 2 d_k: how many singular values its QK update's entropy is spread over."""
    return {site.name: 2 * site.weights()[0].shape[0] // site.n_heads for site in sites}


class UpdateConcentration:
    """The alarm rule (module docstring) apart from the measurement: each check's per-layer mean entropy
    against the layer's own history. It reads nothing else, so a logged run's ``qk_entropy_mean/*``
    metrics, fed back check by check with the layers' ``spectrum_widths``, rescore it exactly."""

    def __init__(
        self, widths: Mapping[str, int], corroborate: int = CORROBORATE, alone_fall: float = ALONE_FALL
    ) -> None:
        if corroborate < 1:
            raise ValueError(f"corroborate counts layers, at least 1; got {corroborate}")
        if not alone_fall >= 0:
            raise ValueError(f"alone_fall is a fraction of the median, at least 0; got {alone_fall}")
        self.widths = dict(widths)
        self.corroborate = min(corroborate, len(self.widths))
        self.alone_fall = alone_fall
        self.alarms = {
            name: DriftAlarm(
                AttentionSpectralEntropy.name,
                "QK-update spectral entropy",
                direction=-1,
                z=Z,
                window=WINDOW,
                burn_in=BURN_IN,
            )
            for name in self.widths
        }

    def score(self, step: int, layer: str, entropy: float) -> Alert | None:
        """The layer's alert at this check, if any, before corroboration; its history takes the
        value either way."""
        alarm = self.alarms[layer]
        baseline = alarm.drift.baseline()
        alert = alarm.update(step, layer, entropy)
        if baseline is not None and self.widths[layer] ** baseline < SPREAD:
            return None  # updates already confined to a few directions: nothing left to concentrate
        return alert

    def judge(self, step: int, entropies: Mapping[str, float]) -> list[Alert]:
        """One check's alerts over the layers measured at it: a streak's alarm stands when
        ``corroborate`` layers breach at this check or its layer fell ``alone_fall`` or more below
        its median, and is otherwise reported as a warning."""
        breaches = []
        for layer, entropy in entropies.items():
            median = self.alarms[layer].drift.baseline()
            if (alert := self.score(step, layer, entropy)) and median is not None:  # a breach always has one
                breaches.append((alert, 1 - entropy / median))
        if len(breaches) >= self.corroborate:
            return [alert for alert, _ in breaches]
        alone = f", alone: fewer than {self.corroborate} layers breach"
        if math.isfinite(self.alone_fall):
            alone += f" and it fell less than {self.alone_fall:.0%}"
        return [
            replace(a, level="warning", reason=a.reason + alone) if a.level == "alarm" and fall < self.alone_fall else a
            for a, fall in breaches
        ]

    def rescore(self, checks: Iterable[tuple[int, Mapping[str, float]]]) -> list[Alert]:
        """The alerts of a logged run's checks, (step, metrics) in order, under this rule."""
        alerts = []
        for step, metrics in checks:
            entropies = {layer: metrics[key] for layer in self.widths if (key := f"qk_entropy_mean/{layer}") in metrics}
            alerts += self.judge(step, entropies)
        return alerts


class AttentionSpectralEntropy:
    name = "attention_entropy"

    def __init__(
        self, sites: list[QKSite], lag_checks: int = 4, corroborate: int = CORROBORATE, alone_fall: float = ALONE_FALL
    ):
        if not sites:
            raise ValueError("attention spectral entropy found no W_Q / W_K pairs")
        self.sites = sites
        self.snapshots: deque[list[tuple[torch.Tensor, torch.Tensor]]] = deque(maxlen=lag_checks + 1)
        self.rule = UpdateConcentration(spectrum_widths(sites), corroborate, alone_fall)

    def restored(self) -> None:
        """The weights were set back to an earlier state (a guard's rollback). A difference across
        that is no training update: it is the whole stretch discarded, and on the failing runs of
        seeds 121 and 123 its entropy, measured on the next 3 checks, set off a second rollback and
        then, one check later, a third. So no QK update spans the restore, and no streak of drops
        counted before it carries over; the history a drop is scored against stays."""
        self.snapshots.clear()
        for alarm in self.rule.alarms.values():
            alarm.persistence.clear()

    def check(self, step: int, loss: float | None = None) -> tuple[dict[str, float], list[Alert]]:
        now = [tuple(w.detach().clone() for w in site.weights()) for site in self.sites]
        self.snapshots.append(now)
        if len(self.snapshots) < self.snapshots.maxlen:
            return {}, []
        base = self.snapshots[0]
        metrics: dict[str, float] = {}
        means: dict[str, float] = {}
        for site, (q0, k0), (q1, k1) in zip(self.sites, base, now, strict=True):
            h = delta2_entropy(q0, k0, q1, k1, site.n_heads, site.n_kv_heads)
            means[site.name] = metrics[f"qk_entropy_mean/{site.name}"] = float(h.mean())
            metrics[f"qk_entropy_min/{site.name}"] = float(h.min())
        return metrics, self.rule.judge(step, means)
