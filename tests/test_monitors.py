"""In-training monitors: each signal responds to the failure it is built for, and stays quiet otherwise."""

import json
import math
import random
import statistics
import sys

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from rksp_cli.cli import app
from rksp_cli.models.gpt import GPT, GPTConfig
from rksp_cli.monitors import Monitor
from rksp_cli.monitors.attention_entropy import (
    ALONE_FALL,
    CORROBORATE,
    WINDOW,
    AttentionSpectralEntropy,
    UpdateConcentration,
    delta2_entropy,
    find_attention,
    spectral_entropy,
)
from rksp_cli.monitors.base import MAD_TO_SIGMA, Alert, DriftAlarm, RobustDrift
from rksp_cli.monitors.faults import FaultJob, run_fault
from rksp_cli.monitors.r_metric import WEIGHTS, RMetric
from rksp_cli.monitors.router import ENTROPY_DROP, router_stats
from rksp_cli.monitors.spectral_alignment import (
    FRESH,
    SignCollapse,
    SpectralAlignment,
    activation_fed_layers,
    sign_entropy,
)
from rksp_cli.monitors.sublayer_ratio import (
    FLOOR,
    FOLD,
    JUMP,
    MIN_HISTORY,
    SublayerBurst,
    SublayerRatio,
    Z,
    find_sublayers,
)
from rksp_cli.watch import read_log
from tests.conftest import hf_config
from tests.tolerances import entropy_tolerance


def test_sign_entropy_is_one_bit_when_balanced_and_zero_when_collapsed():
    assert sign_entropy(0.5) == pytest.approx(1.0)
    assert sign_entropy(0.0) == sign_entropy(1.0) == 0.0
    assert sign_entropy(0.11) < 0.5 < sign_entropy(0.24) < 0.8 < sign_entropy(0.3)


def _sa_run(grow: bool) -> list[list[str]]:
    """12 healthy checks, then 4 with inputs pushed to one side of v1 (if ``grow``, sigma_1 up 30% a check)."""
    torch.manual_seed(0)
    layer = nn.Linear(16, 16)
    sa = SpectralAlignment([nn.Sequential(layer)])
    levels = []
    for check in range(16):
        with torch.no_grad():
            layer.weight.mul_(1.3 if grow and check >= 12 else 1 + 0.01 * torch.randn(()))
        x = torch.randn(512, 16)
        if check >= 12:
            v1 = torch.linalg.svd(layer.weight.detach()).Vh[0]
            x = x + 8 * v1 * torch.sign(x @ v1).mean().sign()
        sa.sampler.armed = True
        layer(x)
        levels.append([a.level for a in sa.check(check)[1]])
    return levels


def test_spectral_alignment_alarms_on_a_collapse_with_sigma1_growth():
    levels = _sa_run(grow=True)
    assert levels[:12] == [[]] * 12
    assert levels[12] == ["warning"] and levels[13] == [] and levels[14] == levels[15] == ["alarm"]


def test_spectral_alignment_collapse_with_steady_sigma1_only_warns_once():
    assert _sa_run(grow=False)[12:] == [["warning"], [], [], []]


