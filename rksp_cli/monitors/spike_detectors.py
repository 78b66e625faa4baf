"""The loss-spike detectors teams already run, re-implemented from their sources, for head-to-head
comparison with rksp's monitors on the same runs (issue 16).

Each sees one step at a time, ``update(loss, grad_norm) -> bool`` (True: it fires on this step),
and keeps only the state its original keeps. Their rules, read from the code:

* **Lightning** ``SpikeDetection`` (``lightning/fabric/utilities/spike.py``): a running mean of the
  last ``window`` = 10 finite losses; from batch ``warmup`` = 1 on, a loss that is not below the
  previous one and differs from the running mean by at least ``rtol`` = 2 times that mean is a
  spike; with ``finite_only`` (the default) a non-finite loss is a spike too. It raises.
* **OLMo-core** ``SkipStepOptimizer`` (``olmo_core/optim/skip_step_optimizer.py``): the last 128
  losses and gradient norms before this step; once at least max(20, 128 // 2) = 64 are held, a
  step whose loss or gradient-norm z-score (against their mean and sample standard deviation)
  exceeds ``sigma_factor`` = 6 is skipped. The skipped step's values still enter the window, and
  a flat history skips too (torch's 0/0 is NaN, and NaN <= 6 is false).
* **llm-foundry** ``KillLossSpike`` (``llmfoundry/callbacks/kill_loss_spike_callback.py``): once
  the window holds 100 losses, a loss at least 2x their mean is an outlier; more than
  ``patience`` = 4 consecutive outliers is a spike; and from step 200 on, half the window above
  ``loss_cap`` = 10 is a persistently high loss. Either fires.
* **Megatron-LM** ``--check-for-spiky-loss``: a loss more than ``SPIKY_LOSS_FACTOR`` = 10 times the
  largest loss seen so far, or a non-finite one (its NaN check is on by default).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Protocol


class Detector(Protocol):
    name: str

    def update(self, loss: float, grad_norm: float | None = None) -> bool: ...


class LightningSpikeDetection:
    name = "Lightning SpikeDetection"

    def __init__(self, window: int = 10, warmup: int = 1, rtol: float = 2.0, atol: float | None = None):
        self.window: deque[float] = deque(maxlen=window)
        self.warmup, self.rtol, self.atol = warmup, rtol, atol
        self.last, self.batch = 0.0, 0

    def update(self, loss: float, grad_norm: float | None = None) -> bool:
        batch, self.batch = self.batch, self.batch + 1
        if batch < self.warmup:
            spike = False
        elif not math.isfinite(loss):
            spike = True
        elif loss - self.last <= 0:  # an improvement is never a spike
            spike = False
        else:
            mean = statistics.fmean(self.window) if self.window else math.nan
            diff = abs(loss - mean)
            spike = (self.atol is None or diff >= abs(self.atol)) and diff >= abs(self.rtol * mean)
        if not spike and math.isfinite(loss):
            self.window.append(loss)
            self.last = loss
        return spike


class OlmoSkipStep:
    name = "OLMo-core SkipStepOptimizer"

    def __init__(self, interval: int = 128, sigma_factor: float = 6.0):
        self.losses: deque[float] = deque(maxlen=interval + 1)
        self.grads: deque[float] = deque(maxlen=interval + 1)
        self.interval, self.sigma = interval, sigma_factor

    def update(self, loss: float, grad_norm: float | None = None) -> bool:
        self.losses.append(loss)
        if grad_norm is not None:
            self.grads.append(grad_norm)
        if len(self.losses) < max(20, self.interval // 2):
            return False
        # skip unless every z-score is <= sigma: a NaN z-score (a NaN value, or 0/0) skips, as in torch
        return not _z(self.losses) <= self.sigma or (len(self.grads) > 2 and not _z(self.grads) <= self.sigma)


def _z(values: deque[float]) -> float:
    """|latest - mean| / sample standard deviation of the values before it, with torch's x/0 and
    its NaN mean and standard deviation of a window holding a non-finite value."""
    *history, latest = values
    if not all(math.isfinite(v) for v in history):
        return math.nan  # torch: every z-score is NaN until the value leaves the window
    diff, std = abs(latest - statistics.fmean(history)), statistics.stdev(history)
    if std > 0:
        return diff / std
    return math.inf if diff > 0 else math.nan  # x/0 and 0/0 (and NaN) as torch has them


class FoundryKillLossSpike:
    name = "llm-foundry KillLossSpike"

    def __init__(self, window: int = 100, outlier_multiplier: float = 2.0, patience: int = 4, loss_cap: float = 10.0):
        self.window: deque[float] = deque(maxlen=window)
        self.multiplier, self.patience, self.cap = outlier_multiplier, patience, loss_cap
        self.outliers, self.step = 0, 0

    def update(self, loss: float, grad_norm: float | None = None) -> bool:
        step, self.step = self.step, self.step + 1
        fired = False
        if len(self.window) == self.window.maxlen:
            if loss >= statistics.fmean(self.window) * self.multiplier:
                self.outliers += 1
                fired = self.outliers > self.patience
            else:
                self.outliers = 0
            if not fired:  # the original checks persistently high losses whenever no spike fired
                high = sum(1 for v in self.window if v > self.cap)
                fired = step >= 2 * self.window.maxlen and high >= self.window.maxlen / 2
        self.window.append(loss)
        return fired


class MegatronSpikyLoss:
    name = "Megatron-LM spiky loss"

    def __init__(self, factor: float = 10.0):
        self.factor, self.largest = factor, -math.inf

    def update(self, loss: float, grad_norm: float | None = None) -> bool:
        if not math.isfinite(loss):
            return True
        fired = self.largest > 0 and loss > self.factor * self.largest
        self.largest = max(self.largest, loss)
        return fired


DETECTORS = (LightningSpikeDetection, OlmoSkipStep, FoundryKillLossSpike, MegatronSpikyLoss)


def first_alarm(detector: Detector, losses: list[float], grad_norms: list[float] | None = None) -> int | None:
    """The first step at which ``detector`` fires on a recorded run, or None."""
    for step, loss in enumerate(losses):
        if detector.update(loss, grad_norms[step] if grad_norms else None):
            return step
    return None
