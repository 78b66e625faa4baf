"""R-Metric (EMNLP 2025 Industry Track; reference section 7): R = 0.10 l + 0.45 s2 + 0.70 dL.

Components, each normalised over the last 100 checks:

* l: hardware events since the previous check, measured, never simulated: step-time stragglers
  (a step slower than 3x the median of the last 50), and on NVIDIA GPUs (with ``pynvml``) new
  volatile ECC errors, PCIe replays and hardware/thermal slowdown reasons (not yet run on a GPU).
  No GPU: stragglers only.
* s2: variance across parameter tensors of their gradient L2 norms (read before clipping),
  scored by factors (below).
* dL: |loss - mean of the last <= 10 checked losses|, 10 when the loss is non-finite.

Cost per check: one L2 norm per parameter tensor (a pass over the gradients); per step, one clock read.

``variant="published"`` is the paper's rule: min-max normalisation over the window (the current
check included) and an alert at R > 0.57. Its known weakness (reference, caveat 3): any new local
maximum maps to 1, so the fast loss drop of early training alone gives R >= 0.70.
``variant="robust"`` (the default) keeps the weights and the 0.57 line but maps each component to
clip(z / 12, 0, 1), z its robust upward z-score (median/MAD over the window, none before 20 checks,
which is also the warm-up blackout). dL alone then alerts from z >= 9.8, and a steady loss
decrease does not. These constants are ours, not the paper's. The scale and the warm-up went
from 8 and 10 checks to 10 and 20 after a clean run of the fault harness (batch 16, a noisy loss)
alarmed once on noise; the scale went from 10 to 12 after healthy 12-block models (the deep
Pre-LN controls of ``failures.py``, 5000 steps) alarmed late in training on 4 of 12 seeds, R
0.57-0.62, mostly from the slow rise of the gradient norms' variance. Replayed over those runs'
saved components (exact: R reads nothing else), 12 leaves none of those alarms and keeps the 4
of 12 failing deep Post-LN runs it alarmed ahead of (at 10 the healthy ones alarmed as often).
A larger scale only removes alarms: R falls at every check.

s2 is scored by factors (the z-score of its log): on fresh healthy deep runs (seeds 18-29) the
scale of 12 still alarmed on 4 of 12, each time s2 at 8-27x its recent median (ordinary there:
it swings by factors from check to check, so a linear z-score saturates its 0.45) beside a loss
wiggle of z 2-5. Replayed over all 30 healthy deep runs' logged components, log scoring leaves
no alarm (5 before; the largest R 0.44); on 22 failing deep runs R then alarms on 7 (9 before),
24-447 steps ahead, mostly from the loss as it turns; the width-64 runs' alarms do not change.
A choice made after seeing those runs: fresh seeds 30-35 were run to test it (README).

The paper's dL counts a fall in the loss as it counts a rise. On held-out Pre-LN control 161 (a
healthy 12-block run) that gave R 0.58 at the first check the robust variant scores, the loss 0.82
below the mean of the checks before it while it still fell fast: caveat 3's early loss drop, past
the warm-up. ``rises_only`` scores the loss term 0 when the loss is below that mean; the term's
history still takes |dL|, so its scale is unchanged. It is the robust variant's default (a
divergence raises the loss; a fall is progress) and off for ``variant="published"``, the paper's
rule. Stated after that run, before the seeds that judged it (162-167,
``benchmarks/candidate_replay.py --r-rises-only yes``): on the saved runs of 132-161 it removes
that alarm and moves no other; on 162-167 it moved nothing. Shipped from seeds 168 on.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from typing import Literal

import torch
from torch import nn

from rksp_cli.monitors.base import Alert, RobustDrift

WEIGHTS = {"lambda": 0.10, "sigma2": 0.45, "dloss": 0.70}
RISES_ONLY = {"robust": True, "published": False}  # per variant: does dL score only a rise? (docstring)
THRESHOLD, WINDOW, Z_FULL, WARMUP_CHECKS = 0.57, 100, 12.0, 20
STRAGGLER_FACTOR, STEP_WINDOW = 3.0, 50


class HardwareEvents:
    """Counts real fault events between calls of ``take``; ``tick`` once per training step."""

    def __init__(self) -> None:
        self.step_times: deque[float] = deque(maxlen=STEP_WINDOW)
        self.last_tick: float | None = None
        self.pending = 0
        self.nvml = _nvml_counters()
        self.nvml_last = self.nvml() if self.nvml else 0

    def tick(self) -> None:
        now = time.perf_counter()
        if self.last_tick is not None:
            dt = now - self.last_tick
            if len(self.step_times) >= 10 and dt > STRAGGLER_FACTOR * statistics.median(self.step_times):
                self.pending += 1
            self.step_times.append(dt)
        self.last_tick = now

    def take(self) -> int:
        events, self.pending = self.pending, 0
        if self.nvml:
            total = self.nvml()
            events += total - self.nvml_last
            self.nvml_last = total
        return events


def _nvml_counters():
    """A function summing the GPU's fault counters, or None where NVML is not available."""
    if not torch.cuda.is_available():
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        slowdown = pynvml.nvmlClocksThrottleReasonHwSlowdown | pynvml.nvmlClocksThrottleReasonSwThermalSlowdown
    except Exception:  # no pynvml, a driver without NVML, or a pynvml without these names: stragglers only
        return None

    def counters() -> int:
        total = 0
        for read in (
            lambda: pynvml.nvmlDeviceGetTotalEccErrors(
                handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
            ),
            lambda: pynvml.nvmlDeviceGetPcieReplayCounter(handle),
            lambda: int(bool(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle) & slowdown)),
        ):
            try:
                total += int(read())
            except Exception:  # a counter this GPU does not support
                pass
        return total

    return counters