def test_spectral_alignment_reads_the_device_once_a_check(monkeypatch):
    """On a GPU every read of a number back to the host waits for the device; a check of a 12-block
    model read three a layer. Now the only read is one list at the end (``tolist``), so a check
    must work with every other way of reading a tensor's value forbidden."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layers=2))
    sa = SpectralAlignment(model.blocks, "blocks")
    layers = []
    for check in range(3):
        sa.sampler.armed = True
        model(torch.randint(0, 96, (2, 8)))
        if check == 2:
            for read in ("item", "__float__", "__bool__", "__int__"):
                monkeypatch.setattr(torch.Tensor, read, lambda *_: pytest.fail("a check read a tensor's value"))
        metrics, _ = sa.check(check)
        layers.append(sorted(k for k in metrics if k.startswith("sa_sigma1/")))
    assert len(layers[2]) == 8 and layers[2] == layers[0]


@pytest.mark.parametrize(
    ("make", "fed"),
    [
        (lambda: GPT(GPTConfig(n_layers=2)), {"blocks.0.mlp.proj", "blocks.1.mlp.proj"}),
        (lambda: GPT(GPTConfig(n_layers=1, norm="subln")), set()),  # a LayerNorm between GELU and proj
        (
            lambda: GPT(GPTConfig(n_layers=1, n_experts=2)),
            {"blocks.0.mlp.experts.0.proj", "blocks.0.mlp.experts.1.proj"},
        ),
        ("gpt2", {"h.0.mlp.c_proj", "h.1.mlp.c_proj"}),
        ("llama", set()),  # down_proj's input is SiLU(gate) * up, a product with no floor
    ],
)
def test_spectral_alignment_finds_the_layers_fed_by_a_bounded_activation(make, fed):
    from transformers import AutoModel

    model = AutoModel.from_config(hf_config(make)) if isinstance(make, str) else make()
    assert activation_fed_layers(model, torch.randint(0, 96, (2, 8))) == fed


def test_a_layer_fed_by_gelu_never_alerts_however_its_inputs_collapse():
    """The MLP projection's inputs are GELU outputs, which share a mean direction that v1 aligns with
    in healthy training: its collapse is reported, never alarmed on; the same collapse fed by a
    linear layer alarms."""
    torch.manual_seed(0)
    fed_model = nn.Sequential(nn.GELU(), nn.Linear(16, 16))
    plain = nn.Linear(16, 16)
    seen = {}
    for name, block, layer in (("fed", fed_model, fed_model[1]), ("plain", nn.Sequential(plain), plain)):
        sa = SpectralAlignment([block])
        levels = []
        for check in range(16):
            with torch.no_grad():
                layer.weight.mul_(1.3 if check >= 12 else 1 + 0.01 * torch.randn(()))
            x = torch.randn(512, 16)
            if check >= 12:
                v1 = torch.linalg.svd(layer.weight.detach()).Vh[0]
                x = x + 8 * v1 * torch.sign(x @ v1).mean().sign()
            block(x)
            metrics, alerts = sa.check(check)
            levels += [a.level for a in alerts]
        seen[name] = (levels, sa.exempt, metrics)
    assert seen["plain"][0].count("alarm") == 2 and seen["plain"][1] == set()
    levels, exempt, metrics = seen["fed"]
    assert levels == [] and exempt == {"0.1"} and "sa_entropy/0.1" in metrics


@pytest.mark.parametrize(("collapse_at", "alarms"), [(30, True), (5, False)])
def test_spectral_alignment_alarms_only_on_a_fresh_collapse(collapse_at, alarms):
    """The same burst of sigma_1 growth (checks 36-39) alarms when the inputs collapsed within the last
    FRESH checks, not when they have lived collapsed for longer (a healthy Pre-LN MLP's inputs do)."""
    assert 40 - 30 < FRESH < 36 - 5  # the collapses are fresh and stale throughout the burst
    rng = torch.Generator().manual_seed(0)
    rule, log_sigma, found = SignCollapse(), 0.0, []
    for check in range(40):
        log_sigma += 0.3 if check >= 36 else 0.01 * (1 + float(torch.rand((), generator=rng)))
        h = 0.0 if check >= collapse_at else 0.99
        found += [a.level for a in rule.score(check, {"fc": (h, math.exp(log_sigma), None)})[1]]
    assert ("alarm" in found) is alarms and found.count("warning") == 1


def test_spectral_alignment_told_of_a_restore_scores_nothing_across_it():
    """A guard's rollback (``Monitor.restored``): no collapse streak and no sigma_1 increment spans the
    restore, and the increment histories start again. Told nothing, the rule alarms on a streak of two
    checks before a restore and one after (on the saved twins of 257 and 262 such alarms sent the runs
    back to step 0 again and again)."""
    model = GPT(GPTConfig(n_layers=1))
    monitor = Monitor(model, every=1, monitors=["spectral_alignment"])
    (sa,) = monitor.monitors
    untold, log_sigma = SignCollapse(), 0.0
    for check in range(1, 19):  # collapsed from check 16 on, sigma_1 then growing 20% a check
        if check == 18:
            monitor.restored()
        log_sigma += 0.2 if check >= 16 else 0.01
        measured = {"fc": (0.0 if check >= 16 else 1.0, math.exp(log_sigma), None)}
        told, alerted = sa.rule.score(check, measured)[1], untold.score(check, measured)[1]
    assert [a.level for a in alerted] == ["alarm"] and told == []


def test_spectral_alignment_rescored_from_its_logged_metrics_gives_the_same_alerts():
    """SignCollapse reads only H_s and sigma_1, so a logged run's metrics, fed back, rescore it exactly
    (how the benchmarks apply a changed exemption to runs watched before it)."""
    torch.manual_seed(0)
    layer = nn.Linear(16, 16)
    sa = SpectralAlignment([nn.Sequential(layer)])
    logged, alerts = [], []
    for check in range(16):
        with torch.no_grad():
            layer.weight.mul_(1.3 if check >= 12 else 1 + 0.01 * torch.randn(()))
        x = torch.randn(512, 16) + (8 * torch.linalg.svd(layer.weight.detach()).Vh[0] if check >= 12 else 0)
        layer(x)
        metrics, found = sa.check(check)
        logged.append(metrics)
        alerts += [(a.step, a.layer, a.level) for a in found]
    again = [(a.step, a.layer, a.level) for a in SignCollapse().rescore(enumerate(logged))]
    assert "alarm" in {level for *_, level in alerts} and again == alerts


@pytest.mark.parametrize("still_head", [None, 1])
def test_delta2_entropy_matches_the_full_matrix_with_grouped_query_heads(still_head):
    """``still_head``: a head whose W_Q did not move, so A = [0 | W_Q] and its Gram has no Cholesky."""
    torch.manual_seed(0)
    d, d_k, heads, kv = 24, 4, 4, 2
    q0, k0 = torch.randn(heads * d_k, d), torch.randn(kv * d_k, d)
    q1, k1 = q0 + 0.1 * torch.randn_like(q0), k0 + 0.1 * torch.randn_like(k0)
    if still_head is not None:
        q1[still_head * d_k : (still_head + 1) * d_k] = q0[still_head * d_k : (still_head + 1) * d_k]
    fast = delta2_entropy(q0, k0, q1, k1, heads, kv)
    for h in range(heads):
        g = h // (heads // kv)
        WQ, dQ = q0[h * d_k : (h + 1) * d_k].T, (q1 - q0)[h * d_k : (h + 1) * d_k].T
        WK, dK = k0[g * d_k : (g + 1) * d_k].T, (k1 - k0)[g * d_k : (g + 1) * d_k].T
        s = torch.linalg.svdvals(dQ @ WK.T + WQ @ dK.T)[: 2 * d_k]
        p = s / s.sum()
        tol = entropy_tolerance(s, d, torch.finfo(torch.float32).eps)  # float32 weights, as in training
        assert fast[h] == pytest.approx(float(-(p * p.log()).sum() / math.log(2 * d_k)), abs=tol)


def test_spectral_entropy_spans_zero_to_one_and_survives_a_still_head():
    """Spread evenly over all directions is 1, confined to one is 0; a head with no update at all
    (every singular value 0) reads 0, not NaN, in float32 and float64 alike."""
    for dtype in (torch.float32, torch.float64):
        s = torch.tensor([[2.0, 2.0, 2.0, 2.0], [3.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=dtype)
        assert spectral_entropy(s).tolist() == pytest.approx([1.0, 0.0, 0.0], abs=4 * torch.finfo(dtype).eps)


def test_attention_entropy_alarms_when_updates_turn_low_rank():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layers=1))
    monitor = AttentionSpectralEntropy(find_attention(model), lag_checks=1)
    qkv = model.blocks[0].attn.qkv.weight
    u, v = torch.randn(qkv.shape[0], 1), torch.randn(1, qkv.shape[1])
    levels = []
    for check in range(36):  # 1 check of lag, 10 of burn-in and 10 of history before any score
        with torch.no_grad():
            qkv += 1e-3 * (u @ v if check >= 30 else torch.randn_like(qkv))  # rank 1 from check 30 on
        levels.append({a.level for a in monitor.check(check)[1]})
    assert not set().union(*levels[:30])
    assert "alarm" in set().union(*levels[30:])


def test_attention_entropy_measures_no_update_across_a_restore():
    """After a rollback the next QK update starts from the restored weights, and a streak of drops
    counted before it is forgotten."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layers=1))
    monitor = AttentionSpectralEntropy(find_attention(model), lag_checks=1)
    qkv = model.blocks[0].attn.qkv.weight
    u, v = torch.randn(qkv.shape[0], 1), torch.randn(1, qkv.shape[1])
    streak = monitor.rule.alarms["blocks.0.attn"].persistence.runs
    for check in range(40):  # rank-1 updates from check 30 on: drops, as in the test above
        with torch.no_grad():
            qkv += 1e-3 * (u @ v if check >= 30 else torch.randn_like(qkv))
        monitor.check(check)
        if streak.get("", 0):
            break
    assert streak[""] >= 1
    monitor.restored()
    assert not streak and not monitor.check(check + 1)[0]  # no update spans the restore
    assert monitor.check(check + 2)[0]  # one check later the lag is whole again


def scoring(drift: RobustDrift, z: float) -> float:
    """The value ``drift`` would score exactly ``z`` against its current history."""
    median = statistics.median(drift.history)
    mad = statistics.median(abs(v - median) for v in drift.history)
    return median + drift.direction * z * MAD_TO_SIGMA * max(mad, drift.floor * abs(median))


def test_burn_in_values_never_become_the_baseline():
    """An early transient (here 100x the later level) is neither scored nor remembered."""
    drift = RobustDrift(direction=-1, window=40, min_history=3, burn_in=5)
    scores = [drift.score(v) for v in [100.0] * 5 + [1.0, 1.01, 0.99, 1.0]]
    assert scores[:8] == [None] * 8 and scores[8] == pytest.approx(0.0)
    assert list(drift.history) == [1.0, 1.01, 0.99, 1.0]


@pytest.mark.parametrize(("z", "alarms"), [(4.5, False), (5.5, True)])
def test_attention_entropy_alarms_from_a_5_sd_drop_against_40_checks(z, alarms):
    """Healthy deep runs' single-layer dips reached z 4-5 against 20 checks of history; the rule asks
    for 5 sd against 40, on 3 checks in a row."""
    monitor = AttentionSpectralEntropy(find_attention(GPT(GPTConfig(n_layers=1))))
    alarm = next(iter(monitor.rule.alarms.values()))
    plateau = [0.80 + 0.01 * ((7 * t) % 5) for t in range(60)]
    assert not any(alarm.update(t, "layer", v) for t, v in enumerate(plateau))
    assert len(alarm.drift.history) == 40
    levels = []
    for t in range(60, 63):
        alert = alarm.update(t, "layer", scoring(alarm.drift, z))
        levels.append(alert.level if alert else None)
    assert levels[-1] == ("alarm" if alarms else None)


@pytest.mark.parametrize(("level", "alarms"), [(0.27, False), (0.80, True)])
def test_attention_entropy_scores_only_layers_whose_updates_spread(level, alarms):
    """The same 15% drop alarms on a layer whose updates spread over 28 of 64 directions (H = 0.80),
    not on one confined to 3 (H = 0.27, healthy Post-LN's block 0); either keeps its history."""
    rule = UpdateConcentration({"layer": 64})
    plateau = [level * (1 + 0.01 * ((7 * t) % 5)) for t in range(60)]
    assert not any(rule.score(t, "layer", v) for t, v in enumerate(plateau))
    levels = {a.level for t in range(60, 63) if (a := rule.score(t, "layer", 0.85 * level))}
    assert ("alarm" in levels) == alarms
    assert len(rule.alarms["layer"].drift.history) == WINDOW


def entropy_alerts(rule: UpdateConcentration, dips: dict[str, list[int]], checks: int = 70) -> list[Alert]:
    """``rule``'s alerts when each of its layers sits on a noisy plateau of 0.8 and falls 15% at the
    checks ``dips`` lists for it."""
    alerts = []
    for t in range(checks):
        values = {name: 0.8 * (1 + 0.01 * ((7 * t + i) % 5)) for i, name in enumerate(rule.widths)}
        values |= {name: 0.68 for name, at in dips.items() if t in at}
        alerts += rule.judge(t, values)
    return alerts


def entropy_dips(rule: UpdateConcentration, dips: dict[str, list[int]], checks: int = 70) -> list[tuple[int, str]]:
    """(check, layer) of each alarm in ``entropy_alerts``."""
    return [(a.step, a.layer) for a in entropy_alerts(rule, dips, checks) if a.level == "alarm"]


def test_attention_entropy_corroboration_withholds_a_lone_layer_s_dip():
    """Asked for two layers with no lone exemption, one layer's three-check dip stays a warning (the
    false alarms of Pre-LN 172 and 175) until a second layer breaches at the same check; with one
    layer asked, it alarms."""
    widths = {"a": 64, "b": 64, "c": 64}
    lone = {"a": [60, 61, 62, 63, 64]}
    assert entropy_dips(UpdateConcentration(widths, corroborate=1), lone) == [(62, "a"), (63, "a"), (64, "a")]
    assert entropy_dips(UpdateConcentration(widths, 2, alone_fall=math.inf), lone) == []
    joined = lone | {"b": [64]}  # b's first breach corroborates a's running streak
    assert entropy_dips(UpdateConcentration(widths, 2, alone_fall=math.inf), joined) == [(64, "a")]
    single = UpdateConcentration({"a": 64}, 2, alone_fall=math.inf)  # no second layer to ask
    assert entropy_dips(single, lone) == [(62, "a"), (63, "a"), (64, "a")]
    with pytest.raises(ValueError, match="at least 1"):
        UpdateConcentration(widths, corroborate=0)


def test_a_lone_layer_s_large_fall_alarms_without_a_second_layer():
    """By default a lone layer's dip alarms when it is 10% deep or more (the stuck gradient's 86% in
    the fault harness) and stays a warning when shallower (the 7.5-8.9% control dips)."""
    widths = {"a": 64, "b": 64, "c": 64}
    lone = {"a": [60, 61, 62, 63, 64]}  # a 15% fall
    assert (CORROBORATE, ALONE_FALL) == (2, 0.1)
    assert entropy_dips(UpdateConcentration(widths), lone) == [(62, "a"), (63, "a"), (64, "a")]
    withheld = entropy_alerts(UpdateConcentration(widths, 2, alone_fall=0.2), lone)
    assert [a.level for a in withheld] == ["warning"] * 5
    assert withheld[-1].reason.endswith("alone: fewer than 2 layers breach and it fell less than 20%")
    with pytest.raises(ValueError, match="at least 0"):
        UpdateConcentration(widths, 2, alone_fall=-0.1)


def test_corroborated_alarms_are_a_subset_of_single_layer_alarms():
    """Corroboration can only withhold alarms: on random entropy sequences every alarm it raises is
    one the single-layer rule raises at the same check; letting a lone layer's deep fall alarm
    restores some of them and nothing else, and at a fall of 0 every one (the replay's baseline)."""
    generator = torch.Generator().manual_seed(0)
    widths = {f"layer{i}": 64 for i in range(4)}
    withheld = kept = restored = 0
    for _ in range(30):
        values = 0.8 + 0.02 * torch.randn(100, len(widths), generator=generator)
        for layer, (start, length) in enumerate(torch.randint(0, 6, (len(widths), 2), generator=generator).tolist()):
            values[70 + 3 * start : 70 + 3 * start + length, layer] -= 0.15  # 0-5 checks, overlapping or not
        checks = [
            (t, {f"qk_entropy_mean/{n}": float(v) for n, v in zip(widths, row, strict=True)})
            for t, row in enumerate(values)
        ]
        single, paired, deep, any_fall = (
            {(a.step, a.layer) for a in UpdateConcentration(widths, k, fall).rescore(checks) if a.level == "alarm"}
            for k, fall in ((1, math.inf), (2, math.inf), (2, 0.18), (2, 0.0))
        )
        assert paired <= deep <= single == any_fall
        withheld, kept = withheld + len(single - paired), kept + len(paired)
        restored += len(deep - paired)
    assert withheld and kept and restored  # each case occurred: the property was tested, not met vacuously


def test_attention_entropy_rescores_a_logged_run_exactly():
    """A run's logged per-layer entropies, fed back to the rule, give the alerts the monitor raised."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layers=2))
    monitor = AttentionSpectralEntropy(find_attention(model), lag_checks=1)
    qkv = [b.attn.qkv.weight for b in model.blocks]
    u, v = torch.randn(qkv[0].shape[0], 1), torch.randn(1, qkv[0].shape[1])
    logged, raised = [], []
    for check in range(40):
        with torch.no_grad():
            for w in qkv:
                w += 1e-3 * (u @ v if check >= 30 else torch.randn_like(w))
        metrics, alerts = monitor.check(check)
        logged.append((check, metrics))
        raised += alerts
    assert any(a.level == "alarm" for a in raised)
    assert monitor.rule.widths == {"blocks.0.attn": 32, "blocks.1.attn": 32}  # d = 64, 4 heads
    rescored = UpdateConcentration(monitor.rule.widths).rescore(logged)
    assert [(a.step, a.layer, a.level) for a in rescored] == [(a.step, a.layer, a.level) for a in raised]


def test_router_statistics():
    weight = torch.randn(1, 8).repeat(4, 1)  # four identical experts
    stats = router_stats(weight, torch.randn(64, 8))
    assert stats.similarity == pytest.approx(1.0)
    assert stats.entropy == pytest.approx(math.log(4), abs=1e-5)  # identical logits: uniform routing
    peaked = router_stats(torch.eye(4, 8) * 50, torch.eye(8)[:4])
    assert peaked.entropy < 0.01


def test_router_entropy_alarm_needs_a_fall_of_a_fifth_not_only_a_large_z():
    """Healthy routing entropy drifts with a MAD at the floor: a sustained 10% dip is about 7 sd, which
    z alone alarms on; the router's rule also asks for a fall of ENTROPY_DROP of the median."""

    def alarms(dip: float, min_change: float) -> list[int]:
        rule = DriftAlarm("router", "routing entropy", -1, min_change=min_change)
        values = [1.2 + 0.002 * (i % 3) for i in range(20)] + [1.2 * (1 - dip)] * 3
        return [i for i, v in enumerate(values) if (a := rule.update(i, "r", v)) and a.level == "alarm"]

    assert alarms(0.10, 0.0) == [22]  # z alone: an alarm on the third check of the dip
    assert alarms(0.10, ENTROPY_DROP) == []
    assert alarms(0.30, ENTROPY_DROP) == [22]


def test_published_r_metric_false_alarms_on_a_falling_loss_and_the_robust_one_does_not():
    model = nn.Linear(4, 4)
    model.weight.grad = torch.ones(4, 4)
    model.bias.grad = torch.ones(4)
    losses = [5.0 * 0.97**t for t in range(80)]
    alerts = {}
    for variant in ("published", "robust"):
        metric = RMetric(model, variant=variant)
        alerts[variant] = sum(len(metric.check(t, loss)[1]) for t, loss in enumerate(losses))
        assert metric.check(80, math.nan)[1], "a non-finite loss always alerts"
    assert alerts["published"] > 0 and alerts["robust"] == 0


@pytest.mark.parametrize(("z", "alarms"), [(9.5, False), (10.1, True)])
def test_robust_r_metric_alarms_on_the_loss_alone_from_z_9_8(z, alarms):
    """0.70 * min(z / 12, 1) > 0.57 from z = 9.77: the line the deep healthy runs' late drift sat under."""
    model = nn.Linear(4, 4)
    model.weight.grad = torch.ones(4, 4)  # gradient norms that never change: sigma2 scores 0
    model.bias.grad = torch.ones(4)
    metric = RMetric(model)
    losses = [3.0 + 0.01 * ((7 * t) % 5) for t in range(40)]  # a noisy plateau
    assert not any(metric.check(t, loss)[1] for t, loss in enumerate(losses))
    jump = scoring(metric.drift["dloss"], z)  # the dL that scores exactly z
    _, alerts = metric.check(40, statistics.fmean(metric.losses) + jump)
    assert bool(alerts) == alarms


def _gradient_variance(model: nn.Linear, value: float) -> None:
    """Gradients whose per-tensor norms have variance ``value`` (weight 4g, bias 0: variance 4g^2)."""
    model.weight.grad = torch.full_like(model.weight, math.sqrt(value / 4))
    model.bias.grad = torch.zeros_like(model.bias)


@pytest.mark.parametrize(("burst", "alarms"), [(10.0, False), (1e6, True)])
def test_robust_r_metric_scores_the_gradient_variance_by_factors(burst, alarms):
    """Healthy deep runs' sigma2 swings 10x between checks. On a linear scale such a burst saturated
    its term (0.45), and a loss wiggle of z 2-5 (0.70 z / 12) then crossed 0.57: the R-Metric's
    false alarms on 5 of 30 healthy deep runs. By factors the burst is a couple of sd."""
    model = nn.Linear(4, 4)
    metric = RMetric(model)
    noise = [1.0, 3.0, 0.5, 2.0, 0.3, 1.5, 0.7]  # multiplicative, as the deep runs' sigma2
    for t in range(60):
        _gradient_variance(model, 1e-3 * noise[t % len(noise)])
        assert not metric.check(t, 3.0 + 0.01 * ((7 * t) % 5))[1]
    _gradient_variance(model, 1e-3 * burst)
    wiggle = scoring(metric.drift["dloss"], 3.0)
    metrics, alerts = metric.check(60, statistics.fmean(metric.losses) + wiggle)
    assert metrics["r_sigma2"] == pytest.approx(1e-3 * burst, rel=1e-5)  # logged as measured, not as its log
    assert bool(alerts) == alarms


def test_r_metric_rescored_from_its_logged_components_alarms_where_it_did():
    """``RMetric.score`` fed a run's logged r_* metrics (and the sign of ``loss_change`` on its
    losses) gives the alarms ``check`` gave: what lets a saved run be rescored after a change of the
    rule. The loss falls back after its jump, which the rises-only rule must also withhold here."""
    model = nn.Linear(4, 4)
    watched, rescored = RMetric(model), RMetric(nn.Module())
    logged, losses, alarms = [], [], []
    for t in range(80):
        _gradient_variance(model, 1e-3 * (1 + t % 3) * (1e6 if t == 70 else 1))
        losses.append(3.0 + 0.01 * ((7 * t) % 5) + (2.0 if t == 70 else 0.0))
        metrics, alerts = watched.check(t, losses[t])
        logged.append(metrics)
        alarms += [a.step for a in alerts]
    again = [
        t
        for t, m in enumerate(logged)
        if rescored.score(t, {k: m[f"r_{k}"] for k in WEIGHTS}, fell=rescored.loss_change(losses[t]) < 0)[1]
    ]
    assert 70 in alarms and again == alarms


@pytest.mark.parametrize(("sign", "any_change", "rises_only"), [(-1, True, False), (1, True, True)])
def test_r_metric_rises_only_withholds_a_fall_and_keeps_a_rise(sign, any_change, rises_only):
    """The rule shipped after Pre-LN control 161 alarmed as its loss fell: with ``rises_only`` a loss
    far below its recent mean scores no loss term, one as far above it alarms as under |dL|."""
    model = nn.Linear(4, 4)
    model.weight.grad = torch.ones(4, 4)  # gradient norms that never change: sigma2 scores 0
    model.bias.grad = torch.ones(4)
    metrics = {rule: RMetric(model, rises_only=rule) for rule in (False, True)}
    for t in range(40):
        for metric in metrics.values():
            assert not metric.check(t, 3.0 + 0.01 * ((7 * t) % 5))[1]
    jump = scoring(metrics[False].drift["dloss"], 11.0)  # the |dL| that scores z 11 (alarm from 9.8)
    level = statistics.fmean(metrics[False].losses) + sign * jump
    assert [bool(metrics[rule].check(40, level)[1]) for rule in (False, True)] == [any_change, rises_only]
    assert metrics[False].drift["dloss"].history == metrics[True].drift["dloss"].history  # one scale


def test_r_metric_scores_rises_only_by_default_and_as_the_paper_when_published():
    """Shipped from seeds 168 on: the robust rule withholds a fall, the published one is the paper's
    |dL|; an explicit choice overrides either."""
    model = nn.Linear(4, 4)
    assert RMetric(model).rises_only and not RMetric(model, variant="published").rises_only
    assert not RMetric(model, rises_only=False).rises_only
    assert RMetric(model, variant="published", rises_only=True).rises_only


@pytest.mark.parametrize("seed", range(3))
def test_r_metric_rises_only_can_only_remove_alarms(seed):
    """Zeroing a fall's loss term lowers R at that check and leaves every history as it was, so the
    rises-only rule alarms at a subset of the |dL| rule's checks: what lets the README count the
    controls the |dL| rule left quiet as quiet under it too."""
    gen = torch.Generator().manual_seed(seed)
    jumps = torch.randint(-1, 2, (300,), generator=gen) * (torch.rand(300, generator=gen) < 0.1)  # up or down
    losses = (3.0 + 0.05 * torch.randn(300, generator=gen) + 1.5 * jumps).tolist()
    sigma2 = torch.exp(torch.randn(300, generator=gen)).tolist()
    alarms = {}
    for rule in (False, True):
        metric = RMetric(nn.Module(), rises_only=rule)
        alarms[rule] = set()
        for t, (loss, s2) in enumerate(zip(losses, sigma2, strict=True)):
            change = metric.loss_change(loss)
            if metric.score(t, {"lambda": 0.0, "sigma2": s2, "dloss": abs(change)}, fell=change < 0)[1]:
                alarms[rule].add(t)
    assert alarms[False] and alarms[True] <= alarms[False] and alarms[True] != alarms[False]


def test_r_metric_loss_change_is_the_term_check_logs_with_its_sign():
    """``loss_change`` is dL with its sign, so a saved run's own losses tell a replay which side of
    its mean each check's loss was on; a non-finite loss is 10 and leaves the mean alone."""
    model = nn.Linear(4, 4)
    watched, replayed = RMetric(model), RMetric(nn.Module())
    model.weight.grad, model.bias.grad = torch.ones(4, 4), torch.ones(4)
    for t, loss in enumerate([4.0, 3.0, 3.5, math.inf, 2.0]):
        logged = watched.check(t, loss)[0]["r_dloss"]
        change = replayed.loss_change(loss)
        assert logged == abs(change)
    assert [replayed.loss_change(x) for x in (2.5, 4.0)] == pytest.approx([2.5 - 12.5 / 4, 4.0 - 15.0 / 5])


GPT_MONITORS = ["spectral_alignment", "sublayer_ratio", "attention_entropy", "attention_logits", "output_logits"]
HF_MONITORS = ["spectral_alignment", "sublayer_ratio", "attention_entropy", "attention_logits"]  # no vocabulary head


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: GPT(GPTConfig(n_layers=2)), [*GPT_MONITORS, "r_metric"]),
        (lambda: GPT(GPTConfig(n_layers=2, n_experts=4)), [*GPT_MONITORS, "router", "r_metric"]),
        ("llama", [*HF_MONITORS, "r_metric"]),
        ("mixtral", [*HF_MONITORS, "router", "r_metric"]),
        ("gpt2", [*HF_MONITORS, "r_metric"]),  # Conv1D projections
    ],
)
def test_monitor_picks_the_monitors_that_apply(make, expected):
    from transformers import AutoModel

    model = AutoModel.from_config(hf_config(make)) if isinstance(make, str) else make()
    assert Monitor(model).names == expected


