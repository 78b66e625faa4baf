"""Ground truth: train a configuration briefly and label whether it diverged.

The label is the RKSP paper's (section 3.1): diverged if at any step the loss exceeds 50 or the
pre-clip global gradient L2 norm exceeds 500, or either is non-finite (thresholds configurable in
``training``). Training stops at the first diverged step.

Design choices, where the paper is silent:
* weight decay applies to matrices and embeddings only (2-D parameters), not to biases or gains;
* the learning rate warms up linearly from 0 over ``warmup_steps`` and then stays constant (a
  short probe has no use for a decay schedule);
* ``sgd`` uses momentum ``betas[0]``;
* a *loss spike* (for the baseline spike count) is a step whose loss exceeds 1.5x the median of
  the previous 20 steps;
* a second label, ``stalled``, catches a run that does not explode but fails to train: it ended
  (mean loss of its last 20 steps) no lower than its loss at step 0. Deliberately conservative: a
  slow run at a small lr still improves on its first loss, so it is not called stalled; a run whose
  lr wrecked it (loss back at or above chance) is. ``label_any`` is either label.

Each probe first screens the freshly initialised model (same seed, same weights), so a row holds
the init-time features and the outcome of training exactly that init.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import torch

from rksp_cli.budget import Budget, ModelShape, screen_cost
from rksp_cli.errors import InputError, UnassessableError
from rksp_cli.kss import KoopmanSpectralShaping
from rksp_cli.models import BuildOptions, Subject, build_subject
from rksp_cli.risk import RuleBasedRisk
from rksp_cli.screen import ScreenResult, screen_row, screen_subject
from rksp_cli.spec import ScreenSpec
from rksp_cli.tasks import IGNORE, Task, make_task

EVAL_BATCH, EVAL_SEED = 256, 2**31 - 1  # the held-out batch of the final accuracy
SENSITIVITY_BATCH, SENSITIVITY_STEP = 16, 1e-3  # update_sensitivity: a small step keeps it linear
TRACKED = ("near_unit_mass_mean", "expansive_mass_mean", "spectral_radius_mean", "eta_nl_mean")
_NO_RISK = RuleBasedRisk()  # tracking reads the spectra; the risk of a half-trained model means nothing
TAIL_STEPS = 20  # the stall label compares the mean loss of the last steps with the first loss
BASELINE_STEP = 100  # "gradient norm at step 100" in the paper's Table 2
SPIKE_WINDOW, SPIKE_FACTOR = 20, 1.5
PROGRESS_REPORTS = 20  # INFO lines per run on the module's logger (silent unless a handler is set)

log = logging.getLogger(__name__)

StepCallback = Callable[[int, float, float], None]  # (step, loss, grad norm)


class Watch(Protocol):
    """What can watch a probe's training from inside the loop: ``rksp_cli.monitors.Monitor`` and
    ``rksp_cli.monitors.guard.Guard`` do. A watch with ``skip_update`` true after ``step`` skips
    that step's optimizer update (the schedule still advances)."""

    def step(self, step: int, loss: torch.Tensor) -> list[Any]:
        """Called after backward, before clipping; returns this step's alerts."""
        ...

    def remove(self) -> None: ...


WatchFactory = Callable[[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler], Watch]


@dataclass
class ProbeResult:
    spec: ScreenSpec
    diverged: bool
    diverged_step: int | None
    reason: str  # why it was labelled as it was
    losses: list[float]
    grad_norms: list[float]  # pre-clip global L2 norms
    seconds: float  # in all: build, init screen and training
    train_seconds: float  # the training loop alone
    screen: ScreenResult | None  # None when the init could not be assessed
    screen_error: str | None = None
    baselines: dict[str, float] = field(default_factory=dict)
    accuracy: float = math.nan  # final next-token accuracy on a held-out batch; NaN for a diverged run
    trajectory: list[dict[str, float]] = field(default_factory=list)  # training.track_every: spectra over steps
    alerts: list[Any] = field(default_factory=list)  # what ``watch`` raised, in step order
    actions: list[dict[str, Any]] = field(default_factory=list)  # what a ``training.guard`` did, in step order

    def row(self) -> dict[str, Any]:
        """A flat record: config.*, feature.*, baseline.*, the label and its provenance."""
        row = self.screen.row() if self.screen is not None else screen_row(self.spec)
        row.update({f"baseline.{k}": v for k, v in self.baselines.items()})
        tail = tail_loss(self.losses)
        stalled = not self.diverged and bool(self.losses) and tail >= self.losses[0]
        row.update(
            label=int(self.diverged),
            label_stall=int(stalled),
            label_any=int(self.diverged or stalled),
            tail_loss=tail,
            diverged_step=self.diverged_step,
            steps_run=len(self.losses),
            final_loss=self.losses[-1] if self.losses else math.nan,
            final_accuracy=self.accuracy,
            trajectory=json.dumps(self.trajectory) if self.trajectory else None,
            guard_actions=json.dumps(self.actions) if self.actions else None,
            label_reason=self.reason,
            screen_error=self.screen_error,
            probe_seconds=self.seconds,
            train_seconds=self.train_seconds,
        )
        return row


