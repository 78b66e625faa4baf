"""rksp's monitors as a Lightning ``Callback``, optionally acting on their alarms.

    trainer = Trainer(callbacks=[RkspMonitor(every=50, policy="backoff")])

The loss is read in ``on_before_backward`` and the monitors run in ``on_before_optimizer_step``:
after backward (accumulated gradients) and before Lightning clips them. Metrics go to
``pl_module.log_dict`` under ``rksp/``, so every logger the Trainer has reports them; alerts are
kept in ``alerts``. With ``stop_on_alarm`` an alarm sets ``trainer.should_stop``.

``policy`` (``guard.POLICIES``) acts on alarms through a ``Guard`` on the first optimizer and its
scheduler, on at most ``max_actions`` of them; ``actions`` lists what it did. A callback cannot
skip Lightning's optimizer step, so where the guard skips (``skip``, and the step of a rollback)
the gradients are zeroed instead: Adam then moves by its momentum alone, an approximation of a
skip, not a skip.

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
from rksp_cli.monitors.guard import Guard, check_policy


class RkspMonitor(Callback):
    def __init__(
        self, stop_on_alarm: bool = False, policy: str | None = None, max_actions: int | None = None, **settings: Any
    ):
        """``settings``: as for ``Monitor`` (``every``, ``log``, ``monitors``, ...)."""
        check_policy(policy)
        self.settings, self.stop_on_alarm, self.policy, self.max_actions = settings, stop_on_alarm, policy, max_actions
        self.monitor: Monitor | None = None
        self.guard: Guard | None = None
        self.alerts: list[Alert] = []
        self._loss: float | None = None

    @property
    def actions(self) -> list[dict[str, Any]]:
        return self.guard.actions if self.guard is not None else []

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.monitor = Monitor(pl_module, **self.settings)
        if self.policy is not None:
            configs = getattr(trainer, "lr_scheduler_configs", None) or []
            scheduler = configs[0].scheduler if configs else None
            self.guard = Guard(
                pl_module, trainer.optimizers[0], self.policy, scheduler, self.monitor, max_actions=self.max_actions
            )

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self._loss = float(loss.detach())

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        step = trainer.global_step
        watcher = self.guard or self.monitor
        raised = watcher.step(step, loss=self._loss)
        self.alerts += raised
        if self.guard is not None and self.guard.skip_update:
            optimizer.zero_grad(set_to_none=False)  # the nearest a callback gets to skipping the step
        if step % self.monitor.every == 0 and self.monitor.last_metrics:
            pl_module.log_dict({f"rksp/{k}": v for k, v in self.monitor.last_metrics.items()}, on_step=True)
        if self.stop_on_alarm and any(a.level == "alarm" for a in raised):
            trainer.should_stop = True

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.monitor is not None:
            self.monitor.remove()