def test_monitors_read_gpt2_conv1d_weights_as_the_linear_maps_they_are():
    """GPT-2 stores every projection transposed (Conv1D): sigma_1 and W_Q must come out the same as
    from an equivalent nn.Linear."""
    from transformers import GPT2Model

    from rksp_cli.monitors.base import linear_weight

    torch.manual_seed(0)
    model = GPT2Model(hf_config("gpt2"))
    conv = model.h[0].mlp.c_fc
    linear = nn.Linear(conv.weight.shape[0], conv.weight.shape[1])
    linear.weight.data = conv.weight.data.T.clone()
    assert torch.equal(linear_weight(conv), linear.weight)
    site = find_attention(model)[0]
    q, _ = site.weights()
    d = model.config.n_embd
    assert q.shape == (d, d) and torch.equal(q, model.h[0].attn.c_attn.weight[:, :d].T)
    monitor = Monitor(model, every=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(0, 96, (2, 16))
    for step in range(6):  # the QK entropy needs 4 checks of lag
        loss = model(input_ids=ids).last_hidden_state.square().mean()
        loss.backward()
        monitor.step(step, loss=loss)
        optimizer.step()
        optimizer.zero_grad()
    metrics = monitor.last_metrics
    assert math.isfinite(metrics["qk_entropy_mean/h.0.attn"]) and math.isfinite(metrics["sa_entropy_min"])
    sigma = metrics["sa_sigma1/h.0.mlp.c_fc"]  # power iteration against the exact top singular value
    assert sigma == pytest.approx(float(torch.linalg.matrix_norm(conv.weight.detach(), 2)), rel=0.05)


def test_monitor_log_is_read_back_and_watched(tmp_path):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layers=2, n_experts=2))
    log = tmp_path / "metrics.jsonl"
    mon = Monitor(model, every=2, log=log)
    for step in range(6):
        ids = torch.randint(0, 103, (4, 16))
        _, loss = model(ids, ids)
        loss.backward()
        mon.step(step, loss=loss)
    lines = log.read_text().splitlines()
    assert json.loads(lines[0])["event"] == "start" and len(lines) == 1 + 3  # checks at steps 0, 2, 4
    with log.open("a") as f:
        f.write('{"step": 6, "metr')  # a line the job is still writing
    parsed = read_log(log)
    assert [c["step"] for c in parsed.checks] == [0, 2, 4] and parsed.unreadable == 0
    assert len(parsed.series("sa_entropy_min", min)) == 3
    result = CliRunner().invoke(app, ["watch", str(log), "--once"])
    assert result.exit_code == 0, result.output
    assert "spectral alignment" in result.output and "router token entropy" in result.output
    missing = CliRunner().invoke(app, ["watch", str(tmp_path / "nope.jsonl"), "--once"])
    assert missing.exit_code == 2 and "nope.jsonl" in missing.output


