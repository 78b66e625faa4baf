"""What every monitor shares: the alert record, robust drift scores and persistence counters."""

from __future__ import annotations

import math
import statistics
import sys
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch
from torch import nn

MAD_TO_SIGMA = 1.4826  # median absolute deviation of a normal sample, in standard deviations


@dataclass(frozen=True)
class Alert:
    step: int
    monitor: str
    layer: str | None  # the module that tripped it; None for whole-model signals
    value: float
    threshold: float
    level: str  # "warning" (worth a look) or "alarm" (act)
    reason: str  # value and threshold are the signal's (a z-score for monitors scored against history)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Check(Protocol):
    """What ``Monitor`` schedules. Optional extras: ``sampler`` (a TokenSampler, armed for check
    steps), ``tick()`` (called every step), ``remove()`` (detach hooks)."""

    name: str

    def check(self, step: int, loss: float | None) -> tuple[dict[str, float], list[Alert]]: ...


def linear_weight(module: nn.Module) -> torch.Tensor | None:
    """The (out, in) weight of a linear layer: ``nn.Linear``, or transformers' ``Conv1D`` (GPT-2),
    which stores it transposed; None for any other module."""
    if isinstance(module, nn.Linear):
        return module.weight
    conv1d = getattr(sys.modules.get("transformers.pytorch_utils"), "Conv1D", None)  # imported if in use
    if conv1d is not None and isinstance(module, conv1d):
        return module.weight.T
    return None


class TokenSampler:
    """Hooks keeping up to ``tokens`` rows (detached, float32) of each module's input (``side="input"``)
    or output, on armed steps only: ``Monitor`` arms them for the forward pass of a check step."""

    def __init__(
        self, modules: dict[str, nn.Module], tokens: int, generator: torch.Generator, side: str = "input"
    ) -> None:
        if side not in ("input", "output"):
            raise ValueError(f"side must be 'input' or 'output', got {side!r}")
        self.tokens, self.armed, self.generator = tokens, True, generator
        self.inputs: dict[str, torch.Tensor] = {}
        if side == "input":
            self._handles = [m.register_forward_pre_hook(self._hook(name)) for name, m in modules.items()]
        else:
            self._handles = [m.register_forward_hook(self._hook(name)) for name, m in modules.items()]

    def _hook(self, name: str):
        def hook(module: nn.Module, args: tuple, output: torch.Tensor | None = None) -> None:
            if self.armed:
                rows = args[0] if output is None else output
                x = rows.detach().reshape(-1, rows.shape[-1])
                if x.shape[0] > self.tokens:
                    x = x[torch.randperm(x.shape[0], generator=self.generator)[: self.tokens].to(x.device)]
                self.inputs[name] = x.float()

        return hook

    def take(self) -> dict[str, torch.Tensor]:
        """The rows captured since the last call."""
        inputs, self.inputs = self.inputs, {}
        return inputs

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


class RobustDrift:
    """Robust z-score of a new value against the history of earlier checks (median / MAD).

    ``direction`` -1 scores drops, +1 rises. No score until ``min_history`` checks exist, which
    doubles as a warm-up blackout; the first ``burn_in`` values are dropped unscored, so that early
    training's fast changes never become the baseline; the MAD is floored at ``floor`` x |median| so
    that a signal that has been flat to the last digit does not turn a rounding wiggle into a huge z.
    With ``log`` a positive signal is scored as log(value), for one whose ordinary noise is
    multiplicative (a variance that swings 10x between healthy checks): a burst then scores by how
    many times the signal grew, not by how far it moved against a spread set by its small values,
    and ``floor`` stays 1% of the value (in log units).
    """

    def __init__(
        self,
        direction: int,
        window: int = 100,
        min_history: int = 10,
        floor: float = 0.01,
        burn_in: int = 0,
        log: bool = False,
    ):
        self.direction, self.min_history, self.floor, self.log = direction, min_history, floor, log
        self.history: deque[float] = deque(maxlen=window)
        self.burn_in = burn_in

    def score(self, value: float) -> float | None:
        if self.burn_in > 0:
            self.burn_in -= 1
            return None
        if self.log:
            value = math.log(max(value, sys.float_info.min))  # an exact 0: far below any positive value
        z = None
        if (median := self.baseline()) is not None:
            mad = statistics.median(abs(v - median) for v in self.history)
            floor = self.floor if self.log else self.floor * abs(median)
            scale = MAD_TO_SIGMA * max(mad, floor, 1e-12)
            z = self.direction * (value - median) / scale
        self.history.append(value)
        return z

    def baseline(self) -> float | None:
        """The median of the history a new value is scored against (in log units with ``log``), or
        None while it is too short to score."""
        return statistics.median(self.history) if len(self.history) >= self.min_history else None


