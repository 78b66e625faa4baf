"""The spike detectors at matched false alarms: each at the most sensitive setting that stays quiet
on the tuning seeds' healthy runs, then judged on held-out seeds beside rksp's monitors (issue 16).

At their documented defaults three of the four detectors never fire on a slow failure and the fourth
(OLMo-core's 6-sigma skip rule) fires on every healthy deep run, so "earlier than every spike
detector" compares rksp with rules nobody tuned for these runs. A team would tune one: here each
detector's sensitivity knob is swept (Lightning's ``rtol``, OLMo-core's ``sigma_factor``,
llm-foundry's ``outlier_multiplier``, Megatron-LM's ``factor``), the most sensitive setting with no
false alarm on the tuning seeds' controls is kept, and that setting is run on the held-out seeds'
failing runs and controls. rksp's monitors are as shipped, one added and four of their rules changed
after some held-out runs had been seen: the R-Metric's scoring of its gradient variance by factors (chosen
after seeds 18-29, first run on 30-35), spectral alignment's exemption of layers fed by a bounded
activation (chosen after deep Post-LN's healthy low-lr runs of seeds 30-35 alarmed, checked on
those of seeds 0-5 and 36-41), its asking for a fresh collapse (chosen after seeds 0-47, first
scored on 48-53), attention entropy's scoring only layers whose updates spread (chosen after
seeds 0-53, first scored on 54-59), and the sub-layer burst monitor (chosen on the failing runs of
seeds 46, 48, 58 and 59 and the controls of 46 and 58, first run on 60-65). So the comparison is
at (about) equal false alarms, out of sample for the detectors and, but for those rules, for rksp.

A pure replay of the runs ``benchmarks/monitors.py`` saved under benchmarks/results/monitors/
(their recorded losses and pre-clip gradient norms) of the tuning and held-out seeds: no training,
a few minutes on 2 cores. Only rksp's alarms on the held-out seeds are read. The monitors whose
rules changed, and the sub-layer one, are rescored from each run's logged metrics, exactly, since
none reads anything else: the R-Metric from its components (``RMetric.score``), spectral alignment
from each layer's sign entropy and sigma_1 (``SignCollapse``) with today's exemptions and freshness,
attention entropy from each layer's QK-update entropy (``UpdateConcentration``), sub-layer bursts
from each branch's ratio (``SublayerBurst``); every other monitor's alarms are as logged. A run
watched before a monitor existed has none of its alarms. The tuning seeds lend only their
controls' losses; with ``--settings-from`` an earlier results file lends its settings instead, so
only the held-out runs need be saved. Writes benchmarks/results/monitors-matched.json (``--out``):
the rows, and run by run the held-out failing runs they sum (``failing_runs``); prints both as
Markdown.
Run: python benchmarks/matched_detectors.py [--held-out 42-47] [--tuning 0-5 | --settings-from
FILE] [--runs DIR] [--workers 2] (make bench-monitors-matched); ``--runs`` judges runs saved
elsewhere, e.g. a set trained again on another CPU.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import statistics
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rksp_cli.errors import InputError
from rksp_cli.files import atomic_path, check_writable
from rksp_cli.models.gpt import GPT
from rksp_cli.monitors.attention_entropy import (
    ALONE_FALL,
    CORROBORATE,
    UpdateConcentration,
    find_attention,
    spectrum_widths,
)
from rksp_cli.monitors.attention_logits import GROWTH, PREFIX, growth_alarm
from rksp_cli.monitors.base import Alert
from rksp_cli.monitors.failures import FAILURES, GPU_FAILURES, WatchedRun, by_kind, monitor_code
from rksp_cli.monitors.r_metric import WEIGHTS, RMetric
from rksp_cli.monitors.spectral_alignment import SignCollapse, activation_fed_layers
from rksp_cli.monitors.spike_detectors import (
    FoundryKillLossSpike,
    LightningSpikeDetection,
    MegatronSpikyLoss,
    OlmoSkipStep,
    first_alarm,
)
from rksp_cli.monitors.sublayer_ratio import FLOOR, FOLD, JUMP, MIN_HISTORY, SublayerBurst, Z, find_sublayers

RUNS = Path(__file__).parent / "results" / "monitors"  # where benchmarks/monitors.py saves each run
RESULTS = RUNS.parent / "monitors-matched.json"
TUNING = "0-5"  # the seeds whose controls tune the detectors, unless told otherwise
# Per detector: its knob, the documented default, and the settings swept, from the least to the
# most sensitive. Lightning, llm-foundry and Megatron-LM never fire on these runs at their defaults,
# so their knobs go down from the default towards any rise of the loss; OLMo-core's fires on every
# healthy deep run, so its sigma also goes up.
KNOBS: dict[type, tuple[str, float, list[float]]] = {
    LightningSpikeDetection: ("rtol", 2.0, [2.0, 1.0, 0.5, 0.3, 0.2, 0.15, 0.1, 0.07, 0.05, 0.03, 0.02, 0.01]),
    OlmoSkipStep: ("sigma_factor", 6.0, [100, 50, 30, 20, 15, 12, 10, 8, 6, 5, 4]),
    FoundryKillLossSpike: ("outlier_multiplier", 2.0, [2.0, 1.5, 1.3, 1.2, 1.15, 1.1, 1.07, 1.05, 1.03, 1.02, 1.01]),
    MegatronSpikyLoss: ("factor", 10.0, [10.0, 5.0, 3.0, 2.0, 1.5, 1.3, 1.2, 1.1, 1.05, 1.02, 1.0]),
}
# rksp's first alarm of any monitor as shipped, and as a guard with one monitor left out
# (``Monitor(monitors=[...])``): the R-Metric, whose false alarms on healthy deep runs asked for it
# before it scored its gradient variance by factors, spectral_alignment, which alarmed on healthy
# Post-LN runs (deep Post-LN's low-lr control), and sublayer_ratio, the newest (what rksp was before it)
RKSP = "rksp (first alarm of any monitor, as shipped)"
WITHOUT = {
    "rksp without the R-Metric": "r_metric",
    "rksp without spectral_alignment": "spectral_alignment",
    "rksp without sublayer_ratio": "sublayer_ratio",
}
# Issue 16's lead bar: an alarm at least this many steps, and this share of the steps run, before the failure
BAR_STEPS, BAR_SHARE = 100, 0.10
NAME = re.compile(r"(?P<failure>[a-z_0-9]+)-(?P<kind>failing|control[a-z_0-9]*)-(?P<seed>\d+)\.json")


def matched_setting(false_alarms: Sequence[int], settings: Sequence[float]) -> float | None:
    """The most sensitive setting before the first that raised a false alarm (``settings`` run from
    least to most sensitive), or None when the least sensitive did: what a team turning its knob
    down until the first false alarm would keep."""
    quiet = None
    for setting, alarms in zip(settings, false_alarms, strict=True):
        if alarms:
            break
        quiet = setting
    return quiet


def r_metric_alarm(run: WatchedRun, rises_only: bool | None = None) -> int | None:
    """Today's R-Metric's first alarm on a saved run, rescored check by check from its logged
    components: the same alarms as a run watched under today's code. ``rises_only`` True or False
    picks the rule whose loss term scores only a loss above its recent mean or any change
    (benchmarks/candidate_replay.py; None: the shipped one); which side the loss was on is read from
    the run's own losses at its checks, as the monitor reads them."""
    metric = RMetric(nn.Module(), rises_only=rises_only)
    for check in run.series:
        logged, step = check["metrics"], check["step"]
        if "r_metric" not in logged:
            continue
        fell = metric.loss_change(run.losses[step]) < 0
        if metric.score(step, {k: logged[f"r_{k}"] for k in WEIGHTS}, fell=fell)[1]:
            return step
    return None