def test_fault_harness_labels_the_run_and_reports_per_monitor():
    job = FaultJob(steps=40, inject_at=20, every=5, lr_factor=1000.0)
    run = run_fault("lr_jump", job, monitors=["r_metric"])
    assert run.diverged_step is not None and run.diverged_step >= job.inject_at
    (row,) = run.summary()
    assert row["monitor"] == "r_metric" and row["fault"] == "lr_jump" and row["overhead_pct"] >= 0
    with pytest.raises(ValueError, match="unknown fault"):
        run_fault("cosmic_ray", job)


def test_faults_cli_reports_every_monitor_of_the_clean_and_faulted_runs():
    args = ["faults", "--fault", "lr_jump", "--steps", "30", "--inject-at", "15", "--every", "5", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert {(r["fault"], r["monitor"]) for r in rows} == {
        (f, m) for f in ("clean", "lr_jump") for m in (*GPT_MONITORS, "router", "r_metric")
    }
    assert all(r["loss_departs"] is None for r in rows if r["fault"] == "clean")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [(["--fault", "cosmic_ray"], "cosmic_ray"), (["--steps", "10", "--inject-at", "10"], "--inject-at")],
)
def test_faults_cli_rejects_bad_options(args, fragment):
    result = CliRunner().invoke(app, ["faults", *args])
    assert result.exit_code == 2 and fragment in result.stderr


