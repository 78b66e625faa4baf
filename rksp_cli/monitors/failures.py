"""Natural failures: runs that go wrong the way real ones do, slowly, watched by rksp's monitors and
by the spike detectors teams already run (issue 16).

Unlike ``faults`` (a fault switched on at a known step), nothing here is injected at a step: each
failure is a training configuration from the literature that drifts into instability on its own,
and its control is the same model, for the same number of steps, with the one change that keeps
it healthy. All run through ``rksp probe``'s training loop (same optimizer, schedule and label),
with a ``Monitor`` watching every step. Where that one change is the architecture (deep Post-LN's
control is Pre-LN), a second control keeps the failing run's architecture and changes the lr: an
alarm that only tells the two architectures apart would otherwise pass for a warning.

When a run failed. Two events, whichever comes first:

* **exploded**: the probe's label (loss > 50, gradient norm > 500, or non-finite); training stops;
* **lost what it learned**: the mean loss of the last ``WINDOW`` = 100 steps has given back half
  (``LOST``) of its best progress below the loss at step 0, once that progress reached
  ``MIN_PROGRESS`` = 0.25 nats (Wortsman et al. 2023 count a run whose loss returns towards its
  initial value as diverged: their lr sensitivity scores min(loss, initial loss)).
  Layer-normalised models at a high lr fail this way: the attention saturates and the loss
  climbs back towards chance without ever exploding. We first asked for 90% given back; the
  low-precision runs then ended 1.4 nats above their controls, 77% of their progress lost, and
  were not counted as failed: too lenient a line for a run that ends near chance.

A watcher's lead is the failure step minus its first alarm; every alarm on a control run that
did not fail is a false alarm. A control can fail too (Pre-LN at deep Post-LN's lr exploded on 2
of 96 seeds at width 128, and on its first seed at width 512): it is then no clean run, so its
alarms are neither false alarms nor leads, and the tables count it apart (``controls_failed``).
Detectors are replayed on the recorded losses and pre-clip gradient norms.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import io
import json
import math
import statistics
import tempfile
import time
import tokenize
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from torch import nn

from rksp_cli.models.gpt import CausalSelfAttention
from rksp_cli.monitors import Monitor
from rksp_cli.monitors.base import Alert
from rksp_cli.monitors.faults import low_precision_attention
from rksp_cli.monitors.guard import Guard
from rksp_cli.monitors.spike_detectors import DETECTORS, first_alarm
from rksp_cli.probe import probe
from rksp_cli.spec import ScreenSpec, set_field, spec_from_dict

WINDOW, MIN_PROGRESS, LOST = 100, 0.25, 0.5
DEFAULT_EVERY = 50  # Monitor's default interval: overheads are quoted at it

BASE: dict[str, Any] = {  # small enough for thousands of CPU steps (about 20 ms a step on one core)
    "model": {"norm": "pre", "d_model": 64, "n_layers": 2, "n_heads": 4, "seq_len": 32, "vocab_size": 256},
    "training": {"task": "synthetic_lm", "warmup_steps": 100, "batch_size": 16, "steps": 3000, "weight_decay": 0.0},
    "probe": {"tokens": 256},
}
# Deep Post-LN: 12 blocks at width 128, 2x BASE's width and 6x its depth (about 85 ms a step on two
# threads). At width 64 Post-LN either trains or never leaves chance; at 128, lr 0.003, without
# warmup, it learns for thousands of steps and then fails (every one of 30 seeds within 10,000
# steps). Its first control is Pre-LN, Xiong et al.'s comparison, not a warmup: a 1000-step warmup
# did not save it (3 of 3 runs failed, steps 3013-4030). Its second is Post-LN at a third of the
# lr, which trained for 10,000 steps without failing (seed 0; so did half the lr), so that an
# alarm must tell a failing Post-LN run from a healthy one, not Post-LN from Pre-LN.
POST_LN = {
    "model.d_model": 128, "model.n_layers": 12, "training.lr": 0.003, "training.warmup_steps": 0, "training.steps": 5000
}  # fmt: skip


@dataclass(frozen=True)
class Failure:
    name: str
    source: str  # where the literature describes it
    failing: dict[str, Any]  # changes to BASE that make it fail
    # changes to BASE that keep it healthy, by run kind: "control", and where that changes the
    # architecture, a control of the failing run's own architecture ("control_low_lr")
    controls: dict[str, dict[str, Any]]
    low_precision_bits: int = 0  # > 0: attention with biased rounding to this many mantissa bits (faults.py)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The runs this failure has: "failing", then its controls."""
        return ("failing", *self.controls)

    def spec(self, kind: str, seed: int) -> ScreenSpec:
        if kind not in self.kinds:
            raise ValueError(f"kind must be one of {', '.join(self.kinds)} for {self.name}, got {kind!r}")
        raw = copy.deepcopy(BASE)
        for name, value in {**(self.failing if kind == "failing" else self.controls[kind]), "probe.seed": seed}.items():
            set_field(raw, name, value)
        return spec_from_dict(raw, source=f"failure {self.name} ({kind})")