def probe(
    spec: ScreenSpec,
    on_step: StepCallback | None = None,
    budget: Budget | None = None,
    watch: WatchFactory | None = None,
    device: str = "cpu",
) -> ProbeResult:
    """Screen the initialised model, then train it for ``training.steps`` steps and label the run.

    ``device`` (cpu or cuda[:N]) holds the model, its training and its screens; the weights and
    every batch are drawn on the CPU first, so the init and the data do not depend on it (the
    arithmetic does, by round-off: a cuda run is not bit-identical to a CPU run, nor, through
    cuda's non-deterministic backward kernels, to another cuda run).

    ``budget`` (default: the machine's available memory) refuses a model that cannot fit before it is built.
    ``watch`` builds, from the initialised model, its optimizer and lr schedule, something that sees
    every step after backward (before clipping), e.g. ``lambda model, *_: Monitor(model, every=10)``;
    its alerts land in ``alerts``. ``training.guard`` builds a ``Guard`` as the watch (the two are
    exclusive), and what it did lands in ``actions``. Progress goes to the ``rksp_cli.probe`` logger
    at INFO, ``PROGRESS_REPORTS`` lines a run, for long runs in workers with no terminal of their own.
    """
    if spec.model.arch != "gpt":
        raise InputError("rksp probe trains the built-in gpt (model.arch: gpt); transformers models are screened only")
    if spec.training.guard is not None:
        if watch is not None:
            raise ValueError("training.guard builds the probe's watch; pass a watch or set training.guard, not both")
        watch = partial(_guard, spec.training.guard, spec.training.guard_every)
    t0 = time.perf_counter()
    budget = budget or Budget()

    def check(shape: ModelShape, fields: str) -> None:
        budget.check(screen_cost(shape, spec.probe.tokens, training=True), fields)

    subject = build_subject(spec.model, spec.probe.seed, BuildOptions(device=device), check)
    try:
        screen, screen_error = screen_subject(subject, spec, device=device), None
    except UnassessableError as exc:
        screen, screen_error = None, str(exc)

    train = spec.training
    model = subject.module
    task = make_task(train.task, subject.vocab_size, subject.seq_len)
    optimizer = _optimizer(model, spec)
    sensitivity = update_sensitivity(model, task, spec.probe.seed)  # before training; the weights are restored
    warmup = train.warmup_steps
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
    gen = torch.Generator().manual_seed(spec.probe.seed + 1)  # data stream, independent of the init

    kss = None
    if train.kss_alpha:
        settings = {"alpha": train.kss_alpha, "every": train.kss_every, "variant": train.kss_variant}
        kss = KoopmanSpectralShaping(subject.blocks, seed=spec.probe.seed, **settings)
    watcher = watch(model, optimizer, schedule) if watch is not None else None
    alerts: list[Any] = []
    model.train()
    t_train = time.perf_counter()
    losses: list[float] = []
    grads: list[float] = []
    diverged_step, reason = None, f"no divergence in {train.steps} steps"
    trajectory: list[dict[str, float]] = []
    report_every = max(1, train.steps // PROGRESS_REPORTS)
    for step in range(train.steps):
        if train.track_every and step % train.track_every == 0 and screen is not None:
            trajectory.append(_spectra_now(subject, spec, screen, step, kss, device))
        inputs, targets = _on_model(model, task.batch(train.batch_size, gen))
        logits, loss = model(inputs, targets)
        objective = loss  # the label reads the task loss alone; the objective adds what the run adds
        if train.z_loss:
            objective = objective + train.z_loss * z_loss(logits, targets)
        if kss is not None:
            objective = objective + kss(step)
        optimizer.zero_grad(set_to_none=True)
        objective.backward()
        if watcher is not None:
            alerts += watcher.step(step, loss)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip or math.inf))
        loss_value = float(loss.detach())
        losses.append(loss_value)
        grads.append(grad_norm)
        if on_step is not None:
            on_step(step, loss_value, grad_norm)
        if (step + 1) % report_every == 0:
            per_step = (time.perf_counter() - t_train) / (step + 1)
            log.info("step %d/%d: loss %.3f, %.0f ms a step", step + 1, train.steps, loss_value, 1e3 * per_step)
        why = divergence_reason(loss_value, grad_norm, train.diverge_loss, train.diverge_grad_norm)
        if why:
            diverged_step, reason = step, f"{why} at step {step}"
            break
        if not getattr(watcher, "skip_update", False):
            optimizer.step()
        schedule.step()
    for hooked in (kss, watcher):
        if hooked is not None:
            hooked.remove()
    actions = list(getattr(watcher, "actions", []))
    accuracy = math.nan if diverged_step is not None else task_accuracy(model, task)
    return ProbeResult(
        spec=spec,
        diverged=diverged_step is not None,
        diverged_step=diverged_step,
        reason=reason,
        losses=losses,
        grad_norms=grads,
        seconds=time.perf_counter() - t0,
        train_seconds=time.perf_counter() - t_train,
        screen=screen,
        screen_error=screen_error,
        baselines=baselines(losses, grads) | {"update_sensitivity": sensitivity},
        accuracy=accuracy,
        trajectory=trajectory,
        alerts=alerts,
        actions=actions,
    )


