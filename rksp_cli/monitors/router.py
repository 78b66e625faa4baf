"""MoE router health (Monitors paper, arXiv 2606.28116; reference section 6.2).

Signals, for a router W_R (E x d) with rows w_e and token inputs x:

* routing entropy H_tok = mean_x -sum_e p_e ln p_e with p = softmax(W_R x) before top-k (per token,
  not the entropy of expert load): falls when routing turns over-confident;
* similarity S = mean_{i<j} cos(w_i, w_j): rises when experts become redundant;
* conditioning of the centred router W_R - 1 mu^T (softmax ignores a common shift): logged.

Alarm rule (design choice): H_tok's drop or S's rise at a robust z >= 4 against the layer's own
history (median/MAD of the last 20 checks, none before 10), warning at once and alarm after
3 consecutive checks; a drop of H_tok must also take it ``ENTROPY_DROP`` = 20% below that median.
Why the second test: routing entropy falls steadily while experts specialise, so its MAD is small
and z alone alarmed on 3 of 12 clean runs of the fault harness (``rksp faults``, seeds 0-11: dips
of 6-19% at z 4-9, never three checks in a row past 11%). Of the 12 router collapses, 10 are still
caught (11 before): 6 by an entropy fall of 20% or more, 4 by S's rise, two of those 60 and 80
steps later than before. Chosen on those seeds; later seeds are held out (README). Inputs come
from a forward pre-hook on check steps, up to 2048 tokens.

Cost per check and router: N E d for the logits of N sampled tokens, E^2 d for the similarities and
an SVD of the E x d router: negligible beside a training step.

Routers found: the built-in GPT's ``MoE.router``, and transformers modules named ``gate`` or
``router`` whose weight has one row per expert (config ``num_local_experts`` or ``num_experts``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from rksp_cli.monitors.base import Alert, DriftAlarm, TokenSampler

ENTROPY_DROP = 0.2  # an entropy alarm's least drop below its median, as a share of it


def find_routers(model: nn.Module) -> dict[str, nn.Module]:
    from rksp_cli.models.gpt import MoE

    config = getattr(model, "config", None)
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    routers = {}
    for name, m in model.named_modules():
        if isinstance(m, MoE):
            routers[f"{name}.router"] = m.router
        elif experts and name.rsplit(".", 1)[-1] in ("gate", "router"):
            weight = getattr(m, "weight", None)
            if isinstance(weight, torch.Tensor) and weight.dim() == 2 and weight.shape[0] == experts:
                routers[name] = m
    return routers


@dataclass
class RouterStats:
    entropy: float
    similarity: float
    condition: float
    norm: float


def router_stats(weight: torch.Tensor, x: torch.Tensor) -> RouterStats:
    W = weight.detach().float()
    p = torch.softmax(x @ W.T, dim=-1)
    entropy = float(-(p * torch.log(p.clamp_min(1e-30))).sum(-1).mean())
    unit = W / W.norm(dim=1, keepdim=True).clamp_min(1e-30)
    cos = unit @ unit.T
    E = W.shape[0]
    similarity = float((cos.sum() - cos.diagonal().sum()) / (E * (E - 1))) if E > 1 else 1.0
    s = torch.linalg.svdvals(W - W.mean(0, keepdim=True))[: max(E - 1, 1)]  # the E-1 non-zero ones
    return RouterStats(entropy, similarity, float(s[0] / s[-1].clamp_min(1e-30)), float(s[0]))


class RouterHealth:
    name = "router"

    def __init__(self, routers: dict[str, nn.Module], tokens: int = 2048, seed: int = 0):
        if not routers:
            raise ValueError("router health found no MoE routers")
        self.routers = routers
        self.sampler = TokenSampler(routers, tokens, torch.Generator().manual_seed(seed))
        self.alarms = {
            (n, key): DriftAlarm(self.name, what, direction, min_change=drop)
            for n in routers
            for key, what, direction, drop in (
                ("entropy", "routing entropy", -1, ENTROPY_DROP),
                ("similarity", "expert similarity", 1, 0.0),
            )
        }

    def remove(self) -> None:
        self.sampler.remove()

    def check(self, step: int, loss: float | None = None) -> tuple[dict[str, float], list[Alert]]:
        inputs = self.sampler.take()
        metrics: dict[str, float] = {}
        alerts: list[Alert] = []
        for name, x in inputs.items():
            stats = router_stats(self.routers[name].weight, x)
            metrics.update({f"router_{k}/{name}": v for k, v in vars(stats).items()})
            for key in ("entropy", "similarity"):
                if alert := self.alarms[(name, key)].update(step, name, getattr(stats, key)):
                    alerts.append(alert)
        return metrics, alerts