def test_trainer_callback_logs_monitor_metrics(tmp_path):
    from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments

    from rksp_cli.hf_trainer import attach_monitor

    class Reporter(TrainerCallback):  # stands in for TensorBoard / W&B: sees what they would log
        def __init__(self):
            self.seen = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.seen.append(dict(logs))

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config("llama"))
    ids = torch.randint(0, 96, (16, 32), generator=torch.Generator().manual_seed(0))
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4, report_to=[],
        save_strategy="no", logging_steps=2, use_cpu=True, seed=0,
    )  # fmt: skip
    data = [{"input_ids": r, "labels": r} for r in ids]
    reporter = Reporter()
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[reporter])
    callback = attach_monitor(trainer, every=2, log=tmp_path / "m.jsonl")
    trainer.train()
    checks = read_log(tmp_path / "m.jsonl").checks
    assert [c["step"] for c in checks] == [0, 2] and all(math.isfinite(c["loss"]) for c in checks)
    logged = [entry for entry in reporter.seen if "loss" in entry]
    assert logged and all("rksp/r_metric" in entry for entry in logged)
    assert callback.monitor.names == [*GPT_MONITORS, "r_metric"]  # a causal LM: its vocabulary head is found


def test_trainer_callback_backs_off_the_lr_through_the_trainer_s_scheduler_up_to_its_cap(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from rksp_cli.hf_trainer import attach_monitor

    real = Monitor.step
    monkeypatch.setattr(Monitor, "step", lambda self, step, loss=None: real(self, step, loss) + (
        [Alert(step, "fake", None, 1.0, 0.5, "alarm", "test")] if step in (1, 2) else []))  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config("llama"))
    ids = torch.randint(0, 96, (16, 32), generator=torch.Generator().manual_seed(0))
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4, report_to=[], learning_rate=1e-3,
        lr_scheduler_type="constant", save_strategy="no", use_cpu=True, seed=0,
    )  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=[{"input_ids": r, "labels": r} for r in ids])
    callback = attach_monitor(trainer, every=1, policy="backoff", max_actions=1)
    trainer.train()
    assert [(a["step"], a["action"]) for a in callback.actions] == [(1, "backoff"), (2, "ignored")]
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(5e-4)  # the constant schedule kept the cut


