"""Sub-layer bursts: a residual branch whose output suddenly dwarfs the shortcut it is added to.

Signal: per sub-layer (each block's attention and MLP), r = mean_t ||F(x_t)|| / mean_t ||s_t||, the
size of the branch's output F against the shortcut s it joins, over every token of a check step's
forward pass. The shortcut is the stream entering the norm before F (Pre-LN, and transformers'
pre-norm layers) or F's own input (Post-LN: the stream the previous norm put out). Training stays
stable while sub-layers are small against a large shortcut (Takase et al., "Spike No More", arXiv
2312.16903), and Post-LN's reliance on its residual branches amplifies what one update does to the
output (Liu et al. 2020, arXiv 2004.08249): a branch that jumps to several times its usual share of
the stream, then falls back, is that amplification caught in the act.

Alarm (our choice): r at least ``FOLD`` = 2.55x the median of the sub-layer's last ``WINDOW`` = 20
checks *and* at least ``Z`` = 6.8 robust sd above it, in log units (``RobustDrift(log=True)``; no
score before 16 checks), *and* at least ``JUMP`` = 2x the previous check's r, at one check: bursts
pass in one or two checks, so no persistence is asked. Each test guards against a false alarm: a
fold alone fires on a branch growing steadily through early training (a healthy Pre-LN run's last
MLP grew 4x against its median), a robust z alone on a series so flat that its MAD is at the floor
(a 10% wiggle is then 6 sd), and the two together on growth that ends in a modest step: a clean run
of the fault harness (seed 13, checks every 10 steps) whose last MoE branch grew 2.5x in 120 steps,
then 1.43x in one check, reached 3.2x and 9 sd. The bursts before deep Post-LN failures were 3-270x
the previous check (seeds 60-65, first alarms); the jump test was added after those runs and moves
none of their first alarms. From seed 60 to 217 the fold and z were 3x and 8 sd. The 16 checks of
history (10 until 2026-11-27) came after Pre-LN controls 86 and 88 alarmed at step 700, with 14
checks of history, on branches still settling after the start of training. Stated before seeds 90-95
ran and replayed on them exactly (benchmarks/candidate_replay.py), it moved no failing run's first
alarm there or on 78-89. The rule with all three of those thresholds at 0.85, stated before seeds
210-213 were read, would have made seven deep first alarms on 186-209 earlier; on 210-213 it alarmed
on a healthy width-64 control whose MLP branch, past the fold and z tests, jumped 1.77x, and is not
shipped. The fold and z alone at 0.85, the jump test kept, stated before seeds 214-217 were read,
drew no control alarm there (nor over the 112 controls of 186-213) and met the lead bar on two runs
the former rule alarmed only 11 and 45 steps ahead of, whose MLP branches had reached 2.7-2.97x
their median 311 and 1095 steps before they failed; shipped from seed 218 on. A branch under
``FLOOR`` = a tenth of its shortcut does not alarm, however far it jumped (its history takes the
ratio either way): on the width-64 control of seed 272 an MLP branch went from 0.8% to 4% of its
shortcut, 4.7x its median and 2.5x the last check, a jump that moved the residual stream by almost
nothing. Stated before seeds 274 on ran and replayed on every set from there, it moved no failing
run's first alarm and no control's over 13 held-out deep failures; shipped from seed 290 on.

A guard's rollback brings the rule's history back with the weights (``SublayerRatio.snapshot`` and
``restored``): the rule is as it was at the restored snapshot's step. Kept across the restore, as
through seed 461, the history scored a restored run against the stretch the rollback discarded:
the twin of held-out seed 458, restored to a state in a stretch of bursts that had passed unalarmed
against the unsettled history of its first checks, met them again against a quieter one and was
sent back to the same state five more times, ending at 3.93 where one rollback ends at 3.24.
Replayed on the 148 saved rollback twins of 272-459 (benchmarks/restore_replay.py --rule
sublayer_ratio), it changes three: it removes those five and a second rollback of 336 that its
capped twin did without, and delays 317's needed second rollback by one check. Stated before the
twins of 460-461 were read and judged on them, where it changed nothing; shipped after them.

Why (issue 16): deep Post-LN without warmup (12 blocks, lr 0.003) fails early on some seeds, at
steps 1135-2697, by collapsing to a near-unigram loss within a few steps, with nothing in the other
monitors' signals moving before it. Rerun with this signal (bit-identical to the saved runs), the
four such failing runs looked at (seeds 46, 48, 58, 59) showed MLP bursts against a flat history
239-472 steps before they failed (first alarms at steps 800, 1500, 2050, 2150); on healthy Post-LN
at lr 0.001 and Pre-LN at lr 0.003 (seeds 46 and 58, 5000 steps each; Pre-LN's MLP branches on
seed 46 only) none passes both tests, the closest min(fold / 3, z / 8) being 0.52 (Post-LN) and
0.81 (Pre-LN's attention branches growing 2.5x early in training). Chosen on those runs, then run
on fresh seeds (README).

Cost per check: the mean row norm of each sub-layer's input and output on the check step's
forward pass, O(tokens x d) per sub-layer; the hooks do nothing on other steps.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from rksp_cli.monitors.base import Alert, RobustDrift

FOLD = 2.55  # times the sub-layer's median ratio over its history (3 until seed 217)
Z = 6.8  # robust sd above that median, in log units (8 until seed 217)
JUMP = 2.0  # times the previous check's ratio: a burst, not the end of steady growth
WINDOW = 20  # checks of history
MIN_HISTORY = 16  # checks before the first score
FLOOR = 0.1  # the least branch/shortcut ratio that alarms (no floor through seed 289)
# (norm before the branch, branch) as blocks name them, attention first, the first match per branch
# kept: the built-in GPT, Llama-style layers (Mistral, Qwen, ...), GPT-2; for the MLP, Gemma-2-style
# sandwich norms come before Llama's post_attention_layernorm, which there normalises the attention output
PAIRS = (
    ("norm1", "attn"),
    ("input_layernorm", "self_attn"),
    ("ln_1", "attn"),
    ("norm2", "mlp"),
    ("pre_feedforward_layernorm", "mlp"),
    ("post_attention_layernorm", "mlp"),
    ("ln_2", "mlp"),
)


@dataclass(frozen=True)
class SubLayer:
    """One residual branch: the stream it is added to is the input of ``shortcut``; its
    contribution is the output of ``branch`` (the first element where that is a tuple)."""

    name: str
    shortcut: nn.Module
    branch: nn.Module


def find_sublayers(blocks: Iterable[nn.Module], prefix: str) -> list[SubLayer]:
    """Every block's attention and MLP branches with their shortcuts, by the names in ``PAIRS``.

    A block that normalises after the residual add (the built-in GPT's Post-LN and DeepNorm,
    ``post_norm``) adds each branch to the branch's own input."""
    sites = []
    for i, block in enumerate(blocks):
        post = getattr(block, "post_norm", False) is True
        found: dict[str, SubLayer] = {}
        for norm_name, branch_name in PAIRS:
            norm, branch = getattr(block, norm_name, None), getattr(block, branch_name, None)
            if branch_name not in found and isinstance(norm, nn.Module) and isinstance(branch, nn.Module):
                found[branch_name] = SubLayer(f"{prefix}.{i}.{branch_name}", branch if post else norm, branch)
        sites.extend(found.values())
    return sites