class Persistence:
    """Counts consecutive breaches per key: an alarm needs ``patience`` checks in a row."""

    def __init__(self, patience: int):
        self.patience = patience
        self.runs: dict[str, int] = {}

    def update(self, key: str, breached: bool) -> bool:
        self.runs[key] = self.runs.get(key, 0) + 1 if breached else 0
        return self.runs[key] >= self.patience

    def clear(self) -> None:
        """Forget every streak: the checks they counted belong to a state the model has left."""
        self.runs.clear()


class DriftAlarm:
    """A signal scored against its own history: a warning at robust z >= ``z``, an alarm once that
    has held for ``patience`` consecutive checks. Shared by the monitors without absolute thresholds.
    With ``min_change`` a breach also needs the value ``min_change`` x |median| or more past the
    median: a signal that drifts steadily in health has a small MAD, so z alone reads a few per
    cent as many sd.

    The history is the last ``window`` checks (20, not the reference's 100): in the fault harness a
    100-check window still held the early-training transient, whose spread hid a later drop (an
    attention-entropy fall from 0.70 to 0.61 scored z = 2). Measured, not taken from a paper.
    """

    def __init__(
        self,
        monitor: str,
        what: str,
        direction: int,
        z: float = 4.0,
        patience: int = 3,
        window: int = 20,
        burn_in: int = 0,
        min_change: float = 0.0,
    ):
        self.monitor, self.what, self.z, self.patience = monitor, what, z, patience
        self.direction, self.min_change = direction, min_change
        self.verb = "fell" if direction < 0 else "rose"
        self.drift = RobustDrift(direction, window=window, burn_in=burn_in)
        self.persistence = Persistence(patience)

    def update(self, step: int, layer: str | None, value: float) -> Alert | None:
        median = self.drift.baseline()
        z = self.drift.score(value)
        breached = z is not None and z >= self.z and self.direction * (value - median) >= self.min_change * abs(median)
        if self.persistence.update("", breached):
            reason = f"{self.what} {value:.3f} {self.verb} {z:.1f} robust sd, {self.patience} checks in a row"
            return Alert(step, self.monitor, layer, z, self.z, "alarm", reason)
        if breached:
            reason = f"{self.what} {value:.3f} {self.verb} {z:.1f} robust sd from its history"
            return Alert(step, self.monitor, layer, z, self.z, "warning", reason)
        return None


class GrowthAlarm:
    """A signal that has left its normal range and keeps growing: an alarm once the value is at
    least ``level`` *and* at least ``growth`` x the smallest of its previous ``lag`` checks (as many
    as exist), on ``patience`` consecutive checks; no alarm before ``warmup`` checks exist.

    For failures that develop as steady growth (attention logits, the output's log-partition
    function): a drift score catches them late or not at all, since a steady trend hardly stands
    out against its own recent history, and a level alone cannot tell a model that grew once and
    holds from one that keeps growing.

    The warm-up was the full ``lag`` (10 checks) until issue 16's held-out runs showed it set the
    alarm's step: every failing run alarmed at the first check it allowed (step 600 at one check
    per 50 steps), with the logits past the level long before. Three checks of history are enough
    for the growth test to mean something; the level is what keeps a healthy model quiet early on
    (its logits start near 1). Chosen before the runs that test it (README, "Natural slow failures").
    """

    def __init__(
        self,
        monitor: str,
        what: str,
        level: float,
        growth: float = 2.0,
        lag: int = 10,
        patience: int = 3,
        warmup: int = 3,
    ):
        if not 1 <= warmup <= lag:
            raise ValueError(f"warmup must be between 1 and lag ({lag}), got {warmup}")
        self.monitor, self.what, self.level, self.growth, self.patience = monitor, what, level, growth, patience
        self.history: dict[str | None, deque[float]] = {}
        self.lag, self.warmup = lag, warmup
        self.persistence = Persistence(patience)

    def update(self, step: int, layer: str | None, value: float) -> Alert | None:
        history = self.history.setdefault(layer, deque(maxlen=self.lag))
        low = min(history) if len(history) >= self.warmup else math.inf
        seen = len(history)
        history.append(value)
        growing = value >= self.level and value >= self.growth * low
        if not self.persistence.update(layer or "", growing):
            return None
        ratio = value / low if low > 0 else math.inf  # a history that held a zero (log Z's first shift)
        reason = (
            f"{self.what} {value:.3g} >= {self.level:g} and {ratio:.1f}x its low of the last {seen} "
            f"checks, {self.patience} checks in a row"
        )
        return Alert(step, self.monitor, layer, value, self.level, "alarm", reason)