@functools.cache
def _model(failure: str, kind: str) -> GPT:
    """The model of a failure's runs of one kind (the GPU-sized ones too): its structure is every seed's."""
    return GPT({**FAILURES, **GPU_FAILURES}[failure].spec(kind, 0).model.gpt_config())


@functools.cache
def activation_fed(failure: str, kind: str) -> frozenset[str]:
    """The layers today's spectral alignment leaves out (fed by a bounded activation) in the model of a
    failure's runs of one kind."""
    model = _model(failure, kind)
    tokens = torch.randint(0, model.cfg.vocab_size, (1, model.cfg.seq_len))
    return frozenset(activation_fed_layers(model, tokens))


def first_of(steps: Iterable[int | None]) -> int | None:
    """The earliest of some alarm steps, None standing for no alarm; None when there is none."""
    return min((step for step in steps if step is not None), default=None)


def saved_runs(seeds: set[int], runs: Path = RUNS) -> list[Path]:
    """The unguarded runs of ``seeds`` that ``benchmarks/monitors.py`` saved under ``runs``."""
    return sorted(p for p in runs.glob("*.json") if (name := NAME.fullmatch(p.name)) and int(name["seed"]) in seeds)


def _first_alarm(rule: SignCollapse | UpdateConcentration, run: WatchedRun) -> int | None:
    """A rule's first alarm on a saved run, rescored from its logged metrics check by check."""
    return first_of(a.step for a in rule.rescore((c["step"], c["metrics"]) for c in run.series) if a.level == "alarm")