class _RowNorms:
    """Mean row norm of each sub-layer's shortcut and branch output, on armed steps only (``Monitor``
    arms it for the forward pass of a check step). Not a ``TokenSampler``: the ratio wants the same
    tokens on both sides, and two norms need no copy of the rows."""

    def __init__(self, sites: list[SubLayer]) -> None:
        self.armed = True
        self.values: dict[tuple[str, str], float] = {}
        self._handles = []
        for s in sites:
            self._handles.append(s.shortcut.register_forward_pre_hook(self._hook(s.name, "shortcut")))
            self._handles.append(s.branch.register_forward_hook(self._hook(s.name, "branch")))

    def _hook(self, name: str, part: str):
        def hook(module: nn.Module, args: tuple, output: object = None) -> None:
            if not self.armed:
                return
            x = args[0] if output is None and args else output
            x = x[0] if isinstance(x, tuple) else x
            if isinstance(x, torch.Tensor):
                self.values[(name, part)] = float(x.detach().float().norm(dim=-1).mean())

        return hook

    def take(self) -> dict[tuple[str, str], float]:
        values, self.values = self.values, {}
        return values

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


class SublayerBurst:
    """The alarm rule (module docstring) apart from the measurement: it reads only each check's
    per-sub-layer ratio, so a logged run's ``sublayer_ratio/*`` metrics, fed back check by check,
    rescore it exactly."""

    def __init__(
        self,
        layers: Iterable[str],
        thresholds: tuple[float, float, float] = (FOLD, Z, JUMP),
        min_history: int = MIN_HISTORY,
        floor: float = FLOOR,
    ) -> None:
        """``thresholds`` (fold, z, jump), ``min_history`` and ``floor``: today's by default; others
        only to replay a candidate rule (benchmarks/candidate_replay.py)."""
        self.fold, self.z, self.jump = thresholds
        self.floor = floor
        self.drifts = {name: RobustDrift(+1, window=WINDOW, min_history=min_history, log=True) for name in layers}

    def score(self, step: int, layer: str, ratio: float) -> Alert | None:
        """The layer's alarm at this check, if any; its history takes the value either way."""
        drift = self.drifts[layer]
        median, seen = drift.baseline(), len(drift.history)
        previous = math.exp(drift.history[-1]) if drift.history else None
        z = drift.score(ratio)
        if median is None or z is None:
            return None
        fold = ratio / math.exp(median)
        if fold < self.fold or z < self.z or ratio < self.jump * previous or ratio < self.floor:
            return None
        reason = (
            f"sub-layer output/shortcut {ratio:.3g}, {fold:.1f}x its median of the last "
            f"{seen} checks ({z:.0f} robust sd): a burst"
        )
        return Alert(step, SublayerRatio.name, layer, fold, self.fold, "alarm", reason)

    def snapshot(self) -> dict[str, RobustDrift]:
        """The history as it stands: what a guard's snapshot of the run brings back with its weights."""
        return copy.deepcopy(self.drifts)

    def restore(self, snapshot: dict[str, RobustDrift]) -> None:
        self.drifts = copy.deepcopy(snapshot)

    def rescore(self, checks: Iterable[tuple[int, Mapping[str, float]]]) -> list[Alert]:
        """The alarms of a logged run's checks, (step, metrics) in order, under this rule."""
        alerts = []
        for step, metrics in checks:
            for layer in self.drifts:
                ratio = metrics.get(f"sublayer_ratio/{layer}")
                if ratio is not None and (alert := self.score(step, layer, ratio)):
                    alerts.append(alert)
        return alerts