def test_metrics_reach_tensorboard_and_an_active_wandb_run(monkeypatch):
    import types

    class Writer:
        def __init__(self):
            self.scalars = []

        def add_scalar(self, tag, value, step):
            self.scalars.append((tag, step))

    logged = []
    fake_wandb = types.SimpleNamespace(run=object(), log=lambda data, commit: logged.append((data, commit)))
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb)
    model = GPT(GPTConfig(n_layers=1))
    writer = Writer()
    mon = Monitor(model, every=1, monitors=["spectral_alignment"], tensorboard=writer)
    model(torch.randint(0, 103, (2, 8)))
    mon.step(0)
    assert ("rksp/sa_entropy_min", 0) in writer.scalars
    assert logged and "rksp/sa_entropy_min" in logged[0][0] and logged[0][1] is False


def test_watch_follows_the_log_until_interrupted(tmp_path, monkeypatch):
    log = tmp_path / "m.jsonl"
    log.write_text('{"event": "start", "every": 1, "monitors": ["r_metric"]}\n')
    calls = []

    def sleep(seconds):  # the job appends a check, then the user presses Ctrl-C
        calls.append(seconds)
        if len(calls) == 1:
            with log.open("a") as f:
                f.write(json.dumps({"step": 0, "loss": 4.2, "metrics": {"r_metric": 0.1}, "alerts": []}) + "\n")
        else:
            raise KeyboardInterrupt

    monkeypatch.setattr("time.sleep", sleep)
    result = CliRunner().invoke(app, ["watch", str(log), "--interval", "0.5"])
    assert result.exit_code == 0, result.output
    assert calls == [0.5, 0.5] and "R-Metric" in result.output


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: GPT(GPTConfig(n_layers=1, norm="pre")), {"blocks.0.attn": "norm1", "blocks.0.mlp": "norm2"}),
        (lambda: GPT(GPTConfig(n_layers=1, norm="post")), {"blocks.0.attn": "attn", "blocks.0.mlp": "mlp"}),
        ("llama", {"layers.0.self_attn": "input_layernorm", "layers.0.mlp": "post_attention_layernorm"}),
        ("gpt2", {"h.0.attn": "ln_1", "h.0.mlp": "ln_2"}),
    ],
)
def test_sublayers_pair_each_branch_with_the_stream_it_is_added_to(make, expected):
    """Pre-norm: the stream entering the norm before the branch; Post-LN: the branch's own input."""
    from transformers import AutoModel

    from rksp_cli.monitors import core_model, residual_blocks

    model = core_model(AutoModel.from_config(hf_config(make)) if isinstance(make, str) else make())
    prefix, blocks = residual_blocks(model)
    found = {s.name: s for s in find_sublayers(blocks, prefix) if s.name.split(".")[1] == "0"}
    named = {m: n for n, m in blocks[0].named_children()}
    assert {name: named[s.shortcut] for name, s in found.items()} == expected


