"""Spectral Alignment (SA paper, arXiv 2510.04202; method reference section 5).

Signal: for a linear layer with top right-singular vector v1 and token inputs x_t, the sign of
SA(x_t) = <x_t, v1> / |x_t|. The binary entropy H_s of the fraction p+ of positive signs is ~1 bit
while the inputs spread on both sides of v1, and falls towards 0 when they collapse onto one side,
the state in which a consistently signed gradient error grows sigma_1 step after step.

Defaults (the reference's design choices): every linear layer inside the residual blocks (``nn.Linear``,
and transformers' transposed ``Conv1D`` of GPT-2); up to
2048 sampled input tokens per matrix from a forward pre-hook on check steps only; v1 by 3 warm-started
power iterations in float32, its sign anchored to the previous check's (flip when <v1_new, v1_old> < 0);
a warning when H_s falls below 0.8 bit (again only after recovering above 0.9); an alarm when
H_s < 0.5 bit on 3 consecutive checks *and* sigma_1 is growing abnormally (the robust z of its
per-check log increment, against the layer's last 20 checks, has a median >= 4 over those 3 checks)
*and* the collapse is fresh: H_s was at or above 0.8 bit within the last ``FRESH`` = 20 checks.

Why the sigma_1 condition (ours, not the paper's): on the fault harness's clean runs, inputs of the
last blocks' projections drifted to one side of v1 in ordinary training (97 alarms over 3 clean
runs with the H_s rule alone), with sigma_1 steady; asking for one z >= 4 among the 3 checks still
left 4 (noise in 56 layers x 60 checks), hence the median. The mechanism that makes a collapse dangerous
is a collapse that lets a consistently signed error grow sigma_1, so the alarm asks for both.

Why fresh (ours): in healthy 12-block Pre-LN runs the MLP's first projection (fed by a LayerNorm)
collapses in the first few hundred steps and stays collapsed, H_s = 0, while the run trains well;
a bout of sigma_1 growth 3500-3800 steps later then met both conditions (the only false alarms
on the 42 Pre-LN controls of seeds 0-47). A collapse older than sigma_1's own history window (20
checks) belongs to another episode than the growth. The cost, on the 15 failing deep Post-LN runs
kept (seeds 30-38, 42-47): the alarm on 3 went (collapses 1150-3950 steps old), rksp's first alarm
moved on one (1631 -> 1231 steps ahead; the others had an earlier alarm). The alarms kept came
150-700 steps after the collapse. Held out, seeds 48-53: it removed the previous rule's one false
alarm (Pre-LN seed 52, a layer collapsed since step 50) and one alarm 20 steps before a failure
that another monitor had preceded. A layer that recovers above the warning line is fresh again when
it next collapses.

Skipped layers (reported in ``metrics``, never alerting; our choice, the paper does not say):
* a layer whose inputs already had H_s below the warning line at its first check, since a collapse
  cannot be told from how it started;
* a layer whose input is a pointwise activation's output, with a floor (GELU's -0.17, SiLU's
  -0.28, ReLU's 0: ``BOUNDED_BELOW``), found in the first check's forward pass by tensor identity
  (the built-in GPT's and GPT-2's MLP projection; not a gated MLP's, whose input is a product).
  Such inputs share a mean direction that grows with the pre-activations, and v1 aligns with it
  in ordinary training: healthy deep Post-LN runs (lr 0.001, the benchmark's ``control_low_lr``)
  alarmed on 5 of 6, every time on the MLP projection (steps 1400-1950). The first rule missed
  them because at init the pre-activations are small and GELU is nearly linear (the inputs'
  signs are still mixed).

Cost per check and matrix: 3 power iterations (6 d_out d_in FLOPs each) plus N d_in for the cosines.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial

import torch
from torch import nn

from rksp_cli.monitors.base import Alert, Persistence, RobustDrift, TokenSampler, linear_weight

WARNING_BITS, ALARM_BITS, PATIENCE, GROWTH_Z = 0.8, 0.5, 3, 4.0
FRESH = 20  # checks: a collapse alarms only while the inputs were spread (H_s >= WARNING_BITS) this recently
REARM_BITS = 0.9  # a warned layer warns again only after recovering above this
# Pointwise activations whose output has a floor: torch's, and transformers' own (ACT2FN) by name
BOUNDED_BELOW = (
    nn.GELU, nn.ReLU, nn.ReLU6, nn.SiLU, nn.Mish, nn.ELU, nn.CELU, nn.SELU, nn.Softplus, nn.Sigmoid,
    nn.Hardswish, nn.Hardsigmoid,
)  # fmt: skip
TRANSFORMERS_BOUNDED_BELOW = frozenset({
    "GELUActivation", "NewGELUActivation", "FastGELUActivation", "QuickGELUActivation", "AccurateGELUActivation",
    "ClippedGELUActivation", "GELUTanh", "PytorchGELUTanh", "MishActivation", "SiLUActivation",
    "ReLUSquaredActivation", "SqrtSoftplusActivation", "LaplaceActivation",
})  # fmt: skip


def sign_entropy(p: float) -> float:
    """Binary entropy in bits."""
    if p <= 0.0 or p >= 1.0:
        return 0.0
    return -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def bounded_activation(module: nn.Module) -> bool:
    """Whether ``module`` is a pointwise activation whose output has a floor (torch's or transformers')."""
    return isinstance(module, BOUNDED_BELOW) or type(module).__name__ in TRANSFORMERS_BOUNDED_BELOW


class ActivationFed:
    """Which of ``layers`` take a bounded activation's output as their input, found by tensor identity
    in the forward passes while ``armed()`` (as ``models.norm.NormFinder`` finds a norm's consumers)."""

    def __init__(self, blocks: Sequence[nn.Module], layers: Mapping[str, nn.Module], armed: Callable[[], bool]) -> None:
        self.fed: set[str] = set()
        self._outputs: list[torch.Tensor] = []  # held, so that no later tensor can reuse an output's id
        self._armed = armed
        activations = [m for block in blocks for m in block.modules() if bounded_activation(m)]
        self._handles = [m.register_forward_hook(self._keep) for m in activations]
        self._handles += [m.register_forward_pre_hook(partial(self._consume, name)) for name, m in layers.items()]

    def _keep(self, module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        if self._armed():
            self._outputs.append(output)

    def _consume(self, name: str, module: nn.Module, args: tuple) -> None:
        if args and any(args[0] is out for out in self._outputs):
            self.fed.add(name)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._outputs.clear()


def linear_layers(blocks: Sequence[nn.Module], prefix: str = "") -> dict[str, nn.Module]:
    """The blocks' linear maps (nn.Linear, GPT-2's Conv1D) by the model's own module paths
    (``prefix``: the blocks' path, so that names read ``blocks.0.attn.qkv``)."""
    lead = f"{prefix}." if prefix else ""
    return {
        f"{lead}{i}.{name}": module
        for i, block in enumerate(blocks)
        for name, module in block.named_modules()
        if linear_weight(module) is not None
    }


def activation_fed_layers(model: nn.Module, *inputs: torch.Tensor) -> set[str]:
    """The layers of ``model``'s blocks that spectral alignment leaves out as fed by a bounded
    activation, from one forward pass on ``inputs`` (what a logged run's rescoring needs)."""
    from rksp_cli.monitors import residual_blocks  # the package imports this module

    prefix, blocks = residual_blocks(model)
    feed = ActivationFed(blocks, linear_layers(blocks, prefix), armed=lambda: True)
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        feed.remove()
    return feed.fed


class SignCollapse:
    """The alarm rule (module docstring), apart from the measurement: each check's per-layer sign
    entropy and sigma_1 against the layer's earlier checks. It reads nothing else, so a logged run's
    ``sa_entropy/*`` and ``sa_sigma1/*`` metrics, fed back check by check, rescore it exactly."""

    def __init__(self, fed: set[str] | None = None) -> None:
        self.fed = set(fed or ())  # layers fed by a bounded activation: never alerting
        self.exempt: set[str] = set()  # collapsed from the first check on, or fed: reported, never alerting
        self.persistence = Persistence(PATIENCE)
        self._log_sigma: dict[str, float | None] = {}  # None: no increment into the next check
        self._growth: dict[str, RobustDrift] = defaultdict(lambda: RobustDrift(direction=1, window=20))
        self._recent_z: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=PATIENCE))
        self._dipped: set[str] = set()  # below the warning line now (warned once on the way down)
        self._since_spread: dict[str, int] = {}  # checks since H_s was last at or above the warning line

    def restored(self) -> None:
        """The weights were set back to an earlier state (a guard's rollback). Told nothing, the rule
        scored a 3-check streak spanning the restore, the fall of sigma_1 across it, and the replayed
        early steps against late-training increments: on the saved rollback twins of 222-263 every
        later rollback of the two runs sent back to step 0 again and again (257, 262) was this
        rule's. So no streak and no increment spans a restore, and the increment histories start
        again, as at a run's first check (no growth score for 10 checks); exempt layers stay exempt.
        Replayed on the twins of 222-263 (chosen there) and 264-267 (judged): benchmarks/restore_replay.py."""
        self.persistence.clear()
        self._recent_z.clear()
        self._growth.clear()
        self._log_sigma = dict.fromkeys(self._log_sigma)

    def _sigma_growth(self, name: str, sigma: float) -> float:
        """The median robust z of sigma_1's log increment over the last PATIENCE checks (0 before a history):
        sustained growth, not one noisy increment."""
        log_sigma = math.log(max(sigma, 1e-30))
        previous = self._log_sigma.get(name)
        self._log_sigma[name] = log_sigma
        if previous is not None:
            z = self._growth[name].score(log_sigma - previous)
            self._recent_z[name].append(z if z is not None else 0.0)
        recent = sorted(self._recent_z[name])
        return recent[len(recent) // 2] if recent else 0.0

    def score(
        self, step: int, measured: Mapping[str, tuple[float, float, float | None]]
    ) -> tuple[dict[str, float], list[Alert]]:
        """Metrics and alerts of one check from each layer's (H_s, sigma_1, p+), p+ only for the message."""
        metrics: dict[str, float] = {}
        alerts: list[Alert] = []
        first = not self._log_sigma
        for name, (h, sigma, p) in measured.items():
            metrics[f"sa_entropy/{name}"] = h
            metrics[f"sa_sigma1/{name}"] = sigma
            growth = self._sigma_growth(name, sigma)
            if first and (h < WARNING_BITS or name in self.fed):
                self.exempt.add(name)
            if name in self.exempt:
                continue
            since = self._since_spread[name] = 0 if h >= WARNING_BITS else self._since_spread.get(name, 0) + 1
            signs = "" if p is None else f" (p+ {p:.2f})"
            collapsed = self.persistence.update(name, h < ALARM_BITS)
            if collapsed and growth >= GROWTH_Z and since <= FRESH:
                reason = (
                    f"sign entropy {h:.3f} bit < {ALARM_BITS} for {PATIENCE} checks{signs} while sigma_1 "
                    f"grows abnormally (robust z {growth:.1f}): inputs collapsed onto the top singular direction"
                )
                alerts.append(Alert(step, SpectralAlignment.name, name, h, ALARM_BITS, "alarm", reason))
            elif h < WARNING_BITS and name not in self._dipped:
                reason = f"sign entropy {h:.3f} bit < {WARNING_BITS}{signs}"
                alerts.append(Alert(step, SpectralAlignment.name, name, h, WARNING_BITS, "warning", reason))
            if h < WARNING_BITS:
                self._dipped.add(name)
            elif h > REARM_BITS:
                self._dipped.discard(name)
        if metrics:
            watched = [v for k, v in metrics.items() if k.startswith("sa_entropy/") and k[11:] not in self.exempt]
            metrics["sa_entropy_min"] = min(watched) if watched else math.nan
        return metrics, alerts

    def rescore(self, checks: Iterable[tuple[int, Mapping[str, float]]]) -> list[Alert]:
        """The alerts of a logged run's checks, (step, metrics) in order, under this rule."""
        alerts = []
        for step, metrics in checks:
            layers = [k.removeprefix("sa_entropy/") for k in metrics if k.startswith("sa_entropy/")]
            measured = {name: (metrics[f"sa_entropy/{name}"], metrics[f"sa_sigma1/{name}"], None) for name in layers}
            alerts += self.score(step, measured)[1] if measured else []
        return alerts


class SpectralAlignment:
    name = "spectral_alignment"

    def __init__(
        self, blocks: Sequence[nn.Module], prefix: str = "", tokens: int = 2048, iterations: int = 3, seed: int = 0
    ):
        """``prefix``: the blocks' module path, so layer names match the model's (``blocks.0.attn.qkv``)."""
        self.iterations = iterations
        self.layers = linear_layers(blocks, prefix)
        if not self.layers:
            raise ValueError("spectral alignment found no linear layers (nn.Linear or Conv1D) in the blocks")
        self.generator = torch.Generator().manual_seed(seed)  # token samples and power-iteration starts
        self.sampler = TokenSampler(self.layers, tokens, self.generator)
        self._v: dict[str, torch.Tensor] = {}
        self.rule = SignCollapse()
        self._feed: ActivationFed | None = ActivationFed(blocks, self.layers, lambda: self.sampler.armed)

    @property
    def exempt(self) -> set[str]:
        return self.rule.exempt

    def restored(self) -> None:
        """The weights were set back (a guard's rollback): the rule starts its streaks and histories again."""
        self.rule.restored()

    def remove(self) -> None:
        self.sampler.remove()
        if self._feed is not None:
            self._feed.remove()

    def top_singular(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(v1, sigma_1) of the layer's weight, both left on its device: nothing here waits for the
        device (on a GPU, a check of 48 layers read three numbers back per layer)."""
        W = linear_weight(self.layers[name]).detach().float()
        v = self._v.get(name)
        fresh = v is None
        if fresh:
            v = torch.randn(W.shape[1], generator=self.generator).to(W.device)
        for _ in range(self.iterations * (4 if fresh else 1)):  # a cold start gets more iterations
            u = W @ v
            u = u / u.norm().clamp_min(1e-30)
            v = W.T @ u
            v = v / v.norm().clamp_min(1e-30)
        if not fresh:  # anchor the arbitrary sign so that p+ is comparable across checks
            v = torch.where(torch.dot(v, self._v[name]) < 0, -v, v)
        self._v[name] = v
        return v, (W @ v).norm()

    def check(self, step: int, loss: float | None = None) -> tuple[dict[str, float], list[Alert]]:
        inputs = self.sampler.take()
        if self._feed is not None and inputs:  # the first check's forward pass showed what feeds what
            self.rule.fed = set(self._feed.fed)
            self._feed.remove()
            self._feed = None
        read: list[torch.Tensor] = []  # per layer: p+ (the share of positive cosines) and sigma_1
        for name, x in inputs.items():
            v, sigma = self.top_singular(name)
            cos = (x @ v) / x.norm(dim=1).clamp_min(1e-30)
            read += [(cos > 0).float().mean(), sigma.to(x.device)]
        values = torch.stack(read).tolist() if read else []  # the check's one wait for the device
        measured = {}
        for name, p, sigma in zip(inputs, values[::2], values[1::2], strict=True):
            measured[name] = (sign_entropy(p), sigma, p)
        return self.rule.score(step, measured)