class SublayerRatio:
    name = "sublayer_ratio"

    def __init__(self, sites: list[SubLayer]):
        if not sites:
            raise ValueError("sub-layer ratio found no attention or MLP branch with its shortcut")
        self.sites = sites
        self.sampler = _RowNorms(sites)
        self.rule = SublayerBurst(s.name for s in sites)

    def snapshot(self) -> dict[str, RobustDrift]:
        return self.rule.snapshot()

    def restored(self, snapshot: dict[str, RobustDrift] | None = None) -> None:
        """The weights were set back to those of ``snapshot``'s step (a guard's rollback): the rule's
        history goes back with them. Without one, the history is kept."""
        if snapshot is not None:
            self.rule.restore(snapshot)

    def remove(self) -> None:
        self.sampler.remove()

    def check(self, step: int, loss: float | None = None) -> tuple[dict[str, float], list[Alert]]:
        norms = self.sampler.take()
        metrics: dict[str, float] = {}
        alerts: list[Alert] = []
        for site in self.sites:
            shortcut, branch = norms.get((site.name, "shortcut")), norms.get((site.name, "branch"))
            if shortcut is None or branch is None or not shortcut > 0:
                continue
            ratio = branch / shortcut
            if not 0 < ratio < math.inf:  # an exploded or dead step scores nothing
                continue
            metrics[f"sublayer_ratio/{site.name}"] = ratio
            if alert := self.rule.score(step, site.name, ratio):
                alerts.append(alert)
        return metrics, alerts
