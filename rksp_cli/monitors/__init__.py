"""In-training monitors: watch the mechanisms that fail, not only the loss.

    from rksp_cli.monitors import Monitor
    mon = Monitor(model, every=50, log="metrics.jsonl")
    for step, batch in enumerate(loader):
        loss = model(**batch).loss
        loss.backward()
        alerts = mon.step(step, loss=loss)      # after backward, before clipping and zero_grad
        optimizer.step(); optimizer.zero_grad()

``Monitor`` picks the monitors that apply to the model: spectral alignment (every model with
linear layers in its blocks), sub-layer bursts (when the blocks' attention and MLP branches are
found with their norms), attention spectral entropy and attention-logit growth (when W_Q / W_K are
found), output-logit drift (when the vocabulary head is found), MoE router health (when routers are
found) and the R-Metric. Each lives in its own module with its signal,
threshold and cost documented. Between checks ``step`` only records the step time (for the
straggler count) and arms the input hooks for the next check, so the cost is paid on check steps.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from rksp_cli.monitors.attention_entropy import AttentionSpectralEntropy, find_attention
from rksp_cli.monitors.attention_logits import AttentionLogits
from rksp_cli.monitors.base import Alert, Check
from rksp_cli.monitors.output_logits import OutputLogits, find_output_head
from rksp_cli.monitors.r_metric import RMetric
from rksp_cli.monitors.router import RouterHealth, find_routers
from rksp_cli.monitors.spectral_alignment import SpectralAlignment
from rksp_cli.monitors.sublayer_ratio import SublayerRatio, find_sublayers
from rksp_cli.serialize import dumps

MONITORS = (
    "spectral_alignment",
    "sublayer_ratio",
    "attention_entropy",
    "attention_logits",
    "output_logits",
    "router",
    "r_metric",
)

__all__ = ["MONITORS", "Alert", "Monitor"]


def core_model(model: nn.Module) -> nn.Module:
    """The first module, the model itself included, with residual blocks (the built-in GPT's
    ``blocks``, or a transformers ``config``): a LightningModule or any other wrapper holds one.
    The model itself when none does (the monitors that need blocks then say what they missed)."""
    for m in model.modules():
        if isinstance(getattr(m, "blocks", None), nn.ModuleList):
            return m
        if hasattr(getattr(m, "config", None), "num_hidden_layers"):
            return m
    return model


def residual_blocks(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """(module path, blocks): the built-in GPT's blocks, or a transformers model's decoder layers."""
    if isinstance(getattr(model, "blocks", None), nn.ModuleList):
        return "blocks", model.blocks
    from rksp_cli.models.hf import find_blocks

    return find_blocks(model, model.config.num_hidden_layers)


class Monitor:
    """The monitors that apply to a model, checked every ``every`` steps, logged and forwarded."""

    def __init__(
        self,
        model: nn.Module,
        every: int = 50,
        log: str | Path | None = None,
        monitors: Iterable[str] | None = None,
        r_variant: Literal["robust", "published"] = "robust",
        tensorboard: Any = None,
        seed: int = 0,
    ):
        """``monitors``: a subset of MONITORS (default: every one that applies to this model).

        ``tensorboard``: a ``SummaryWriter`` to add the metrics to. Metrics also go to W&B when a
        ``wandb`` run is active in this process (``wandb.log(..., commit=False)``).
        """
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        wanted = set(MONITORS if monitors is None else monitors)
        if unknown := wanted - set(MONITORS):
            raise ValueError(f"unknown monitors {sorted(unknown)}; choose from {', '.join(MONITORS)}")
        self.every, self.tensorboard = every, tensorboard
        model = core_model(model)
        self.monitors: list[Check] = []
        if wanted & {"spectral_alignment", "sublayer_ratio"}:
            prefix, blocks = residual_blocks(model)
        if "spectral_alignment" in wanted:
            self.monitors.append(SpectralAlignment(blocks, prefix, seed=seed))
        if "sublayer_ratio" in wanted and (sublayers := find_sublayers(blocks, prefix)):
            self.monitors.append(SublayerRatio(sublayers))
        sites = find_attention(model) if wanted & {"attention_entropy", "attention_logits"} else []
        if "attention_entropy" in wanted and sites:
            self.monitors.append(AttentionSpectralEntropy(sites))
        if "attention_logits" in wanted and sites:
            self.monitors.append(AttentionLogits(sites, seed=seed))
        if "output_logits" in wanted and (head := find_output_head(model)) is not None:
            self.monitors.append(OutputLogits(head, seed=seed))
        if "router" in wanted and (routers := find_routers(model)):
            self.monitors.append(RouterHealth(routers, seed=seed))
        if "r_metric" in wanted:
            self.monitors.append(RMetric(model, variant=r_variant))
        self.seconds: dict[str, float] = {m.name: 0.0 for m in self.monitors}  # time spent in each check
        self.last_metrics: dict[str, float] = {}
        self.log = Path(log) if log is not None else None
        if self.log is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            self._write({"event": "start", "time": time.time(), "every": every, "monitors": self.names})

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.monitors]

    def step(self, step: int, loss: float | torch.Tensor | None = None) -> list[Alert]:
        """Record this step; on check steps (step % every == 0) run the monitors and return their alerts."""
        for m in self.monitors:
            if hasattr(m, "tick"):
                m.tick()
        if step % self.every:
            self._arm((step + 1) % self.every == 0)
            return []
        loss_value = float(loss.detach()) if isinstance(loss, torch.Tensor) else loss
        metrics: dict[str, float] = {}
        alerts: list[Alert] = []
        for m in self.monitors:
            t0 = time.perf_counter()
            found, raised = m.check(step, loss_value)
            self.seconds[m.name] += time.perf_counter() - t0
            metrics.update(found)
            alerts.extend(raised)
        self._arm((step + 1) % self.every == 0)
        self.last_metrics = metrics
        self._publish(step, loss_value, metrics, alerts)
        return alerts

    def snapshot(self) -> dict[str, Any]:
        """The state of each monitor that brings its history back with the weights on a rollback
        (``sublayer_ratio``), by name: taken with a guard's snapshot of the model."""
        return {m.name: m.snapshot() for m in self.monitors if hasattr(m, "snapshot")}

    def restored(self, snapshot: dict[str, Any] | None = None) -> None:
        """Tell the monitors that measure change over several checks that the model's weights were
        just set back to an earlier state (``Guard``'s rollback), with the ``snapshot`` taken with
        those weights, if any."""
        for m in self.monitors:
            if snapshot is not None and m.name in snapshot:
                m.restored(snapshot[m.name])
            elif hasattr(m, "restored"):
                m.restored()

    def _arm(self, on: bool) -> None:
        for m in self.monitors:
            if hasattr(m, "sampler"):
                m.sampler.armed = on

    def _publish(self, step: int, loss: float | None, metrics: dict[str, float], alerts: list[Alert]) -> None:
        if self.log is not None:
            self._write({"step": step, "time": time.time(), "loss": loss, "metrics": metrics,
                         "alerts": [a.as_dict() for a in alerts]})  # fmt: skip
        if self.tensorboard is not None:
            for key, value in metrics.items():
                self.tensorboard.add_scalar(f"rksp/{key}", value, step)
        wandb = sys.modules.get("wandb")
        if wandb is not None and getattr(wandb, "run", None) is not None:
            wandb.log({f"rksp/{k}": v for k, v in metrics.items()}, commit=False)

    def _write(self, record: dict[str, Any]) -> None:
        with self.log.open("a") as f:  # one line per check, flushed, so `rksp watch` can follow it live
            f.write(dumps(record, indent=None) + "\n")

    def remove(self) -> None:
        """Detach every hook from the model."""
        for m in self.monitors:
            if hasattr(m, "remove"):
                m.remove()