def attention_entropy_alarm(
    run: WatchedRun, corroborate: int = CORROBORATE, alone_fall: float = ALONE_FALL
) -> int | None:
    """Today's attention entropy's first alarm on a saved run, rescored from its logged per-layer
    entropies (``UpdateConcentration``: exact, since the rule reads nothing else); with
    ``corroborate`` and ``alone_fall``, the rule asking that many layers to breach at the alarm's
    check unless its layer fell that far (candidates: benchmarks/candidate_replay.py)."""
    widths = spectrum_widths(find_attention(_model(run.failure, run.kind)))
    return _first_alarm(UpdateConcentration(widths, corroborate, alone_fall), run)


def spectral_alignment_alerts(run: WatchedRun) -> list[Alert]:
    """Today's spectral alignment's alerts on a saved run, rescored from its logged sign entropies and
    sigma_1 (``SignCollapse``: exact, since the rule reads nothing else) with today's exemptions
    (margins: benchmarks/alignment_margin.py)."""
    rule = SignCollapse(set(activation_fed(run.failure, run.kind)))
    return rule.rescore((c["step"], c["metrics"]) for c in run.series)


def spectral_alignment_alarm(run: WatchedRun) -> int | None:
    """Today's spectral alignment's first alarm on a saved run (``spectral_alignment_alerts``)."""
    return first_of(a.step for a in spectral_alignment_alerts(run) if a.level == "alarm")


def sublayer_ratio_alerts(
    run: WatchedRun,
    min_history: int = MIN_HISTORY,
    thresholds: tuple[float, float, float] = (FOLD, Z, JUMP),
    floor: float = FLOOR,
) -> list[Alert]:
    """Today's sub-layer burst rule's alarms on a saved run, rescored from its logged ratios
    (``SublayerBurst``: exact, since the rule reads nothing else); with ``min_history``,
    ``thresholds`` (fold, z, jump) or ``floor``, the rule with no score before that many checks,
    with those thresholds or with that least ratio (candidates: benchmarks/candidate_replay.py;
    margins: benchmarks/sublayer_margin.py)."""
    names = (s.name for s in find_sublayers(_model(run.failure, run.kind).blocks, "blocks"))
    rule = SublayerBurst(names, thresholds, min_history, floor)
    return rule.rescore((c["step"], c["metrics"]) for c in run.series)


def sublayer_ratio_alarm(
    run: WatchedRun,
    min_history: int = MIN_HISTORY,
    thresholds: tuple[float, float, float] = (FOLD, Z, JUMP),
    floor: float = FLOOR,
) -> int | None:
    """The first of ``sublayer_ratio_alerts``: that rule's first alarm on a saved run."""
    return first_of(a.step for a in sublayer_ratio_alerts(run, min_history, thresholds, floor))