FAILURES = {
    f.name: f
    for f in (
        Failure(
            "attention_logit_growth",
            "Wortsman et al. 2023 (arXiv 2309.14322); Zhai et al. 2023 (arXiv 2303.06296)",
            failing={"training.lr": 0.1},
            controls={"control": {"training.lr": 0.01}},
        ),
        Failure(
            "low_precision_attention",
            "biased rounding in low-precision attention (faults.py; the tied-maximum rounding bias of BF16 "
            "flash attention)",
            failing={"training.lr": 0.01},
            controls={"control": {"training.lr": 0.01}},
            low_precision_bits=3,
        ),
        Failure(
            "post_ln_without_warmup",
            "Xiong et al. 2020 (arXiv 2002.04745); Liu et al. 2020 (arXiv 2004.08249)",
            failing={**POST_LN, "model.norm": "post"},
            controls={
                "control": {**POST_LN, "model.norm": "pre"},
                "control_low_lr": {**POST_LN, "model.norm": "post", "training.lr": 0.001},
            },
        ),
    )
}
# Deep Post-LN at 4x the width (512, 12 blocks, 8 heads), sized for a GPU (not in FAILURES: a CPU
# takes about a second a step). A hidden weight's stable Adam lr falls with width (muP), so the
# failing lr is a third of width 128's and its low-lr control a third of that again. Chosen before
# any run at this width. On an H100 (seeds 2-4) and an H200 (5-9; README, make bench-monitors-gpu)
# five failing runs learned and were lost by steps 257-1205, three never learned; Post-LN at the
# low lr trained in all seven runs; the Pre-LN control exploded on 2, 5 and 8 and stalled near 4.2
# on the rest, so this lr is too high for it here.
POST_LN_WIDE = {**POST_LN, "model.d_model": 512, "model.n_heads": 8, "training.lr": 0.001}
GPU_FAILURES = {
    f.name: f
    for f in (
        Failure(
            "post_ln_without_warmup_wide",
            "Xiong et al. 2020 (arXiv 2002.04745); Liu et al. 2020 (arXiv 2004.08249)",
            failing={**POST_LN_WIDE, "model.norm": "post"},
            controls={
                "control": {**POST_LN_WIDE, "model.norm": "pre"},
                "control_low_lr": {**POST_LN_WIDE, "model.norm": "post", "training.lr": 0.00033},
            },
        ),
    )
}


