"""Fault injection: does a monitor alarm before the loss diverges, and is it quiet on a clean run?

One small training job (the built-in pre-LN GPT, d 64, 4 blocks, with a 4-expert MoE in every block, the synthetic
LM, AdamW) runs clean and with each fault switched on at ``inject_at``:

* ``attention_precision``: attention computed by hand with P and P V rounded toward +infinity (a
  biased rounding: every error has the same sign, as with the tied-maximum rounding bias behind
  low-precision flash-attention failures) to ``mantissa_bits`` in the forward and backward pass.
  BF16 keeps 7 bits; the default keeps 3, to make it act within a CPU-sized run.
* ``lr_jump``: the learning rate multiplied by ``lr_factor`` from ``inject_at`` on.
* ``router_collapse``: every router's logit for expert 0 raised by ``router_ramp`` x (steps since
  injection), so routing collapses onto one expert.
* ``grad_corruption``: a fixed rank-one sign pattern of size ``grad_offset`` added to one tensor's
  gradient (the first block's attention qkv weight) before every optimizer step: a stuck,
  consistently signed error that AdamW turns into a steady drift of that weight.

The divergence label is the probe's (loss > 50, gradient norm > 500, or non-finite). A job stops at
divergence. Every alarm is recorded; alarms before ``inject_at`` and all alarms of the clean run are
false alarms. Warnings are recorded but do not count as alarms.

A small pre-LN model rarely diverges by that label (it took a x100 learning-rate jump), so each
alarm is also timed against the step where the loss curve departs from the clean run's (same seed,
same batches; see ``loss_departure``): a monitor is useful when it fires before the loss shows anything.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from rksp_cli.models.gpt import GPT, CausalSelfAttention, GPTConfig, MoE
from rksp_cli.monitors import Alert, Monitor
from rksp_cli.probe import divergence_reason
from rksp_cli.tasks import make_task

DEFAULT_EVERY = 50  # Monitor's default interval: the overhead is reported at it
FAULTS = ("attention_precision", "lr_jump", "router_collapse", "grad_corruption")


@dataclass(frozen=True)
class FaultJob:
    steps: int = 600
    inject_at: int = 200
    every: int = 10  # monitor interval: short runs need a short one
    norm: str = "pre"  # quiet when clean: the no-norm GPT gave spectral alignment hundreds of false alarms
    lr: float = 3e-3
    batch_size: int = 16
    seed: int = 0
    mantissa_bits: int = 3
    lr_factor: float = 100.0
    router_ramp: float = 0.2
    grad_offset: float = 1e-2


@dataclass
class FaultRun:
    fault: str | None
    job: FaultJob
    diverged_step: int | None
    losses: list[float]
    alerts: list[Alert]
    step_seconds: float  # median training step, monitors excluded
    monitor_seconds: dict[str, float]  # mean per check
    monitors: list[str] = field(default_factory=list)

    def first_alarm(self, monitor: str) -> int | None:
        steps = [a.step for a in self.alerts if a.monitor == monitor and a.level == "alarm" and self._after(a)]
        return min(steps) if steps else None

    def false_alarms(self, monitor: str) -> int:
        return sum(1 for a in self.alerts if a.monitor == monitor and a.level == "alarm" and not self._after(a))

    def _after(self, alert: Alert) -> bool:
        return self.fault is not None and alert.step >= self.job.inject_at

    def summary(self, clean: FaultRun | None = None) -> list[dict[str, Any]]:
        """One row per monitor: first alarm after injection, its lead over divergence and (given the
        clean run of the same seed) over the loss's departure from the clean loss; false alarms."""
        departs = loss_departure(self.losses, clean.losses, self.job.inject_at) if clean and self.fault else None
        rows = []
        for name in self.monitors:
            first = self.first_alarm(name)

            def lead(event: int | None, first: int | None = first) -> int | None:
                return event - first if first is not None and event is not None else None

            rows.append({
                "fault": self.fault or "clean", "monitor": name, "diverged_step": self.diverged_step,
                "loss_departs": departs, "first_alarm": first,
                "lead_steps": lead(self.diverged_step), "lead_over_loss": lead(departs),
                "after_injection": first - self.job.inject_at if first is not None and self.fault else None,
                "false_alarms": self.false_alarms(name),
                "overhead_pct": 100 * self.monitor_seconds[name] / (DEFAULT_EVERY * self.step_seconds),
            })  # fmt: skip
        return rows


