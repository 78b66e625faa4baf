"""A stated candidate for a monitor's alarm rule, judged on held-out saved runs by exact replay
(issue 16).

A rule change found on the runs it would fix cannot be judged on them. So a candidate is stated in
benchmarks/monitors-log.md before the runs of the seeds that judge it are read. This script replays
those seeds' saved runs (benchmarks/results/monitors/) under a baseline rule and under the
candidate, which differ in one knob (``KNOBS``): the sub-layer rule's minimum history
(``--min-history``), its three thresholds together (``--sublayer-scale``) or its fold and z
thresholds with the jump test kept (``--sublayer-fold-z-scale``), the least branch ratio at which it
alarms (``--sublayer-floor``), the attention-logit rule's growth factor (``--logit-growth``),
spectral alignment's growth threshold as a multiple of the shipped one
(``--alignment-growth-scale``), whether the R-Metric's loss term scores a fall in the loss
(``--r-rises-only``), how many layers must breach at once for the attention-entropy rule to alarm
(``--ae-corroborate``), or how far one layer must fall to alarm without a second
(``--ae-alone-fall``). It reports each control's alarm from that monitor and each failing run's
first rksp alarm, lead and lead bar under both.

Replay is exact because each rule reads only each check's logged values (``SublayerBurst``: the
branches' ratios; ``growth_alarm``: the layers' largest logits; ``RMetric``: its three components,
and the loss at the check, which every saved run keeps; ``UpdateConcentration``: the layers'
QK-update entropies; ``SignCollapse``: the layers' sign entropies and sigma_1). Every other
monitor's alarms are today's (``matched_detectors.monitor_alarms``), and every other setting of the
knob's own rule too: a file written before a later change shipped can differ when rerun (those
before seed 290 were replayed without today's sub-layer floor; only a branch under a tenth of its
shortcut is affected). Seconds on one core.

Judged so far: on 2026-11-27, after Pre-LN controls 86 and 88 alarmed at step 700, 16 checks of
history for seeds 90 on against the 10 then shipped (``--baseline 10 --min-history 16``); shipped
after 90-95 (``MIN_HISTORY`` 16); the former rule replayed on 96-101, 102-107 and 108-113, the
first seeds under the new one (``--baseline 16 --min-history 10``). Stated for 108-113, after
low-precision seed 105's late alarm: the attention-logit rule at growth 2.5 against the 3 then
shipped (``--baseline 3 --logit-growth 2.5``); shipped after 108-113 (``GROWTH`` 2.5), the former
rule replayed on 114-119 (``--logit-growth 3 --baseline 2.5``), where 2.5 drew a false alarm that 3
does not: 3 again from seeds 120 on. Stated for 162-167, after the R-Metric's false alarm on Pre-LN
control 161 as its loss fell: a loss term that scores rises only (``--r-rises-only yes``); on
162-167 it moved nothing. Shipped from seeds 168 on (the robust variant's default);
``--r-rises-only no`` replays the former rule. Stated for 174-179, after Pre-LN control 172's
one-layer dip: attention entropy corroborated by a second layer (``--ae-corroborate 2``); there it
removed Pre-LN 175's alarm and moved no failing run, but it is not shipped, since it silences the
monitor on a fault confined to one layer (benchmarks/monitors-heldout.md); replayed with
``--ae-corroborate 2`` (baseline 1, the rule then shipped, no lone exemption either way). Stated for
180-185: the same rule, except that a lone layer that fell 10% or more below its median alarms
anyway (``--ae-alone-fall 0.1 --baseline 0``, 0 being the rule then shipped: every lone alarm
stands); it cost no lead bar there and is shipped from seeds 186 on (``ALONE_FALL``);
``--ae-alone-fall 0`` replays the former rule. Stated for 210-213, after sub-layer bursts just short
of the line came 500-2300 steps before the first alarm on deep Post-LN 205, 208 and 209: the
sub-layer rule's fold, z and jump thresholds at 0.85 of those of seeds 60-217
(``--sublayer-scale 0.85``); it drew a false alarm there (a width-64 control whose branch jumped
1.77x) and is not shipped. Stated for 214-217: the fold and z thresholds alone at 0.85, the jump
test kept at 2x (``--sublayer-fold-z-scale 0.85``); it met the lead bar on two more runs there with no
control alarm and is shipped from seed 218 on (``FOLD``, ``Z``); ``--sublayer-fold-z-scale 1``
replays the former rule. Stated for 274 on, after a width-64 control's sub-layer alarm on 272 (an MLP
branch at 4% of its shortcut): no alarm from a branch under a tenth of its shortcut
(``--sublayer-floor 0.1``, against a baseline of 0, no floor); it cost no lead bar or race over 13
held-out deep failures and is shipped from seed 290 on (``FLOOR``): ``--sublayer-floor 0`` replays
the former rule. Stated for 482 on, after healthy Post-LN control 480's alarm (margin 1.23,
benchmarks/alignment_margin.py): spectral alignment's growth threshold at 1.25 times the shipped
(``--alignment-growth-scale 1.25``); on 482-489 it had no control alarm to remove and moved no first
alarm, but moved 483's own true alarm past its failure. Stated for 486 on, after Pre-LN control
485's lone fall of about 12%: attention entropy's lone block alarming only past a 15% fall
(``--ae-alone-fall 0.15``); on 486-489 it had nothing to judge.
Run: python benchmarks/candidate_replay.py --seeds 90-95 (--min-history N | --logit-growth X |
--r-rises-only yes|no | --ae-corroborate N | --ae-alone-fall X | --sublayer-scale X |
--sublayer-fold-z-scale X | --sublayer-floor X | --alignment-growth-scale X) [--baseline VALUE]
[--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alignment_margin import first_alarm as first_alignment_alarm
from machine import cpu_model
from matched_detectors import (
    RUNS,
    attention_entropy_alarm,
    attention_logits_alarm,
    bar_met,
    clean_control,
    first_of,
    lead,
    monitor_alarms,
    r_metric_alarm,
    saved_runs,
    seed_range,
    sublayer_ratio_alarm,
)

from rksp_cli.errors import InputError
from rksp_cli.files import atomic_path, check_writable
from rksp_cli.monitors.attention_entropy import ALONE_FALL
from rksp_cli.monitors.attention_logits import GROWTH
from rksp_cli.monitors.failures import WatchedRun
from rksp_cli.monitors.r_metric import RISES_ONLY
from rksp_cli.monitors.spectral_alignment import GROWTH_Z
from rksp_cli.monitors.sublayer_ratio import FLOOR, FOLD, MIN_HISTORY

RULES = ("baseline", "candidate")
SUBLAYER_60_217 = (3.0, 8.0, 2.0)  # the sub-layer rule's (fold, z, jump) from seeds 60 to 217


def _whole(what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"a rule needs a whole number of {what}, at least 1")
        return int(text)

    return parse


def _number(text: str) -> float:
    """The text's value, or NaN, which every range check below rejects."""
    try:
        return float(text)
    except ValueError:
        return float("nan")