def test_sublayers_take_a_sandwich_block_s_pre_feedforward_norm():
    """Gemma-2-style blocks normalise the attention output (post_attention_layernorm) and the MLP input
    (pre_feedforward_layernorm): the MLP joins the stream entering the latter."""
    block = nn.Module()
    for name in ("input_layernorm", "self_attn", "post_attention_layernorm", "pre_feedforward_layernorm", "mlp"):
        setattr(block, name, nn.Identity())
    (attn, mlp) = find_sublayers([block], "layers")
    assert attn.shortcut is block.input_layernorm and mlp.shortcut is block.pre_feedforward_layernorm


def test_sublayer_ratio_is_the_branch_s_size_against_its_shortcut():
    """A pre-norm block whose branch doubles its input (through an identity norm) has ratio 2 at every
    check, and nothing is recorded on steps that are not checks."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.attn = nn.Identity(), nn.Linear(8, 8, bias=False)
            nn.init.eye_(self.attn.weight)
            self.attn.weight.data *= 2

        def forward(self, x):
            return x + self.attn(self.norm1(x))

    blocks = nn.ModuleList([Block()])
    monitor = SublayerRatio(find_sublayers(blocks, "blocks"))
    x = torch.randn(4, 5, 8)
    monitor.sampler.armed = False
    blocks[0](x)
    assert monitor.check(0) == ({}, [])
    monitor.sampler.armed = True
    blocks[0](x)
    metrics, _ = monitor.check(1)
    assert metrics["sublayer_ratio/blocks.0.attn"] == pytest.approx(2.0, rel=1e-6)
    monitor.remove()
    assert not blocks[0].attn._forward_hooks and not blocks[0].norm1._forward_pre_hooks


def _burst_alarms(series: list[float], jump: float = JUMP, floor: float = FLOOR) -> list[int]:
    rule = SublayerBurst(["b"], (FOLD, Z, jump), floor=floor)
    return [t for t, r in enumerate(series) if rule.score(t, "b", r)]


def test_sublayer_burst_alarms_on_a_jump_against_a_flat_history_not_on_growth_or_wiggles():
    """A 4x jump on a noisy but flat history alarms, once; steady growth reaches 3x its median without
    a z of 8 (the fold test alone would fire), and a 20% wiggle on a series flat to the last digit
    reaches z 8 without the fold (the z test alone would fire)."""
    flat = [0.1 * (1 + 0.03 * math.sin(t)) for t in range(30)]
    assert _burst_alarms([*flat[:25], 0.4, *flat[25:]]) == [25]
    growth = [0.1 * 1.12**t for t in range(40)]
    assert growth[30] / statistics.median(growth[10:30]) >= FOLD and _burst_alarms(growth) == []
    still = [0.1] * 25 + [0.12] + [0.1] * 5
    assert math.log(1.2) / (MAD_TO_SIGMA * 0.01) >= 8 and _burst_alarms(still) == []


def test_sublayer_burst_scores_nothing_before_its_minimum_history():
    """The same burst on the same flat series alarms with MIN_HISTORY checks behind it, not with one
    fewer: early training's settling branches are not judged (Pre-LN controls 86 and 88)."""
    flat = [0.1 * (1 + 0.03 * math.sin(t)) for t in range(MIN_HISTORY + 5)]
    for at, expected in ((MIN_HISTORY - 1, []), (MIN_HISTORY, [MIN_HISTORY])):
        assert _burst_alarms([*flat[:at], 0.4, *flat[at:]]) == expected