@dataclass
class WatchedRun:
    failure: str
    kind: str  # "failing", or a control's kind ("control", "control_low_lr")
    seed: int
    steps: int  # planned
    losses: list[float]
    grad_norms: list[float]
    exploded_step: int | None
    alerts: list[Alert]
    monitors: list[str]
    step_seconds: float  # mean training step, monitors excluded
    check_seconds: dict[str, float]  # mean seconds per check, per monitor
    final_loss: float = math.nan
    policy: str | None = None  # the guard's action policy, None: watched only
    actions: list[dict[str, Any]] = field(default_factory=list)  # what the guard did
    notes: list[str] = field(default_factory=list)
    # every check: {"step", "metrics"}, the monitors' signals, so an alarm rule can be replayed later
    series: list[dict[str, Any]] = field(default_factory=list)
    monitor_code: str = ""  # ``monitor_code()`` when it was watched; "" from before it was recorded

    @property
    def failed_step(self) -> int | None:
        """When the run first failed (exploded, or lost half its progress), or None."""
        lost = lost_step(self.losses)
        events = [s for s in (self.exploded_step, lost) if s is not None]
        return min(events) if events else None

    @property
    def ended_failed(self) -> bool:
        """Whether the run *ended* failed: exploded, or its last ``WINDOW`` steps' mean loss has given
        back half of its best progress. What a guard is judged on: a run it rolled back, or slowed,
        and that learned again by the end is saved, however its loss moved on the way."""
        if self.exploded_step is not None:
            return True
        if len(self.losses) <= WINDOW:
            return False
        means = [statistics.fmean(self.losses[t - WINDOW : t]) for t in range(WINDOW, len(self.losses) + 1, 10)]
        return gave_back(self.losses[0], min(means), means[-1])

    def monitor_alarm(self, name: str) -> int | None:
        steps = [a.step for a in self.alerts if a.monitor == name and a.level == "alarm"]
        return min(steps) if steps else None

    def detector_alarm(self, make: Callable[[], Any]) -> int | None:
        return first_alarm(make(), self.losses, self.grad_norms)

    def first_alarms(self) -> dict[str, int | None]:
        """Every watcher's first alarm: rksp's monitors by name, the detectors by theirs."""
        alarms = {name: self.monitor_alarm(name) for name in self.monitors}
        return alarms | {cls.name: self.detector_alarm(cls) for cls in DETECTORS}

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["alerts"] = [a.as_dict() for a in self.alerts if a.level == "alarm"]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WatchedRun:
        return cls(**{**data, "alerts": [Alert(**a) for a in data["alerts"]]})


def monitor_code(folder: Path | None = None) -> str:
    """A fingerprint of the monitors' code (``folder``: this package), docstrings and comments aside.

    A saved run's alarms are those of the rules it was watched under; a benchmark that resumes from
    saved runs must not mix them with another rule's, and a docstring edit must not cost hours of
    reruns. It hashes the code's text, not its syntax tree: ``ast.dump`` differs between Python
    3.11 and 3.12, so the same code watched on a GPU machine's Python read as other code here."""
    digest = hashlib.sha256()
    for path in sorted((folder or Path(__file__).parent).glob("*.py")):
        digest.update(path.name.encode() + _code_lines(path.read_text()).encode())
    return digest.hexdigest()[:16]