def _growth(text: str) -> float:
    if not (value := _number(text)) > 1:
        raise ValueError("a growth factor is a number above 1")
    return value


def _fraction(text: str) -> float:
    if not 0 <= (value := _number(text)) <= 1:
        raise ValueError("a fall is a fraction of the median, from 0 to 1")
    return value


def _paired(run: WatchedRun, corroborate: int) -> int | None:
    """Attention entropy asking ``corroborate`` layers with no exemption for a deep lone fall: the
    candidate judged on 174-179; at 1 the rule shipped until seed 185."""
    return attention_entropy_alarm(run, corroborate, alone_fall=math.inf)


def _alone_or_paired(run: WatchedRun, alone_fall: float) -> int | None:
    """Attention entropy asking a second layer unless a lone layer fell ``alone_fall`` below its
    median: at 0 every lone alarm stands, which is the rule shipped until seed 185."""
    return attention_entropy_alarm(run, corroborate=2, alone_fall=alone_fall)


def _scale(text: str) -> float:
    if not 0 < (value := _number(text)) < math.inf:
        raise ValueError("a scale is a positive number")
    return value


def _scaled_sublayer(run: WatchedRun, scale: float) -> int | None:
    """The sub-layer rule with each of the fold, z and jump thresholds of seeds 60-217 times ``scale``."""
    return sublayer_ratio_alarm(run, thresholds=tuple(scale * t for t in SUBLAYER_60_217))


def _scaled_fold_z(run: WatchedRun, scale: float) -> int | None:
    """The sub-layer rule with the fold and z thresholds of seeds 60-217 times ``scale`` and their
    jump test of 2x kept: the test that alone kept 210-213's width-64 control quiet."""
    fold, z, jump = SUBLAYER_60_217
    return sublayer_ratio_alarm(run, thresholds=(scale * fold, scale * z, jump))


def _floor(text: str) -> float:
    if not 0 <= (value := _number(text)) < math.inf:
        raise ValueError("a floor is a ratio of branch to shortcut, 0 or more")
    return value


def _floored_sublayer(run: WatchedRun, floor: float) -> int | None:
    """The sub-layer rule as shipped, with a branch whose output is under ``floor`` times its
    shortcut's kept from alarming, however far it jumped (0: no floor, the rule until seed 289)."""
    return sublayer_ratio_alarm(run, floor=floor)


def _scaled_alignment(run: WatchedRun, scale: float) -> int | None:
    """Spectral alignment with its growth threshold times ``scale``, the collapse and freshness
    tests as shipped (1: the rule as shipped)."""
    alert = first_alignment_alarm(run, scale)
    return None if alert is None else alert.step


