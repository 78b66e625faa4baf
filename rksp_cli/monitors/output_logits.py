"""Output-logit divergence (Wortsman et al. 2023, arXiv 2309.14322, section 3.2).

Signal: the mean log-partition function log Z = logsumexp(logits) of the language-model head over
the sampled tokens of a check step. Cross-entropy is blind to a shift of all logits, so without
weight decay or z-loss (PaLM's 1e-4 log^2 Z) nothing holds log Z in place: it drifts, very
negative in Wortsman et al.'s runs, until the loss diverges.

Alarm (``GrowthAlarm``; our choice): log Z has moved at least ``SHIFT`` = 10 nats from its value
at the first check (a common shift of every logit by 10; at init log Z is about log(vocabulary))
and that distance is at least 2x its smallest over the last 10 checks, on 3 consecutive checks.
A drift score on |log Z| was tried first and alarmed on a healthy run, whose log Z rose by one
nat as it learned.

Cost per check: a copy of ``tokens`` (256) sampled rows of the logits the forward pass already
made, in float32 (256 x vocabulary floats: 51 MB at a 50k vocabulary), and their logsumexp.
"""

from __future__ import annotations

import torch
from torch import nn

from rksp_cli.monitors.base import Alert, GrowthAlarm, TokenSampler

SHIFT = 10.0


def find_output_head(model: nn.Module) -> nn.Module | None:
    """The vocabulary projection: the built-in GPT's ``head`` or a transformers model's output embeddings."""
    head = getattr(model, "get_output_embeddings", lambda: None)()
    if head is None and isinstance(getattr(model, "head", None), nn.Linear):
        head = model.head
    return head


class OutputLogits:
    name = "output_logits"

    def __init__(self, head: nn.Module, tokens: int = 256, seed: int = 0):
        self.sampler = TokenSampler({"head": head}, tokens, torch.Generator().manual_seed(seed), side="output")
        self.alarm = GrowthAlarm(self.name, "shift of mean log Z since the first check", SHIFT)
        self.first: float | None = None

    def remove(self) -> None:
        self.sampler.remove()

    def check(self, step: int, loss: float | None = None) -> tuple[dict[str, float], list[Alert]]:
        logits = self.sampler.take().get("head")
        if logits is None:
            return {}, []
        log_z = float(torch.logsumexp(logits, dim=-1).mean())
        self.first = log_z if self.first is None else self.first
        alert = self.alarm.update(step, None, abs(log_z - self.first))
        return {"log_z_mean": log_z}, [alert] if alert else []