def _code_lines(source: str) -> str:
    """``source`` without its docstrings, comments, trailing blanks and blank lines."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(first := body[0], ast.Expr):
            if isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    lines = source.splitlines()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            lines[row - 1] = lines[row - 1][:col]
    return "\n".join(line.rstrip() for n, line in enumerate(lines, 1) if n not in docstrings and line.strip())


def gave_back(start: float, best: float, mean: float) -> bool:
    """A mean loss that has given back ``LOST`` of the best progress below ``start``, once that
    progress reached ``MIN_PROGRESS`` nats."""
    progress = start - best
    return progress >= MIN_PROGRESS and start - mean <= (1 - LOST) * progress


def lost_step(losses: list[float], window: int = WINDOW) -> int | None:
    """First step at which the trailing mean loss has given back ``LOST`` of its progress below the
    loss at step 0, once that progress reached ``MIN_PROGRESS`` nats; None if it never did."""
    if len(losses) <= window or not math.isfinite(losses[0]):
        return None
    start, best = losses[0], math.inf
    total = sum(losses[:window])
    for t in range(window, len(losses)):
        total += losses[t] - losses[t - window]
        mean = total / window
        if not math.isfinite(mean):
            return None  # an explosion, which the probe's label reports
        best = min(best, mean)
        if gave_back(start, best, mean):
            return t
    return None


def watch_run(
    failure: Failure,
    kind: str,
    seed: int,
    every: int = DEFAULT_EVERY,
    policy: str | None = None,
    device: str = "cpu",
    max_actions: int | None = None,
) -> WatchedRun:
    """Train one failing or control run of ``failure`` on ``device`` with every monitor checking
    each ``every`` steps; with ``policy`` (``guard.POLICIES``) their alarms also act on the run, at
    most ``max_actions`` of them (``Guard``)."""
    spec = failure.spec(kind, seed)
    made: dict[str, Any] = {}

    def watch(model: nn.Module, optimizer: Any, schedule: Any, log: Path) -> Monitor | Guard:
        if failure.low_precision_bits and kind == "failing":
            for m in model.modules():
                if isinstance(m, CausalSelfAttention):
                    m.forward = low_precision_attention(m, failure.low_precision_bits)
        monitor = Monitor(model, every=every, seed=seed, log=log)
        made["monitor"] = (
            monitor if policy is None else Guard(model, optimizer, policy, schedule, monitor, max_actions=max_actions)
        )
        return made["monitor"]

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rksp-watch-") as tmp:
        log = Path(tmp) / "metrics.jsonl"
        result = probe(spec, watch=partial(watch, log=log), device=device)
        records = [json.loads(line) for line in log.read_text().splitlines()]
    series = [{"step": r["step"], "metrics": r["metrics"]} for r in records if "step" in r]
    watcher = made["monitor"]
    monitor = watcher if isinstance(watcher, Monitor) else watcher.monitor
    elapsed = time.perf_counter() - t0
    checks = len(range(0, len(result.losses), every))
    check_seconds = {name: s / max(checks, 1) for name, s in monitor.seconds.items()}
    steps = max(len(result.losses), 1)
    return WatchedRun(
        failure=failure.name,
        kind=kind,
        seed=seed,
        steps=spec.training.steps,
        losses=result.losses,
        grad_norms=result.grad_norms,
        exploded_step=result.diverged_step,
        alerts=result.alerts,
        monitors=monitor.names,
        step_seconds=(result.train_seconds - sum(monitor.seconds.values())) / steps,
        check_seconds=check_seconds,
        final_loss=statistics.fmean(result.losses[-WINDOW:]) if result.losses else math.nan,
        policy=policy,
        actions=getattr(watcher, "actions", []),
        notes=[f"{elapsed:.0f} s in all on {device}"],
        series=series,
        monitor_code=monitor_code(),
    )


def by_kind(counts: dict[str, str]) -> str:
    """False alarms per kind of control, for a table cell, where a failure has more than one kind:
    " (control 0/6, control_low_lr 1/6)"; "" otherwise."""
    return f" ({', '.join(f'{kind} {n}' for kind, n in counts.items())})" if len(counts) > 1 else ""


def head_to_head(runs: list[WatchedRun]) -> list[dict[str, Any]]:
    """Per failure and watcher: failing runs that failed, how many the watcher alarmed on before the
    failure, its median lead (steps, and as a share of the step it failed at), its false alarms on
    the controls that did not fail (in all and by kind of control), how many controls failed, and
    its overhead at the default interval."""
    rows = []
    for name in dict.fromkeys(r.failure for r in runs):
        failing = [r for r in runs if r.failure == name and r.kind == "failing"]
        every_control = [r for r in runs if r.failure == name and r.kind != "failing"]
        controls = [r for r in every_control if r.failed_step is None]  # clean: an alarm there is false
        failed = [r for r in failing if r.failed_step is not None]
        first = {id(r): r.first_alarms() for r in failing + controls}  # each detector replays the whole run
        watchers = list(dict.fromkeys(w for r in failing + controls for w in first[id(r)]))
        for watcher in watchers:
            leads, shares = [], []
            for r in failed:
                alarm = first[id(r)].get(watcher)
                if alarm is not None and alarm <= r.failed_step:
                    leads.append(r.failed_step - alarm)
                    shares.append((r.failed_step - alarm) / max(r.failed_step, 1))
            overhead = [
                100 * r.check_seconds[watcher] / (DEFAULT_EVERY * r.step_seconds)
                for r in failing + every_control
                if watcher in r.check_seconds and r.step_seconds > 0
            ]
            rows.append({
                "failure": name, "watcher": watcher, "rksp": watcher in failing[0].monitors if failing else False,
                "failing_runs": len(failing), "failed": len(failed), "alarmed": len(leads),
                "median_lead_steps": statistics.median(leads) if leads else None,
                "median_lead_share": statistics.median(shares) if shares else None,
                "median_failed_step": statistics.median(r.failed_step for r in failed) if failed else None,
                "run_length": failing[0].steps if failing else None,
                "controls": len(controls), "controls_failed": len(every_control) - len(controls),
                "false_alarms": sum(first[id(r)].get(watcher) is not None for r in controls),
                "false_alarms_by_control": {
                    kind: f"{sum(first[id(r)].get(watcher) is not None for r in mine)}/{len(mine)}"
                    for kind in dict.fromkeys(r.kind for r in controls)
                    if (mine := [r for r in controls if r.kind == kind])
                },
                "overhead_pct": statistics.median(overhead) if overhead else None,
            })  # fmt: skip
    return rows