def _yes_no(text: str) -> bool:
    if text not in ("yes", "no"):
        raise ValueError("say yes or no")
    return text == "yes"


@dataclass(frozen=True)
class Knob:
    """One knob of one monitor's rule: its shipped value, how a saved run is rescored at another,
    how a value is read from the command line and named in the table, and the results file's tag.
    A smaller value is the looser rule for every knob here (False before True)."""

    key: str
    monitor: str
    shipped: float
    rescore: Callable[[WatchedRun, Any], int | None]
    parse: Callable[[str], float]
    label: Callable[[Any], str]
    tag: str


KNOBS = {
    "min_history": Knob(
        "min_history", "sublayer_ratio", MIN_HISTORY, sublayer_ratio_alarm, _whole("checks of history"),
        "{} checks".format, "",
    ),
    "logit_growth": Knob(
        "logit_growth", "attention_logits", GROWTH, attention_logits_alarm, _growth, "growth {:g}".format,
        "logit-growth-",
    ),
    "r_rises_only": Knob(
        "r_rises_only", "r_metric", RISES_ONLY["robust"], r_metric_alarm, _yes_no,
        lambda rises: "rises only" if rises else "|dL|", "r-rises-only-",
    ),
    "ae_corroborate": Knob(  # never shipped alone: its baseline is the rule its judgement replayed
        "ae_corroborate", "attention_entropy", 1, _paired, _whole("layers"), "{} layer(s)".format,
        "ae-corroborate-",
    ),
    "sublayer_scale": Knob(  # never shipped: its baseline is the rule of seeds 60-217
        "sublayer_scale", "sublayer_ratio", 1.0, _scaled_sublayer, _scale,
        "thresholds x{:g}".format, "sublayer-scale-",
    ),
    "sublayer_fold_z_scale": Knob(
        "sublayer_fold_z_scale", "sublayer_ratio", FOLD / SUBLAYER_60_217[0], _scaled_fold_z, _scale,
        "fold, z x{:g}".format, "sublayer-fold-z-scale-",
    ),
    "sublayer_floor": Knob(
        "sublayer_floor", "sublayer_ratio", FLOOR, _floored_sublayer, _floor, "floor {:g}".format,
        "sublayer-floor-",
    ),
    "ae_alone_fall": Knob(
        "ae_alone_fall", "attention_entropy", ALONE_FALL, _alone_or_paired, _fraction, "alone at {:.0%}".format,
        "ae-alone-fall-",
    ),
    "alignment_growth_scale": Knob(
        "alignment_growth_scale", "spectral_alignment", 1.0, _scaled_alignment, _scale, "growth z x{:g}".format,
        "alignment-growth-scale-",
    ),
}  # fmt: skip


def replay(run: WatchedRun, knob: Knob, candidate: float, baseline: float | None = None) -> dict[str, Any]:
    """One saved run with ``knob``'s monitor at the ``baseline`` value (the shipped one by default)
    and at the candidate's."""
    others = monitor_alarms(run)
    row: dict[str, Any] = {"failure": run.failure, "kind": run.kind, "seed": run.seed, "failed": run.failed_step}
    for rule, value in zip(RULES, (knob.shipped if baseline is None else baseline, candidate), strict=True):
        alarms = others | {knob.monitor: knob.rescore(run, value)} if knob.monitor in others else others
        first = first_of(alarms.values())
        ahead = lead(run.failed_step, first)
        row[rule] = {
            knob.monitor: alarms.get(knob.monitor), "rksp": first, "lead": ahead,
            "lead_bar_met": bar_met(ahead, run.failed_step),
        }  # fmt: skip
    return row


def summary(rows: list[dict[str, Any]], knob: Knob) -> dict[str, Any]:
    """Controls' alarms and failing runs' lead bars under both rules, and the failing runs whose
    first rksp alarm the candidate moves from the baseline's."""
    controls = [r for r in rows if clean_control(r)]
    failed = [r for r in rows if r["kind"] == "failing" and r["failed"] is not None]
    out: dict[str, Any] = {"controls": len(controls), "failed": len(failed)}
    for rule in RULES:
        out[rule] = {
            f"{knob.monitor}_control_alarms": sum(r[rule][knob.monitor] is not None for r in controls),
            "rksp_control_alarms": sum(r[rule]["rksp"] is not None for r in controls),
            "lead_bar_met": sum(r[rule]["lead_bar_met"] for r in failed),
        }
    out["failing_runs_moved"] = [
        {"failure": r["failure"], "seed": r["seed"]} | {rule: r[rule]["rksp"] for rule in RULES}
        for r in rows
        if r["kind"] == "failing" and r["baseline"]["rksp"] != r["candidate"]["rksp"]
    ]
    return out


