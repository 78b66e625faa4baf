"""rksp's monitors as a Lightning ``Callback``.

    trainer = Trainer(callbacks=[RkspMonitor(every=50, stop_on_alarm=False)])

The loss is read in ``on_before_backward`` and the monitors run in ``on_before_optimizer_step``:
after backward (accumulated gradients) and before Lightning clips them. Metrics go to
``pl_module.log_dict`` under ``rksp/``, so every logger the Trainer has reports them; alerts are
kept in ``alerts``. With ``stop_on_alarm`` an alarm sets ``trainer.should_stop``.

Works with ``lightning`` (``lightning.pytorch``) or ``pytorch_lightning``, whichever is installed;
the callback subclasses that package's ``Callback``, as its Trainer requires.
"""

from __future__ import annotations

from typing import Any

try:
    from lightning.pytorch import Callback
except ImportError:  # the standalone package
    try:
        from pytorch_lightning import Callback
    except ImportError as exc:
        raise ImportError("rksp_cli.monitors.lightning needs lightning or pytorch-lightning installed") from exc

from rksp_cli.monitors import Monitor
from rksp_cli.monitors.base import Alert


class RkspMonitor(Callback):
    def __init__(self, stop_on_alarm: bool = False, **settings: Any):
        """``settings``: as for ``Monitor`` (``every``, ``log``, ``monitors``, ...)."""
        self.settings, self.stop_on_alarm = settings, stop_on_alarm
        self.monitor: Monitor | None = None
        self.alerts: list[Alert] = []
        self._loss: float | None = None

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.monitor = Monitor(pl_module, **self.settings)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self._loss = float(loss.detach())

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        step = trainer.global_step
        raised = self.monitor.step(step, loss=self._loss)
        self.alerts += raised
        if step % self.monitor.every == 0 and self.monitor.last_metrics:
            pl_module.log_dict({f"rksp/{k}": v for k, v in self.monitor.last_metrics.items()}, on_step=True)
        if self.stop_on_alarm and any(a.level == "alarm" for a in raised):
            trainer.should_stop = True

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.monitor is not None:
            self.monitor.remove()
