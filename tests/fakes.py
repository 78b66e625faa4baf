"""Stand-ins shared by the tests."""

import math

from rksp_cli.monitors.base import Alert
from rksp_cli.monitors.failures import WatchedRun


class AlarmsAt:
    """Stands in for a Monitor: an alarm on the given steps, whatever the model does."""

    names, seconds = ["fake"], {"fake": 0.0}

    def __init__(self, steps, every: int = 5):
        self.steps, self.every = set(steps), every
        self.restores = 0  # how often a guard said it set the weights back

    def snapshot(self):
        return {"fake": self.restores}  # what a rollback should bring back: the count when taken

    def restored(self, snapshot=None):
        self.restores += 1
        self.restored_snapshot = snapshot

    def step(self, step, loss=None):
        return [Alert(step, "fake", None, 1.0, 0.5, "alarm", "test")] if step in self.steps else []

    def remove(self):
        """No hooks to detach."""


def saved_run(
    series: list[dict],
    monitor: str,
    kind: str = "failing",
    failure: str = "post_ln_without_warmup",
    losses: list[float] | None = None,
    exploded_step: int | None = None,
    seed: int = 7,
) -> WatchedRun:
    """A run as benchmarks/monitors.py saves it, for the replays that read its checks (``series``):
    watched by ``monitor`` alone, with no alerts logged, gradient norms of 1, and ``losses`` (flat at
    4.0 over 50 steps a check unless given)."""
    losses = [4.0] * (50 * len(series)) if losses is None else losses
    steps = len(losses)
    return WatchedRun(
        failure, kind, seed, steps, losses, [1.0] * steps, exploded_step, [], [monitor], 0.1, {}, series=series
    )


ALIGNED_LAYER = "blocks.3.attn.qkv"  # fed by a LayerNorm, not by an activation: never exempt
SPREAD, COLLAPSED = 0.95, 0.1  # sign entropies (bit) either side of spectral alignment's lines


def collapsing_run(growth: float, kind: str = "control_low_lr", collapse: bool = True, seed: int = 3) -> WatchedRun:
    """A deep run watched by spectral alignment, checked every 50 steps, whose one watched layer's
    inputs are spread for 40 checks while sigma_1 wanders (log increments of +-0.01 and a little
    more), then, with ``collapse``, fall to one side of v1 while sigma_1 grows by ``growth`` in log a
    check."""
    log_sigma, series = 0.0, []
    for i in range(60):
        late = i >= 40
        log_sigma += growth if late else (0.01 if i % 2 else -0.01) * (1 + (i % 5) / 10)
        entropy = COLLAPSED if late and collapse else SPREAD
        metrics = {f"sa_entropy/{ALIGNED_LAYER}": entropy, f"sa_sigma1/{ALIGNED_LAYER}": math.exp(log_sigma)}
        series.append({"step": 50 * (i + 1), "metrics": metrics})
    return saved_run(series, "spectral_alignment", kind, seed=seed)