def attention_logits_alarm(run: WatchedRun, growth: float = GROWTH) -> int | None:
    """The attention-logit rule's first alarm on a saved run, rescored from its logged per-layer
    largest logits (``growth_alarm``: exact, since the rule reads nothing else); with ``growth``, a
    candidate growth factor (benchmarks/candidate_replay.py)."""
    alarm = growth_alarm(growth)
    for check in run.series:
        for key, value in check["metrics"].items():
            if key.startswith(PREFIX) and alarm.update(check["step"], key.removeprefix(PREFIX), value):
                return check["step"]
    return None


RESCORED = {
    "r_metric": r_metric_alarm,
    "spectral_alignment": spectral_alignment_alarm,
    "attention_entropy": attention_entropy_alarm,
    "sublayer_ratio": sublayer_ratio_alarm,
}


def monitor_alarms(run: WatchedRun) -> dict[str, int | None]:
    """Each monitor's first alarm on a saved run under today's rules: rescored where its rule changed
    (``RESCORED``), as logged otherwise."""
    return {m: RESCORED[m](run) if m in RESCORED else run.monitor_alarm(m) for m in run.monitors}


def _replay(path: Path) -> dict[str, Any]:
    """One saved run: its failure step and first alarms, rksp's (``RKSP``, ``WITHOUT``) and each
    detector setting's, keyed "detector name#setting index"."""
    run = WatchedRun.from_dict(json.loads(path.read_text()))
    alarms = {
        f"{cls.name}#{i}": first_alarm(cls(**{knob: value}), run.losses, run.grad_norms)
        for cls, (knob, _, values) in KNOBS.items()
        for i, value in enumerate(values)
    }
    first = monitor_alarms(run)
    for key, left_out in ((RKSP, None), *WITHOUT.items()):
        alarms[key] = first_of(step for m, step in first.items() if m != left_out)
    name = NAME.fullmatch(path.name)  # not run.failure: a control variant (post_ln_warmup1000) keeps its own
    return {
        "failure": name["failure"], "kind": run.kind, "seed": run.seed, "failed": run.failed_step, "alarms": alarms,
        "monitor_code": run.monitor_code,
    }  # fmt: skip


def clean_control(run: dict[str, Any]) -> bool:
    """A replayed control that did not fail itself: the only kind an alarm is false on, and the only
    kind a detector is tuned on (failures.py)."""
    return run["kind"] != "failing" and run["failed"] is None


def lead(failed: int | None, alarm: int | None) -> int | None:
    """Steps from a first alarm to the failure; None without a failure, or an alarm at or before it."""
    return failed - alarm if failed is not None and alarm is not None and alarm <= failed else None


def _lead(run: dict[str, Any], watcher: str) -> int | None:
    """``lead`` for one watcher of a replayed run."""
    return lead(run["failed"], run["alarms"][watcher])


def bar_met(lead: int | None, failed: int | None) -> bool:
    """Issue 16's lead bar for one failure at step ``failed``: an alarm ``BAR_STEPS`` and
    ``BAR_SHARE`` of the run or more before it; never met by a run that did not fail."""
    return failed is not None and lead is not None and lead >= BAR_STEPS and lead >= BAR_SHARE * failed


def _judge(failing: list[dict[str, Any]], controls: list[dict[str, Any]], watcher: str) -> dict[str, Any]:
    """One watcher's figures on the held-out runs."""
    failed = [r for r in failing if r["failed"] is not None]
    leads = [(lead, r["failed"]) for r in failed if (lead := _lead(r, watcher)) is not None]
    return {
        "failed": len(failed),
        "alarmed": len(leads),
        "median_lead_steps": statistics.median(lead for lead, _ in leads) if leads else None,
        "median_lead_share": statistics.median(lead / max(at, 1) for lead, at in leads) if leads else None,
        "lead_bar_met": sum(bar_met(lead, at) for lead, at in leads),
        "controls": len(controls),
        "false_alarms": sum(r["alarms"][watcher] is not None for r in controls),
        "false_alarms_by_control": {
            kind: f"{sum(r['alarms'][watcher] is not None for r in mine)}/{len(mine)}"
            for kind in dict.fromkeys(r["kind"] for r in controls)
            if (mine := [r for r in controls if r["kind"] == kind])
        },
    }


