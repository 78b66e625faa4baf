"""Attention-logit growth (Wortsman et al. 2023, arXiv 2309.14322; Dehghani et al. 2023).

Signal: per attention layer, the largest |q . k| / sqrt(d_k) over pairs of sampled input tokens
and every head. Without qk-layernorm, query and key norms grow at a high learning rate until the
softmax saturates (attention entropy collapse, Zhai et al. 2023) and the loss diverges; Wortsman
et al. read the same quantity ("max attention logit") as their predictor of divergence.

Pairs of tokens from different sequences and positions are scored too, so this is the largest
logit the layer could produce between the sampled states, not the largest one it did produce
under the causal mask: same growth, no need to rebuild the attention pattern.

Alarm (``GrowthAlarm``; our choice, not a paper's): a layer's largest logit is at least
``SATURATED`` = 50 and at least 2x the smallest of its last 10 checks, on 3 consecutive checks.
A logit 50 above the others weighs them by e^-50, below float32's resolution, so the softmax is
one-hot between those states; the growth condition keeps quiet a model that learned sharp
attention and holds it there. A drift score was tried first: on the natural failure it alarmed
late (step 1410 at lr 0.1, after a thousand steps of growth) or never (lr 0.03), since steady
growth hardly stands out against its own recent history.

Cost per check and layer: the queries and keys of up to ``tokens`` sampled inputs (one projection)
and an (heads x tokens x tokens) product.
"""

from __future__ import annotations

import math

import torch

from rksp_cli.monitors.attention_entropy import QKSite
from rksp_cli.monitors.base import Alert, GrowthAlarm, TokenSampler

SATURATED = 50.0


def max_logit(q: torch.Tensor, k: torch.Tensor) -> float:
    """Largest |q_i . k_j| / sqrt(d_k) over heads and token pairs; q, k: (heads, tokens, d_k)."""
    return float((q.float() @ k.float().transpose(-2, -1)).abs().amax() / math.sqrt(q.shape[-1]))


class AttentionLogits:
    name = "attention_logits"

    def __init__(self, sites: list[QKSite], tokens: int = 256, seed: int = 0):
        if not sites:
            raise ValueError("attention logits found no attention layers")
        self.sites = {site.name: site for site in sites}
        self.sampler = TokenSampler({s.name: s.source for s in sites}, tokens, torch.Generator().manual_seed(seed))
        self.alarm = GrowthAlarm(self.name, "max attention logit", SATURATED)

    def remove(self) -> None:
        self.sampler.remove()

    @torch.no_grad()
    def check(self, step: int, loss: float | None = None) -> tuple[dict[str, float], list[Alert]]:
        metrics: dict[str, float] = {}
        alerts: list[Alert] = []
        for name, x in self.sampler.take().items():
            site = self.sites[name]
            value = max_logit(*site.project(x.to(next(site.source.parameters()).dtype)))
            metrics[f"attn_logit_max/{name}"] = value
            if alert := self.alarm.update(step, name, value):
                alerts.append(alert)
        if metrics:
            metrics["attn_logit_max"] = max(metrics.values())
        return metrics, alerts
