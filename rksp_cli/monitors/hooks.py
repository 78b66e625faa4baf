"""rksp's monitors in loops rksp does not own: a plain loop or a torchtitan-style trainer (an
optimizer step hook), and Lightning (``rksp_cli.monitors.lightning``).

    monitor = Monitor(model, every=50, log="metrics.jsonl", tensorboard=writer)
    handle = watch_optimizer(optimizer, monitor, loss=lambda: last_loss)
    ...                                         # train as before; handle.remove() to stop

The hook runs after every ``optimizer.step()``: the weights are the updated ones, the gradients
(and the inputs the monitors sampled in that step's forward pass) those of the step just taken.
Metrics go where ``Monitor`` sends them (its JSON-lines log, TensorBoard, an active W&B run) and to
``on_metrics`` if given, e.g. the trainer's own metrics logger.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.hooks import RemovableHandle

from rksp_cli.monitors import Monitor
from rksp_cli.monitors.base import Alert


def watch_optimizer(
    optimizer: torch.optim.Optimizer,
    monitor: Monitor,
    loss: Callable[[], float | torch.Tensor | None] | None = None,
    on_metrics: Callable[[int, dict[str, float], list[Alert]], None] | None = None,
) -> RemovableHandle:
    """Run ``monitor`` after each step of ``optimizer`` (``register_step_post_hook``), counting steps
    from 0. ``loss`` returns the step's loss (the R-Metric's loss term is skipped without it)."""
    step = {"next": 0}

    def hook(opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        now, step["next"] = step["next"], step["next"] + 1
        alerts = monitor.step(now, loss() if loss is not None else None)
        if on_metrics is not None and now % monitor.every == 0:
            on_metrics(now, monitor.last_metrics, alerts)

    return optimizer.register_step_post_hook(hook)