def gradient_norm_variance(model: nn.Module) -> float:
    norms = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
    if len(norms) < 2:
        return 0.0
    return float(torch.stack(norms).var(unbiased=False))


class RMetric:
    name = "r_metric"

    def __init__(
        self, model: nn.Module, variant: Literal["robust", "published"] = "robust", rises_only: bool | None = None
    ):
        """``rises_only``: score the loss term only when the loss is above its recent mean; None takes
        the variant's rule (robust: yes; published: no, as the paper)."""
        if variant not in ("robust", "published"):
            raise ValueError(f"variant must be 'robust' or 'published', got {variant!r}")
        self.model, self.variant = model, variant
        self.rises_only = RISES_ONLY[variant] if rises_only is None else rises_only
        self.events = HardwareEvents()
        self.losses: deque[float] = deque(maxlen=10)
        self.history = {k: deque(maxlen=WINDOW) for k in WEIGHTS}
        self.drift = {
            k: RobustDrift(direction=1, window=WINDOW, min_history=WARMUP_CHECKS, log=k == "sigma2") for k in WEIGHTS
        }

    def tick(self) -> None:
        self.events.tick()

    def check(self, step: int, loss: float | None) -> tuple[dict[str, float], list[Alert]]:
        if loss is None:
            return {}, []
        change = self.loss_change(loss)
        raw = {"lambda": float(self.events.take()), "sigma2": gradient_norm_variance(self.model), "dloss": abs(change)}
        return self.score(step, raw, fell=change < 0)

    def loss_change(self, loss: float) -> float:
        """dL with its sign: the loss less the mean of the last <= 10 checked finite losses (0 at the
        first check, 10 for a non-finite loss, which the mean leaves out); remembers the loss."""
        if not math.isfinite(loss):
            return 10.0
        change = loss - statistics.fmean(self.losses) if self.losses else 0.0
        self.losses.append(loss)
        return change

    def score(self, step: int, raw: dict[str, float], fell: bool = False) -> tuple[dict[str, float], list[Alert]]:
        """R, and its alarm, from one check's measured components (``raw``: lambda, sigma2, dloss)
        against the earlier checks'; ``fell``: the loss was below its recent mean. R reads nothing
        else, so feeding a logged run's ``r_*`` metrics here check by check (and the sign of
        ``loss_change`` on its losses) rescores it exactly under today's rule."""
        scaled = {k: self._normalise(k, raw[k]) for k in WEIGHTS}
        if fell and self.rises_only:
            scaled["dloss"] = 0.0
        r = sum(WEIGHTS[k] * scaled[k] for k in WEIGHTS)
        metrics = {f"r_{k}": v for k, v in raw.items()} | {"r_metric": r}
        alerts = []
        if r > THRESHOLD:
            main = max(WEIGHTS, key=lambda k: WEIGHTS[k] * scaled[k])
            reason = f"R {r:.2f} > {THRESHOLD} ({self.variant}), mostly {main} = {raw[main]:.3g}"
            alerts.append(Alert(step, self.name, None, r, THRESHOLD, "alarm", reason))
        return metrics, alerts

    def _normalise(self, key: str, value: float) -> float:
        if not math.isfinite(value):  # a non-finite gradient is as abnormal as it gets; keep it out of history
            return 1.0
        if self.variant == "robust":
            z = self.drift[key].score(value)
            return min(max((z or 0.0) / Z_FULL, 0.0), 1.0)
        window = self.history[key]
        window.append(value)
        lo, hi = min(window), max(window)
        return (value - lo) / (hi - lo) if hi > lo else 0.0