def _before(run: dict[str, Any], first: str, then: str) -> bool:
    """``first`` alarmed before the run failed, and before ``then`` (or ``then`` never did)."""
    return _lead(run, first) is not None and (_lead(run, then) is None or run["alarms"][first] < run["alarms"][then])


def _earlier(failing: list[dict[str, Any]], first: str, then: str) -> int:
    """Failures on which ``first`` alarmed before ``then`` (``_before``)."""
    return sum(_before(r, first, then) for r in failing)


def _earliest(run: dict[str, Any], watcher: str, detectors: Sequence[str]) -> bool:
    """``watcher`` alarmed before the run failed and before every one of ``detectors``."""
    return _lead(run, watcher) is not None and all(_before(run, watcher, k) for k in detectors)


def compare(
    runs: list[dict[str, Any]],
    held_out: set[int],
    tuning: set[int] | None = None,
    settings: dict[tuple[str, str], dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Per failure and detector: the setting matched on the tuning seeds' controls (``tuning``;
    None: every seed not held out), its held-out figures,
    and on how many held-out failures rksp's first alarm came before the detector's (or the detector
    had none before the failure); then rksp's monitors as shipped on the same runs, with the failures
    on which their first alarm came before every matched detector's.

    ``settings`` (``tuned_settings``: by failure and detector, a setting and the tuning it came
    from) takes each matched setting from an earlier comparison instead: the tuning seeds' runs are
    then not needed, and the curve's tuning false alarms are not known (None)."""
    rows = []
    for failure in dict.fromkeys(r["failure"] for r in runs):
        mine = [r for r in runs if r["failure"] == failure]
        clean = [r for r in mine if clean_control(r)]
        controls = [r for r in clean if r["seed"] in held_out]
        failing = [r for r in mine if r["kind"] == "failing" and r["seed"] in held_out]
        spare = [r for r in clean if r["seed"] not in held_out]
        tune = [r for r in spare if tuning is None or r["seed"] in tuning]
        if not failing or (settings is None and not tune):
            continue
        matched = []  # each detector's key at its matched setting
        for cls, (knob, default, values) in KNOBS.items():
            keys = [f"{cls.name}#{i}" for i in range(len(values))]
            if settings is None:
                counts = [sum(r["alarms"][k] is not None for r in tune) for k in keys]
                tuned = {"setting": matched_setting(counts, values), "tuning_controls": len(tune),
                         "tuning_seeds": sorted({r["seed"] for r in tune})}  # fmt: skip
            elif (failure, cls.name) in settings:
                counts, tuned = [None] * len(values), settings[failure, cls.name]
            else:
                raise ValueError(f"the settings given have no tuned {cls.name} for {failure}")
            setting = tuned["setting"]
            row = {
                "failure": failure, "watcher": cls.name, "knob": knob, "default": default, **tuned,
                "curve": [{knob: v, "tuning_false_alarms": n, **_judge(failing, controls, k)}
                          for v, n, k in zip(values, counts, keys, strict=True)],
            }  # fmt: skip
            if setting is not None:
                key = keys[values.index(setting)]
                matched.append(key)
                row |= _judge(failing, controls, key)
                row["rksp_earlier"] = _earlier(failing, RKSP, key)
            rows.append(row)
        for rksp in (RKSP, *WITHOUT):
            rows.append({
                "failure": failure, "watcher": rksp, "setting": None, **_judge(failing, controls, rksp),
                "earlier_than_every_matched_detector": sum(_earliest(r, rksp, matched) for r in failing),
            })  # fmt: skip
    return rows


def tuned_settings(results: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """Each detector's matched setting, by failure and detector name, from an earlier comparison's
    results (what ``main`` writes), with the tuning it came from: ``compare``'s ``settings``."""
    return {
        (r["failure"], r["watcher"]): {k: r[k] for k in ("setting", "tuning_controls", "tuning_seeds")}
        for r in results["rows"]
        if "knob" in r
    }


def failing_runs(runs: list[dict[str, Any]], held_out: set[int], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run by run, the held-out failing runs behind ``compare``'s ``rows``: rksp's first alarm and each
    matched detector's, the lead, and whether it meets the lead bar and comes before every matched
    detector. The rows' counts are sums of these, so a pooled count can be checked seed by seed."""
    values = {cls.name: knob[2] for cls, knob in KNOBS.items()}
    table = []
    for failure in dict.fromkeys(r["failure"] for r in rows):
        matched = {
            r["watcher"]: f"{r['watcher']}#{values[r['watcher']].index(r['setting'])}"
            for r in rows
            if r["failure"] == failure and "knob" in r and r["setting"] is not None
        }
        for run in runs:
            if run["failure"] == failure and run["kind"] == "failing" and run["seed"] in held_out:
                ahead = _lead(run, RKSP)
                table.append({
                    "failure": failure, "seed": run["seed"], "failed": run["failed"], "rksp": run["alarms"][RKSP],
                    "lead": ahead, "lead_bar_met": bar_met(ahead, run["failed"]),
                    "earlier_than_every_matched_detector": _earliest(run, RKSP, list(matched.values())),
                    "matched_detectors": {name: run["alarms"][key] for name, key in matched.items()},
                })  # fmt: skip
    return sorted(table, key=lambda r: (r["failure"], r["seed"]))


def failed_controls(runs: list[dict[str, Any]], held_out: set[int]) -> list[dict[str, Any]]:
    """The held-out controls that failed themselves, left out of every false-alarm count, with the
    step each failed at and rksp's first alarm (None: none)."""
    return [
        {k: r[k] for k in ("failure", "kind", "seed", "failed")} | {"rksp": r["alarms"][RKSP]}
        for r in runs
        if r["kind"] != "failing" and not clean_control(r) and r["seed"] in held_out
    ]


def _step(step: int | str | None, missing: str = "none") -> str:
    return missing if step is None else str(step)


def runs_markdown(table: list[dict[str, Any]]) -> str:
    """``failing_runs`` as Markdown: one line per held-out failing run."""
    names = list(dict.fromkeys(name for r in table for name in r["matched_detectors"]))
    lines = [
        "| failure | seed | failed at | rksp's first alarm (lead) | lead bar | earliest | "
        + " | ".join(names) + " |",
        "|---|---|---|---|---|---|" + "---|" * len(names),
    ]  # fmt: skip
    for r in table:
        lead = "" if r["lead"] is None else f" ({r['lead']})"
        alarms = [_step(r["matched_detectors"].get(name, "-")) for name in names]
        cells = [
            r["failure"], str(r["seed"]), _step(r["failed"], "did not fail"), _step(r["rksp"]) + lead,
            "met" if r["lead_bar_met"] else "-", "yes" if r["earlier_than_every_matched_detector"] else "-", *alarms,
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| failure | watcher | setting (default) | tuning controls quiet | failures alarmed before "
        "| median lead (share) | false alarms, held-out controls | rksp earlier; rksp "
        "rows: earlier than every matched detector |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        tuned = "knob" in r
        if tuned and r["setting"] is None:
            cells = [f"{r['knob']}: none quiet ({r['default']:g})", f"0/{r['tuning_controls']}", *"----"]
        else:
            lead = r["median_lead_steps"]
            cells = [
                f"{r['knob']} {r['setting']:g} ({r['default']:g})" if tuned else "as shipped",
                f"{r['tuning_controls']}/{r['tuning_controls']}" if tuned else "-",
                f"{r['alarmed']}/{r['failed']}",
                "-" if lead is None else f"{lead:g} ({r['median_lead_share']:.0%})",
                f"{r['false_alarms']}/{r['controls']}{by_kind(r['false_alarms_by_control'])}",
                f"{r['rksp_earlier']}/{r['failed']}"
                if tuned
                else f"{r['earlier_than_every_matched_detector']}/{r['failed']}",
            ]
        lines.append(f"| {r['failure']} | {r['watcher']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def seed_range(text: str) -> set[int]:
    """'18-29' or '18': the seeds as a set (an argparse type: a bad range is a usage error)."""
    first, _, last = text.partition("-")
    last = last or first
    if not (first.isdigit() and last.isdigit()) or int(last) < int(first):
        raise argparse.ArgumentTypeError(f"{text!r} is not a seed range such as 18-29")
    return set(range(int(first), int(last) + 1))


def saved_runs_parser(doc: str) -> argparse.ArgumentParser:
    """The command line of a script that reads a set's saved runs: ``--seeds A-B`` and ``--runs``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--seeds", type=seed_range, required=True, help="the seeds read (a range a-b)")
    parser.add_argument("--runs", type=Path, default=RUNS, help="folder of the saved runs")
    return parser


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--held-out", type=seed_range, default="42-47", help="seeds judged (a range a-b)")
    tuned = parser.add_mutually_exclusive_group()
    tuned.add_argument("--tuning", type=seed_range, help=f"seeds whose controls tune the detectors (default {TUNING})")
    tuned.add_argument(
        "--settings-from",
        type=Path,
        help="take each detector's matched setting from this earlier results JSON instead of tuning "
        "again (the tuning seeds' runs are then not needed)",
    )
    parser.add_argument(
        "--runs", type=Path, default=RUNS, help="folder of the saved runs (another machine's reruns, say)"
    )
    parser.add_argument("--workers", type=int, default=2, help="runs replayed at a time")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results JSON")
    args = parser.parse_args()
    settings, tuning = None, args.tuning or seed_range(TUNING)
    if args.settings_from is not None:
        try:
            earlier = json.loads(args.settings_from.read_text())
            settings, tuning = tuned_settings(earlier), set(earlier["tuning_seeds"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            parser.error(f"--settings-from {args.settings_from}: not a results file of this script ({exc})")
    if tuning & args.held_out:
        parser.error("--tuning and --held-out share seeds")
    try:
        check_writable(args.out, "--out")
    except InputError as exc:
        parser.error(str(exc))
    seeds = args.held_out if settings is not None else tuning | args.held_out
    paths = saved_runs(seeds, args.runs)
    if not paths:
        parser.error(f"no saved runs of the tuning or held-out seeds under {args.runs}: run benchmarks/monitors.py")
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        runs = list(pool.map(_replay, paths))
    rows = compare(runs, args.held_out, tuning, settings)
    if not rows:
        parser.error(
            "no failure has both failing runs of the held-out seeds and controls of the tuning seeds under "
            f"{args.runs}: run them with benchmarks/monitors.py, or take the settings of an earlier comparison "
            "(--settings-from)"
        )
    held_out, today = [r for r in runs if r["seed"] in args.held_out], monitor_code()
    results = {
        "held_out_seeds": sorted(args.held_out),
        "tuning_seeds": sorted(tuning),
        **({"settings_from": args.settings_from.name} if settings is not None else {}),
        "runs": len(runs),
        # "today": the code this comparison ran with; a later rule change leaves the count as written
        "held_out_runs_watched_under_today_s_code": f"{sum(r['monitor_code'] == today for r in held_out)} of "
        f"{len(held_out)}",
        "rows": rows,
        "failing_runs": failing_runs(runs, args.held_out, rows),
        "failed_controls": failed_controls(runs, args.held_out),
    }
    with atomic_path(args.out) as tmp:
        tmp.write_text(json.dumps(results, indent=1))
    print(markdown(rows), runs_markdown(results["failing_runs"]), sep="\n\n")
    for r in results["failed_controls"]:
        print(f"Not a clean control: {r['failure']} {r['kind']} seed {r['seed']} failed at step {r['failed']}.")


if __name__ == "__main__":
    main()