def _step(step: int | None) -> str:
    return "-" if step is None else str(step)


def markdown(rows: list[dict[str, Any]], knob: Knob, baseline: float, candidate: float) -> str:
    """The runs that ``knob``'s monitor alarms on under the looser of the two rules: the only ones
    the other can change."""
    lines = [
        f"| run | failed at | `{knob.monitor}` alarm: {knob.label(baseline)} / {knob.label(candidate)} "
        "| rksp's first alarm | lead bar |",
        "|---|---|---|---|---|",
    ]
    looser = RULES[0] if baseline <= candidate else RULES[1]
    for r in rows:
        base, cand = r["baseline"], r["candidate"]
        if r[looser][knob.monitor] is None:
            continue
        bars = "/".join("met" if x["lead_bar_met"] else "-" for x in (base, cand)) if r["failed"] else "-"
        lines.append(
            f"| {r['failure']} {r['kind']} {r['seed']} | {_step(r['failed'])} "
            f"| {_step(base[knob.monitor])} / {_step(cand[knob.monitor])} "
            f"| {_step(base['rksp'])} / {_step(cand['rksp'])} | {bars} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.splitlines()[:2]))
    parser.add_argument("--seeds", type=seed_range, required=True, help="the seeds judged (a range a-b)")
    rule = parser.add_mutually_exclusive_group(required=True)
    rule.add_argument("--min-history", help=f"the candidate sub-layer rule's checks before a score ({MIN_HISTORY})")
    rule.add_argument("--logit-growth", help=f"the candidate attention-logit rule's growth factor ({GROWTH:g})")
    rule.add_argument("--r-rises-only", help="yes: the candidate R-Metric scores only a rise in the loss (no)")
    rule.add_argument(
        "--ae-corroborate", help="layers that must breach at once for attention entropy to alarm, none alone (1)"
    )
    rule.add_argument(
        "--ae-alone-fall",
        help=f"fall below its median at which one layer's attention-entropy alarm needs no second ({ALONE_FALL:g})",
    )
    rule.add_argument(
        "--sublayer-scale",
        help=f"the sub-layer rule's thresholds as a multiple of seeds 60-217's ({KNOBS['sublayer_scale'].shipped:g})",
    )
    rule.add_argument(
        "--sublayer-fold-z-scale",
        help=f"the sub-layer rule's fold and z as a multiple of 60-217's, jump kept "
        f"({KNOBS['sublayer_fold_z_scale'].shipped:g})",
    )
    rule.add_argument(
        "--sublayer-floor", help="the least branch/shortcut ratio at which the sub-layer rule alarms (0: none)"
    )
    rule.add_argument(
        "--alignment-growth-scale",
        help=f"spectral alignment's growth threshold as a multiple of the shipped {GROWTH_Z:g} (1)",
    )
    parser.add_argument("--baseline", help="the baseline's value of the same knob (default: the shipped one)")
    parser.add_argument("--runs", type=Path, default=RUNS, help="folder of the saved runs")
    parser.add_argument("--out", type=Path, help="results JSON (default: results/monitors-candidate[-KNOB]-SEEDS.json)")
    args = parser.parse_args()
    knob = next(knob for key, knob in KNOBS.items() if getattr(args, key) is not None)
    values = {"--" + knob.key.replace("_", "-"): getattr(args, knob.key), "--baseline": args.baseline}
    for flag, text in values.items():
        try:
            values[flag] = knob.shipped if text is None else knob.parse(text)
        except ValueError as exc:
            parser.error(f"{flag} {text}: {exc}")
    candidate, baseline = values.values()
    out = args.out or RUNS.parent / f"monitors-candidate-{knob.tag}{min(args.seeds)}-{max(args.seeds)}.json"
    try:
        check_writable(out, "--out")
    except InputError as exc:
        parser.error(str(exc))
    paths = saved_runs(args.seeds, args.runs)
    if not paths:
        parser.error(f"no saved runs of seeds {min(args.seeds)}-{max(args.seeds)} under {args.runs}")
    runs = [WatchedRun.from_dict(json.loads(p.read_text())) for p in paths]
    rows = [replay(run, knob, candidate, baseline) for run in runs]
    results = {
        "machine": cpu_model(),
        "seeds": sorted(args.seeds),
        knob.key: {"baseline": baseline, "candidate": candidate},
        "runs_by_monitor_code": dict(Counter(r.monitor_code for r in runs)),
        "summary": summary(rows, knob),
        "rows": rows,
    }
    with atomic_path(out) as tmp:
        tmp.write_text(json.dumps(results, indent=1))
    print(markdown(rows, knob, baseline, candidate))
    print(json.dumps(results["summary"], indent=1))


if __name__ == "__main__":
    main()