def test_sublayer_burst_needs_a_jump_over_the_previous_check_not_only_growth_then_a_step():
    """Growth over a few checks that ends in a 1.45x step clears the fold and the z (a clean
    fault-harness run did this) but not the jump; a step just over JUMP from the same history
    alarms (just over: the rule reads the previous ratio back through exp(log(r)))."""
    history = [0.15 * (1 + 0.02 * math.sin(t)) for t in range(14)] + [0.15 * 1.15**t for t in range(1, 7)]
    growth_then_step = [*history, history[-1] * 1.45]
    assert _burst_alarms(growth_then_step) == []
    assert _burst_alarms([*history, history[-1] * JUMP * 1.01]) == [len(history)]
    assert _burst_alarms(growth_then_step, jump=1.0) == [len(history)]  # fold and z alone


def test_sublayer_burst_does_not_alarm_on_a_branch_too_small_to_move_the_stream():
    """The width-64 control of seed 272: an MLP branch at about 1% of its shortcut jumped 4.7x, a burst
    by every test but its size. Under ``FLOOR`` it does not alarm; the same series ten times larger
    (0.1 and up) does, and so does the small one with no floor."""
    flat = [0.01 * (1 + 0.03 * math.sin(t)) for t in range(30)]
    small = [*flat[:25], 0.047, *flat[25:]]
    assert _burst_alarms(small) == [] and _burst_alarms(small, floor=0.0) == [25]
    assert _burst_alarms([10 * r for r in small]) == [25]


def test_the_floor_only_filters_alarms_each_branch_s_history_takes_every_ratio():
    """With the floor, the alarms are exactly those without it whose ratio reaches the floor: a
    sub-floor burst still enters the history, so the checks after it score as they would without
    the floor (what lets benchmarks/candidate_replay.py replay it on logged runs)."""
    rng = random.Random(0)
    level = [0.02 + 0.06 * (t // 60 % 2) for t in range(360)]  # stretches under and over the floor
    series = [v * math.exp(rng.gauss(0, 0.05)) * (5 if rng.random() < 0.04 else 1) for v in level]
    unfloored, floored = _burst_alarms(series, floor=0.0), _burst_alarms(series)
    assert floored == [t for t in unfloored if series[t] >= FLOOR]
    assert floored and len(floored) < len(unfloored)  # the series has bursts on both sides of it


def test_sublayer_ratio_alarms_on_a_branch_that_jumps_and_rescores_its_log_exactly(tmp_path):
    """Post-LN GPT trained with the monitor on; at step 40 one MLP's output projection is scaled 20x:
    the monitor alarms on that sub-layer, and the rule fed the logged ratios gives the same alarms.
    (At lr 1e-3 the same jump does not alarm: the ratios still grow fast, their spread hides it.)"""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layers=2, norm="post"))
    monitor = Monitor(model, every=2, monitors=["sublayer_ratio"], log=tmp_path / "m.jsonl")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)  # slow enough for a flat history
    ids = torch.randint(0, 103, (4, 16))
    alerts = []
    for step in range(46):
        if step == 40:  # the 21st check: past the rule's minimum history
            with torch.no_grad():
                model.blocks[1].mlp.proj.weight.mul_(20)
        _, loss = model(ids, ids)
        loss.backward()
        alerts += monitor.step(step, loss=loss)
        optimizer.step()
        optimizer.zero_grad()
    assert alerts and alerts[0].step == 40 and {a.layer for a in alerts} == {"blocks.1.mlp"}
    checks = [(r["step"], r["metrics"]) for r in read_log(tmp_path / "m.jsonl").checks]
    rescored = SublayerBurst(s.name for s in monitor.monitors[0].sites).rescore(checks)
    assert rescored == alerts


def test_sublayer_burst_restored_from_a_snapshot_scores_as_it_did_when_it_was_taken():
    """A guard's rollback brings the rule's history back with the weights (``snapshot``, ``restore``).
    A stretch of bursts that passed unalarmed against the unsettled history of a run's first checks,
    met again after a rollback to it, passes again; scored against the settled history since, as when
    the history was kept across a restore (through seed 459), it alarms: held-out 458's twin was sent
    back to the same state five more times so."""
    early = [0.05, 0.2, 0.06, 0.35, 0.05, 0.12, 0.3, 0.055, 0.25, 0.05] * 2
    settled = [0.05 * (1 + 0.02 * math.sin(t)) for t in range(20)]
    rule = SublayerBurst(["b"])
    assert not [t for t, r in enumerate(early) if rule.score(t, "b", r)]  # the first time: no alarm
    snapshot = rule.snapshot()
    assert not [t for t, r in enumerate(settled, 20) if rule.score(t, "b", r)]
    kept = SublayerBurst(["b"])
    kept.restore(rule.snapshot())  # the history as it stands after the settled stretch
    rule.restore(snapshot)
    again = early[:10]
    assert [t for t, r in enumerate(again, 40) if kept.score(t, "b", r)]
    assert not [t for t, r in enumerate(again, 40) if rule.score(t, "b", r)]


def test_monitor_restored_with_a_snapshot_brings_sublayer_history_back_and_without_keeps_it():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layers=1))
    monitor = Monitor(model, every=1, monitors=["sublayer_ratio", "attention_entropy"])
    ids = torch.randint(0, 103, (2, 16))

    def history() -> dict[str, list[float]]:
        return {name: list(drift.history) for name, drift in monitor.monitors[0].rule.drifts.items()}

    def checks(n: int) -> None:
        for step in range(n):
            _, loss = model(ids, ids)
            monitor.step(step, loss=loss)

    checks(3)
    snapshot, then = monitor.snapshot(), history()
    assert set(snapshot) == {"sublayer_ratio"} and all(len(h) == 3 for h in then.values())
    checks(2)
    now = history()
    monitor.restored()  # no snapshot: kept (attention_entropy is told either way)
    assert history() == now
    monitor.restored(snapshot)
    assert history() == then
    checks(1)
    assert all(len(h) == 4 for h in history().values()) and all(len(h) == 3 for h in then.values())
