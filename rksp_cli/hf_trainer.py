"""Hugging Face ``Trainer`` integration: KSS in the loss, and the in-training monitors.

``attach_kss`` wraps one trainer instance's ``compute_loss`` rather than asking for a Trainer
subclass, so it composes with trainers that already subclass ``Trainer`` (TRL's SFTTrainer and
the like)::

    trainer = Trainer(model=model, args=args, train_dataset=data)
    kss = attach_kss(trainer, alpha=0.15, every=10)                    # KSS in the training loss
    monitor = attach_monitor(trainer, every=50, log="metrics.jsonl")   # monitors, logged with the rest
    trainer.train()

Both remove their hooks when training ends; attach again before another ``train()``.
Importing this module needs ``transformers`` with ``accelerate`` (as ``Trainer`` itself does).
"""

from __future__ import annotations

from typing import Any

from transformers import Trainer, TrainerCallback

from rksp_cli.kss import KoopmanSpectralShaping
from rksp_cli.models.hf import find_blocks


def attach_kss(trainer: Trainer, **settings: Any) -> KoopmanSpectralShaping:
    """Add the KSS penalty to ``trainer``'s training loss; returns the regularizer (for its settings and counters).

    The schedule follows ``trainer.state.global_step``, so under gradient accumulation every
    micro-batch of an on-schedule step is shaped. Evaluation losses are left alone.
    """
    model = trainer.model
    _, blocks = find_blocks(model, model.config.num_hidden_layers)
    kss = KoopmanSpectralShaping(blocks, **settings)
    task_loss = trainer.compute_loss

    def compute_loss(model: Any, inputs: Any, return_outputs: bool = False, **kwargs: Any) -> Any:
        result = task_loss(model, inputs, return_outputs=return_outputs, **kwargs)
        if not model.training:
            return result
        loss, outputs = result if return_outputs else (result, None)
        loss = loss + kss(trainer.state.global_step)
        return (loss, outputs) if return_outputs else loss

    trainer.compute_loss = compute_loss
    trainer.add_callback(_RemoveHooks(kss))
    return kss


class _RemoveHooks(TrainerCallback):
    def __init__(self, kss: KoopmanSpectralShaping):
        self.kss = kss

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.kss.remove()


class MonitorCallback(TrainerCallback):
    """rksp's in-training monitors in a ``Trainer``: checks run between backward and the optimizer step.

    The loss is read from the model's output in the training forward (a hook on the model), the
    gradients before the optimizer step (``on_pre_optimizer_step``; with gradient clipping on, the
    Trainer clips before this event, so the R-Metric sees clipped norms). Metrics go to the JSON-lines
    log, and into the Trainer's own logs, so TensorBoard, W&B and the rest report them: use
    ``attach_monitor``, which puts this callback ahead of the reporting ones.

    ``policy`` (``rksp_cli.monitors.guard.POLICIES``) acts on alarms through a ``Guard`` on the
    Trainer's optimizer and lr scheduler, on at most ``max_actions`` of them (``actions`` lists
    what it did). A callback cannot skip the Trainer's optimizer step, so where the guard skips,
    the gradients are zeroed instead: Adam then moves by its momentum alone, an approximation of a
    skip.
    """

    def __init__(self, model: Any, policy: str | None = None, max_actions: int | None = None, **settings: Any):
        from rksp_cli.monitors import Monitor
        from rksp_cli.monitors.guard import check_policy

        check_policy(policy)
        self.monitor = Monitor(model, **settings)
        self.model, self.policy, self.max_actions, self.guard = model, policy, max_actions, None
        self.alerts: list = []
        self._loss: float | None = None
        self._latest: dict[str, float] = {}
        self._hook = model.register_forward_hook(self._read_loss)

    def _read_loss(self, module: Any, args: Any, output: Any) -> None:
        loss = getattr(output, "loss", None)
        if module.training and loss is not None:
            self._loss = float(loss.detach())

    @property
    def actions(self) -> list[dict[str, Any]]:
        return self.guard.actions if self.guard is not None else []

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.policy is not None and self.guard is None:
            from rksp_cli.monitors.guard import Guard

            optimizer, scheduler = kwargs["optimizer"], kwargs.get("lr_scheduler")
            cap = self.max_actions
            self.guard = Guard(self.model, optimizer, self.policy, scheduler, self.monitor, max_actions=cap)
        raised = (self.guard or self.monitor).step(state.global_step, loss=self._loss)
        self.alerts += raised
        if self.guard is not None and self.guard.skip_update:
            kwargs["optimizer"].zero_grad(set_to_none=False)  # the nearest a callback gets to skipping
        if state.global_step % self.monitor.every == 0:
            self._latest = {f"rksp/{k}": v for k, v in self.monitor.last_metrics.items()}

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if logs is not None and "loss" in logs:  # training logs only, not evaluation ones
            logs.update(self._latest)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.monitor.remove()
        self._hook.remove()


def attach_monitor(trainer: Trainer, **settings: Any) -> MonitorCallback:
    """Add rksp's monitors to ``trainer`` (settings as for ``Monitor``, and ``policy`` to act on
    alarms); returns the callback, whose ``alerts`` collects every alert raised."""
    callback = MonitorCallback(trainer.model, **settings)
    trainer.callback_handler.callbacks.insert(0, callback)  # before the reporters read the logs
    return callback