def loss_departure(
    losses: list[float], reference: list[float], start: int, window: int = 20, margin: float = 0.05
) -> int | None:
    """First step from ``start`` on where the trailing ``window``-step mean loss exceeds the clean
    run's by ``margin`` (relative), or the loss is non-finite: when a loss curve would show the fault.

    Both runs see the same batches (same seed), so the comparison is paired and batch noise cancels.
    """
    for t in range(start, min(len(losses), len(reference))):
        lo = max(0, t - window + 1)
        mine = sum(losses[lo : t + 1]) / (t + 1 - lo)
        if not math.isfinite(mine) or mine > (1 + margin) * sum(reference[lo : t + 1]) / (t + 1 - lo):
            return t
    return None


def round_up(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Round toward +infinity to ``bits`` mantissa bits: every error has the same sign (biased rounding)."""
    ulp = torch.exp2(torch.floor(torch.log2(x.abs().clamp_min(1e-30))) - bits)
    return torch.ceil(x / ulp) * ulp


class _RoundUp(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, bits: int) -> torch.Tensor:
        ctx.bits = bits
        return round_up(x, bits)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return round_up(grad, ctx.bits), None


def low_precision_attention(attn: CausalSelfAttention, bits: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def forward(x: torch.Tensor) -> torch.Tensor:
        q, k, v = attn.heads(x)
        T = x.shape[1]
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        p = _RoundUp.apply(scores.masked_fill(~causal, float("-inf")).softmax(-1), bits)
        return attn.output(_RoundUp.apply(p @ v, bits))

    return forward


def run_fault(fault: str | None, job: FaultJob = FaultJob(), monitors: list[str] | None = None) -> FaultRun:
    """Train the job with ``fault`` (None: clean) and record every alert."""
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; choose from {', '.join(FAULTS)}")
    torch.manual_seed(job.seed)
    model = GPT(GPTConfig(norm=job.norm, n_experts=4))
    task = make_task("synthetic_lm", model.cfg.vocab_size, model.cfg.seq_len)
    optimizer = torch.optim.AdamW(model.parameters(), lr=job.lr)
    monitor = Monitor(model, every=job.every, monitors=monitors, seed=job.seed)
    gen = torch.Generator().manual_seed(job.seed + 1)
    corrupted = model.blocks[0].attn.qkv.weight
    signs = torch.Generator().manual_seed(job.seed + 2)
    u, v = (torch.randint(0, 2, (n,), generator=signs) * 2.0 - 1 for n in corrupted.shape)
    offset = job.grad_offset * torch.outer(u, v)  # a stuck, rank-one, consistently signed error
    routers = [m.router for m in model.modules() if isinstance(m, MoE)]
    handles = []
    alerts: list[Alert] = []
    losses: list[float] = []
    step_times: list[float] = []
    diverged_step = None
    clock = {"step": 0}  # read by the router fault's hook
    for step in range(job.steps):
        clock["step"] = step
        if step == job.inject_at:
            handles = _inject(fault, job, model, optimizer, routers, clock)
        t0 = time.perf_counter()
        inputs, targets = task.batch(job.batch_size, gen)
        _, loss = model(inputs, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if fault == "grad_corruption" and step >= job.inject_at and corrupted.grad is not None:
            corrupted.grad.add_(offset)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))
        t1 = time.perf_counter()
        alerts += monitor.step(step, loss=loss)
        t2 = time.perf_counter()
        losses.append(float(loss.detach()))
        if divergence_reason(losses[-1], grad_norm, 50.0, 500.0):  # the probe's default label
            diverged_step = step
            break
        optimizer.step()
        step_times.append(time.perf_counter() - t2 + t1 - t0)
    for handle in handles:
        handle.remove()
    monitor.remove()
    checks = len(range(0, len(losses), job.every))
    return FaultRun(
        fault=fault,
        job=job,
        diverged_step=diverged_step,
        losses=losses,
        alerts=alerts,
        step_seconds=sorted(step_times)[len(step_times) // 2] if step_times else math.nan,
        monitor_seconds={name: s / checks for name, s in monitor.seconds.items()},
        monitors=monitor.names,
    )


def _inject(
    fault: str | None, job: FaultJob, model: GPT, optimizer: torch.optim.Optimizer, routers: list, clock: dict
) -> list:
    if fault == "lr_jump":
        for group in optimizer.param_groups:
            group["lr"] *= job.lr_factor
    elif fault == "attention_precision":
        for m in model.modules():
            if isinstance(m, CausalSelfAttention):
                m.forward = low_precision_attention(m, job.mantissa_bits)
    elif fault == "router_collapse":

        def push(module: Any, args: tuple, output: torch.Tensor) -> torch.Tensor:
            bias = job.router_ramp * (clock["step"] - job.inject_at + 1)
            return output + bias * F.one_hot(torch.tensor(0), output.shape[-1]).to(output)

        return [r.register_forward_hook(push) for r in routers]
    return []