def _guard(
    policy: str,
    every: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LRScheduler,
) -> Watch:
    from rksp_cli.monitors.guard import Guard  # the monitors load only for a guarded probe

    return Guard(model, optimizer, policy, scheduler=schedule, every=every)


def _spectra_now(
    subject: Subject,
    spec: ScreenSpec,
    init: ScreenResult,
    step: int,
    kss: KoopmanSpectralShaping | None,
    device: str,
) -> dict[str, float]:
    """The screen's layer-mean spectra of the model as it is at ``step`` (same token sample as the
    init screen), and the KSS penalty's own soft near-unit mass when KSS is on."""
    features = init.features if step == 0 else screen_subject(subject, spec, _NO_RISK, device=device).features
    point = {"step": float(step), **{name: features[name] for name in TRACKED}}
    if kss is not None and kss.last_soft_mass is not None:
        point["kss_soft_mass"] = kss.last_soft_mass
    return point


def update_sensitivity(model: torch.nn.Module, task: Task, seed: int, step: float = SENSITIVITY_STEP) -> float:
    """How far one optimizer update moves the output at init, per unit lr: Admin's "output change"
    (Liu et al. 2020) for Adam, whose first step moves every parameter by lr x sign(gradient).

    RMS change of the logits on one batch (its own generator, apart from the training stream) after
    a step of ``step`` along -sign(gradient), divided by ``step``: lr-free, so an edge is where lr
    times it reaches order one. The weights are restored exactly and the gradients cleared.
    """
    inputs, targets = _on_model(model, task.batch(SENSITIVITY_BATCH, torch.Generator().manual_seed(seed + 3)))
    params = [p for p in model.parameters() if p.requires_grad]
    logits, loss = model(inputs, targets)
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, g in zip(params, grads, strict=True):
            if g is not None:
                p.sub_(step * g.sign())
        moved, _ = model(inputs)
        for p, original in zip(params, saved, strict=True):
            p.copy_(original)
    return float((moved - logits.detach()).square().mean().sqrt() / step)


def _on_model(model: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """A batch drawn on the CPU (so its tokens do not depend on the device), moved to the model's."""
    device = next(model.parameters()).device
    return tuple(t.to(device) for t in batch)


def z_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """PaLM's auxiliary loss: the mean squared log-partition function where a loss is taken."""
    return torch.logsumexp(logits[targets != IGNORE].float(), dim=-1).square().mean()


def task_accuracy(model: torch.nn.Module, task: Task, size: int = EVAL_BATCH) -> float:
    """Next-token accuracy where the task takes a loss, on one held-out batch that every run shares
    (its own seed, apart from any training stream): for associative recall, the recalled value."""
    inputs, targets = _on_model(model, task.batch(size, torch.Generator().manual_seed(EVAL_SEED)))
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits, _ = model(inputs)
    model.train(was_training)
    scored = targets != IGNORE
    return float((logits.argmax(-1)[scored] == targets[scored]).float().mean())


def tail_loss(losses: list[float], steps: int = TAIL_STEPS) -> float:
    """Mean loss over the last ``steps`` steps: where the run ended, less noisy than the last step."""
    tail = losses[-steps:]
    return sum(tail) / len(tail) if tail else math.nan


def divergence_reason(loss: float, grad_norm: float, max_loss: float, max_grad: float) -> str | None:
    """Why this step counts as diverged (the RKSP paper's label), or None."""
    if not math.isfinite(loss):
        return "non-finite loss"
    if not math.isfinite(grad_norm):
        return "non-finite gradient norm"
    if loss > max_loss:
        return f"loss {loss:.3g} > {max_loss:g}"
    if grad_norm > max_grad:
        return f"gradient norm {grad_norm:.3g} > {max_grad:g}"
    return None


def _optimizer(model: torch.nn.Module, spec: ScreenSpec) -> torch.optim.Optimizer:
    t = spec.training
    if t.lr is None:
        raise InputError("training.lr: a probe needs a learning rate")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if t.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=t.lr, momentum=t.betas[0])
    cls = torch.optim.AdamW if t.optimizer == "adamw" else torch.optim.Adam
    return cls(groups, lr=t.lr, betas=t.betas)


def baselines(losses: list[float], grads: list[float], k: int = BASELINE_STEP) -> dict[str, float]:
    """The paper's gradient and loss baselines (Table 2), as seen up to step k.

    A run that diverged before step k is scored on what it showed when it stopped, since that is
    what a monitor would have seen by step k.
    """
    if not grads:
        return {}
    window = grads[:k]
    spikes = sum(
        1
        for t in range(SPIKE_WINDOW, min(len(losses), 5 * k))
        if losses[t] > SPIKE_FACTOR * statistics.median(losses[t - SPIKE_WINDOW : t])
    )
    return {
        "init_grad_norm": grads[0],
        "grad_norm_at_k": window[-1],
        "grad_norm_var_k": statistics.pvariance(window) if len(window) > 1 else 0.0,
        "loss_spikes": float(spikes),
    }
