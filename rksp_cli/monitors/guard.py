"""Opt-in actions on rksp's alarms, for a plain training loop: skip the step, back off the learning
rate, or roll back to an earlier state (the remedies of the PaLM, OPT and BLOOM logbooks).

    guard = Guard(model, optimizer, policy="backoff", scheduler=scheduler)
    for step, batch in enumerate(loader):
        loss = model(**batch).loss
        loss.backward()
        guard.step(step, loss)                  # after backward, before clipping
        if not guard.skip_update:
            optimizer.step()
        scheduler.step()
        optimizer.zero_grad()

Policies, each acting on every *alarm* (warnings never act):

* ``skip``: this step's update is skipped (``skip_update``), as OLMo-core's ``SkipStepOptimizer``
  does for its outliers.
* ``backoff``: every learning rate is multiplied by ``factor`` (0.5), the scheduler's base rates
  too so that the schedule keeps the cut; never below ``floor`` (1%) of the original.
* ``rollback``: model and optimizer are restored to the older of the last two snapshots (taken
  every ``snapshot_every`` steps, default 10 checks, so 10-20 checks before the alarm: a slow
  failure starts well before it is seen), and the lr is backed off as above, since replaying the
  same lr replays the failure. The loop's data stream goes on, so the batches in between are
  skipped. The monitors are told (``Monitor.restored``), so that one measuring change over several
  checks (``attention_entropy``) does not read the jump back as an update, and one scoring a check
  against its history (``sublayer_ratio``) has the history of the restored step, taken with the
  snapshot (``Monitor.snapshot``). Memory: two copies of the model's and the optimizer's state.

``max_actions`` caps how many alarms act (default: no cap). Past it, an alarm is recorded as
``ignored`` and the run goes on as it is (``exhausted`` tells a loop that wants to stop instead):
a run that keeps alarming after its remedies needs a person more than a fourth lr cut. With a cap
of 1 it also answers whether a second rollback was needed (``benchmarks/monitors.py
--policies rollback-once``).

``actions`` records what was done and when. Tested on the natural-failure benchmark
(``benchmarks/monitors.py``), where the figures are.
"""

from __future__ import annotations

import copy
from collections import deque
from typing import Any

import torch
from torch import nn

from rksp_cli.monitors import Monitor
from rksp_cli.monitors.base import Alert

POLICIES = ("skip", "backoff", "rollback")


def check_policy(policy: str | None, optional: bool = True) -> None:
    """Refuse an unknown policy (None too, unless ``optional``): callbacks check before they build a Guard."""
    if (policy is None and not optional) or (policy is not None and policy not in POLICIES):
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}{' or None' if optional else ''}, got {policy!r}")


class Guard:
    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        policy: str,
        scheduler: Any = None,
        monitor: Monitor | None = None,
        every: int = 50,
        factor: float = 0.5,
        floor: float = 0.01,
        snapshot_every: int | None = None,
        max_actions: int | None = None,
    ):
        """``monitor``: the monitors whose alarms act (default: ``Monitor(model, every=every)``)."""
        check_policy(policy, optional=False)
        if not 0 < factor < 1 or not 0 < floor <= 1:
            raise ValueError(f"factor must be in (0, 1) and floor in (0, 1], got {factor} and {floor}")
        if max_actions is not None and max_actions < 1:
            raise ValueError(f"max_actions must be at least 1 (None for no cap), got {max_actions}")
        self.model, self.optimizer, self.scheduler, self.policy = model, optimizer, scheduler, policy
        self.monitor = monitor or Monitor(model, every=every)
        self.factor, self.floor = factor, floor
        self.snapshot_every = snapshot_every or 10 * self.monitor.every
        self.scale = 1.0  # the lr's multiplier so far
        self.skip_update = False
        self.snapshots: deque[tuple[int, float, dict, dict, dict]] = deque(maxlen=2)  # step, lr scale, states
        self.actions: list[dict[str, Any]] = []
        self.max_actions = max_actions
        self.acted = 0  # alarms acted on so far

    @property
    def exhausted(self) -> bool:
        """True once ``max_actions`` alarms have been acted on: later ones are only recorded."""
        return self.max_actions is not None and self.acted >= self.max_actions

    @property
    def names(self) -> list[str]:
        return self.monitor.names

    @property
    def seconds(self) -> dict[str, float]:
        return self.monitor.seconds

    def step(self, step: int, loss: float | torch.Tensor | None = None) -> list[Alert]:
        """Run the monitors on this step and act on their alarms; returns the alerts."""
        alerts = self.monitor.step(step, loss)
        alarms = [a for a in alerts if a.level == "alarm"]
        self.skip_update = False
        if self.exhausted:
            if alarms:
                self._record(step, "ignored", f"max_actions ({self.max_actions}) reached", alarms)
            return alerts
        self.acted += bool(alarms)
        self.skip_update = bool(alarms) and self.policy == "skip"
        if self.skip_update:
            self._record(step, "skip", "skipped this step's update", alarms)
        if alarms and self.policy in ("backoff", "rollback"):
            if self.policy == "rollback" and self.snapshots:
                oldest = self.snapshots[0]
                taken, scale, model_state, optimizer_state, monitor_state = oldest
                self.model.load_state_dict(model_state)
                self.optimizer.load_state_dict(optimizer_state)  # its lrs are those of the snapshot's scale
                self.monitor.restored(monitor_state)
                for group in self.optimizer.param_groups:
                    group["lr"] *= self.scale / scale
                self.snapshots.clear()  # the restored state is the next rollback's starting point
                self.snapshots.append(oldest)
                self.skip_update = True  # this step's gradients belong to the state just discarded
                self._record(step, "rollback", f"restored the state of step {taken}", alarms)
            self._back_off(step, alarms)
        elif step % self.snapshot_every == 0 and self.policy == "rollback":
            state = (copy.deepcopy(self.model.state_dict()), copy.deepcopy(self.optimizer.state_dict()))
            self.snapshots.append((step, self.scale, *state, self.monitor.snapshot()))
        return alerts

    def _back_off(self, step: int, alarms: list[Alert]) -> None:
        new = max(self.scale * self.factor, self.floor)
        if new == self.scale:
            return
        ratio, self.scale = new / self.scale, new
        for group in self.optimizer.param_groups:
            group["lr"] *= ratio
        if self.scheduler is not None and hasattr(self.scheduler, "base_lrs"):
            self.scheduler.base_lrs = [lr * ratio for lr in self.scheduler.base_lrs]
        self._record(step, "backoff", f"lr x{self.scale:g} of the original", alarms)

    def _record(self, step: int, action: str, what: str, alarms: list[Alert]) -> None:
        by = sorted({a.monitor for a in alarms})
        self.actions.append({"step": step, "action": action, "what": what, "by": by, "lr_scale": self.scale})

    def remove(self) -> None:
        self.monitor.remove()
