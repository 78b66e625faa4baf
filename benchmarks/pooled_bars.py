"""Issue 16's lead and earliness bars pooled over the held-out seed sets, with 95% Wilson intervals,
summed by a program from the committed comparisons (``matched_detectors.py``'s results) rather than
by hand.

Per set, rksp's row for one failure (deep Post-LN by default): its failures, those whose lead met
the bar (>= 100 steps and >= 10% of the run), those on which rksp's first alarm came before every
tuned spike detector's, and its false alarms on the held-out controls. Each set was judged by the
monitors of its day, rescored to the rules of the day its comparison ran where their logged inputs
allow, and is not rescored again when a rule changes later; from ``SUBLAYER_FROM`` on, every monitor
shipped today watched the runs. Comparisons before 78-83 did not count the lead bar; for a set
whose runs were all watched under the code its comparison ran with, it is counted from their
head-to-head runs, the others have no count here ("-"), and the pooled lead is over the sets that
have one, and says so.
Sets are those held out when they ran; comparisons that pooled seeds used in choosing a rule
(``monitors-matched-30-59.json``, ``monitors-matched-postln.json``) are left out. A set that did not
run the failure asked for (48-53 and 54-59 reran only deep Post-LN) is left out of its table.
With ``--races``, where rksp was not first: by how many steps a tuned detector beat it, over the
sets with a run-by-run record (84-89 on). A margin under one check interval (``DEFAULT_EVERY``) is
a race a monitor checking every step might have won; a larger one is not about the interval.
With ``--watchers``, every watcher side by side, each tuned spike detector at the setting tuned on
seeds 0-5 and rksp as shipped: the failures each alarmed before, the lead bar (over the sets that
counted it for every watcher, 78-83 on) and its false alarms on the held-out controls. Earliness
alone flatters a rule that fires often; this is the other half of its operating point.
With ``--totals``, the pooled rows alone (the README's tables; ``benchmarks/monitors-heldout.md``
keeps them set by set, so that the README does not grow by a row a table with every set).
Run: python benchmarks/pooled_bars.py [--failure NAME] [--races | --watchers] [--totals] [--with
RESULTS] [RESULTS ...] (prints Markdown).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from matched_detectors import RKSP, bar_met, first_of, lead
from scipy.stats import binomtest

from rksp_cli.monitors.failures import DEFAULT_EVERY
from rksp_cli.monitors.spike_detectors import DETECTORS

RESULTS = Path(__file__).parent / "results"
# The held-out sets in the order they ran (all rerun deep Post-LN): the comparison, and for a set watched
# under its comparison's monitor code whose comparison predates the lead-bar count, its head-to-head runs
SETS = [
    ("monitors-matched.json", None),  # 42-47
    ("monitors-matched-48-53.json", None),
    ("monitors-matched-54-59.json", None),
    ("monitors-matched-60-65.json", None),
    ("monitors-matched-66-71.json", "monitors-postln-66-71.json"),
    ("monitors-matched-72-77.json", "monitors-postln-72-77.json"),
    ("monitors-matched-78-83.json", None),
    ("monitors-matched-84-89.json", None),
    ("monitors-matched-90-95.json", None),
    ("monitors-matched-96-101.json", None),  # the first set under the 16-check sub-layer rule
    ("monitors-matched-102-107.json", None),
    ("monitors-matched-108-113.json", None),
    ("monitors-matched-114-119.json", None),  # the one set under attention_logits at growth 2.5
    ("monitors-matched-120-125.json", None),  # growth 3 again; failed controls counted apart
    ("monitors-matched-126-131.json", None),  # attention_entropy by Gram matrices; restores told
    ("monitors-matched-132-137.json", None),  # spectral_entropy shared, the same values; Intel Xeon
    ("monitors-matched-138-143.json", None),
    ("monitors-matched-144-149.json", None),
    ("monitors-matched-150-155.json", None),
    ("monitors-matched-156-161.json", None),
    ("monitors-matched-162-167.json", None),
    ("monitors-matched-168-173.json", None),
    ("monitors-matched-174-179.json", None),
    ("monitors-matched-180-185.json", None),
    ("monitors-matched-186-189.json", None),  # four seeds, cut by the clock; the lone-fall attention_entropy rule
    ("monitors-matched-190-193.json", None),  # four seeds, cut by the clock
    ("monitors-matched-194-197.json", None),  # four seeds
    ("monitors-matched-198-201.json", None),  # four seeds
    ("monitors-matched-202-205.json", None),  # four seeds
    ("monitors-matched-206-209.json", None),  # four seeds
    ("monitors-matched-210-213.json", None),  # four seeds
    ("monitors-matched-214-217.json", None),  # four seeds
    ("monitors-matched-218-221.json", None),  # four seeds
    ("monitors-matched-222-225.json", None),  # four seeds
    ("monitors-matched-226-227.json", None),  # two seeds: the end of a session
    ("monitors-matched-228-231.json", None),  # four seeds, on an AMD EPYC
    ("monitors-matched-232-233.json", None),  # two seeds: the end of a session
    ("monitors-matched-234-237.json", None),  # four seeds, on an AMD EPYC
    ("monitors-matched-238-239.json", None),  # two seeds: the end of a session
    ("monitors-matched-240-243.json", None),  # four seeds, on an AMD EPYC
    ("monitors-matched-244-245.json", None),  # two seeds: the end of a session
    ("monitors-matched-246-249.json", None),  # four seeds, on an AMD EPYC
    ("monitors-matched-250-251.json", None),  # two seeds: the end of a session
    ("monitors-matched-252-255.json", None),  # four seeds, on an AMD EPYC
    ("monitors-matched-256-259.json", None),  # four seeds, on an AMD EPYC
    ("monitors-matched-260-263.json", None),  # four seeds, on an AMD EPYC
    ("monitors-matched-264-267.json", None),  # four seeds, on an AMD EPYC
    ("monitors-matched-268-271.json", None),  # four seeds, on an AMD EPYC
    ("monitors-matched-272-273.json", None),  # two seeds, on an AMD EPYC; trained twice, the same
    ("monitors-matched-274-275.json", None),  # two seeds, on an AMD EPYC
    ("monitors-matched-276-279.json", None),  # four seeds, on an AMD EPYC
    ("monitors-matched-280-283.json", None),  # four seeds, on an AMD EPYC
    ("monitors-matched-284-285.json", None),  # two seeds, on an AMD EPYC with AVX2
    ("monitors-matched-286-289.json", None),  # four seeds, on an Intel Xeon with AVX-512
    ("monitors-matched-290-291.json", None),  # two seeds, on an Intel Xeon; the first under the floor
    ("monitors-matched-292-295.json", None),  # four seeds, on an Intel Xeon with AVX-512
    ("monitors-matched-296-299.json", None),  # four seeds, on an Intel Xeon with AVX-512
    ("monitors-matched-300-301.json", None),  # two seeds, on an AMD EPYC with AVX-512
    ("monitors-matched-302-305.json", None),  # four seeds, on an AMD EPYC with AVX-512
    ("monitors-matched-306-309.json", None),  # four seeds, on the same EPYC
    ("monitors-matched-310-313.json", None),  # four seeds, on the same EPYC
    ("monitors-matched-314-317.json", None),  # four seeds, on the same EPYC
    ("monitors-matched-318-321.json", None),  # four seeds, on the same EPYC
    ("monitors-matched-322-325.json", None),  # four seeds, on the same EPYC
    ("monitors-matched-326-329.json", None),  # four seeds, on the same EPYC
    ("monitors-matched-330-333.json", None),  # four seeds, on the same EPYC
    ("monitors-matched-334-337.json", None),  # four seeds, on the same EPYC
    ("monitors-matched-338-341.json", None),  # four seeds, on the same EPYC
    ("monitors-matched-342-345.json", None),  # four seeds, on the same EPYC
    ("monitors-matched-346-349.json", None),  # four seeds, on the same EPYC
    ("monitors-matched-350-353.json", None),  # four seeds, on the same EPYC
    ("monitors-matched-354-357.json", None),  # four seeds, on the same EPYC
    ("monitors-matched-358-359.json", None),  # two seeds, on the same EPYC
    ("monitors-matched-360-363.json", None),  # four seeds, on the same EPYC
    ("monitors-matched-364-367.json", None),  # four seeds, on the same EPYC
    ("monitors-matched-368-371.json", None),  # four seeds, on the same EPYC
    ("monitors-matched-372-375.json", None),  # four seeds, on the same EPYC
    ("monitors-matched-376-379.json", None),  # four seeds, on the same EPYC
    ("monitors-matched-380-383.json", None),  # four seeds, on an Intel Xeon with AVX-512
    ("monitors-matched-384-385.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-386-387.json", None),  # two seeds, on a 2-core Xeon with AVX-512 again
    ("monitors-matched-388-389.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-390-391.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-392-393.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-394-395.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-396-397.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-398-399.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-400-401.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-402-403.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-404-405.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-406-407.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-408-409.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-410-411.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-412-413.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-414-415.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-416-417.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-418-419.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-420-421.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-422-423.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-424-425.json", None),  # two seeds, on a 2-core AMD EPYC
    ("monitors-matched-426-427.json", None),  # two seeds, on the same EPYC
    ("monitors-matched-428-429.json", None),  # two seeds, on the same EPYC
    ("monitors-matched-430-431.json", None),  # two seeds, on a 2-core AMD EPYC (a later session)
    ("monitors-matched-432-433.json", None),  # two seeds, on the same EPYC
    ("monitors-matched-434-435.json", None),  # two seeds, on an EPYC of the same model
    ("monitors-matched-436-437.json", None),  # two seeds, on the same EPYC
    ("monitors-matched-438-439.json", None),  # two seeds, on the same EPYC
    ("monitors-matched-440-441.json", None),  # two seeds, on the same EPYC
    ("monitors-matched-442-443.json", None),  # two seeds, on the same EPYC
    ("monitors-matched-444-445.json", None),  # two seeds, on the same EPYC
    ("monitors-matched-446-447.json", None),  # two seeds, on the same EPYC
    ("monitors-matched-448-449.json", None),  # two seeds, on the same EPYC
    ("monitors-matched-450-451.json", None),  # two seeds, on the same EPYC
    ("monitors-matched-452-453.json", None),  # two seeds, on the same EPYC
    ("monitors-matched-454-455.json", None),  # two seeds, on the same EPYC
    ("monitors-matched-456-457.json", None),  # two seeds, on the same EPYC
    ("monitors-matched-458-459.json", None),  # two seeds, on a 2-core Intel Xeon
    ("monitors-matched-460-461.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-462-463.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-464-465.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-466-467.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-468-469.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-470-471.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-472-473.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-474-475.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-476-477.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-478-479.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-480-481.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-482-483.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-484-485.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-486-487.json", None),  # two seeds, on the same Xeon
    ("monitors-matched-488-489.json", None),  # two seeds, on the same Xeon
]
SUBLAYER_FROM = 60  # the first seed watched by all of today's monitors (sublayer_ratio, the newest)
DETECTOR_NAMES = {cls.name for cls in DETECTORS}


def wilson(hits: int, n: int) -> tuple[float, float]:
    """The 95% Wilson interval of a proportion: sound at the small counts and the 0 or n of these sets."""
    interval = binomtest(hits, n).proportion_ci(confidence_level=0.95, method="wilson")
    return interval.low, interval.high


def lead_bar_from_runs(head_to_head: dict[str, Any], failure: str) -> tuple[int, int]:
    """Failures, and those whose lead met the bar, from ``benchmarks/monitors.py``'s per-run record:
    rksp's first alarm is the earliest of its monitors' logged alarms, which are the comparison's
    rules when the runs were watched under the code it ran with."""
    failed = met = 0
    for run in head_to_head["runs"]:
        if run["failure"] != failure or run["kind"] != "failing" or run["failed_step"] is None:
            continue
        first = first_of(step for name, step in run["first_alarms"].items() if name not in DETECTOR_NAMES)
        ahead = lead(run["failed_step"], first)
        failed, met = failed + 1, met + bar_met(ahead, run["failed_step"])
    return failed, met


def set_row(results: dict[str, Any], failure: str, head_to_head: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """One comparison's rksp row for ``failure``, with the seeds it held out, or None where the
    comparison did not run that failure; its lead-bar count from ``head_to_head``
    (``lead_bar_from_runs``) where the comparison has none, every held-out run was watched under the
    code the comparison ran with, and the head-to-head holds that failure's runs."""
    seeds = results["held_out_seeds"]
    rows = [r for r in results["rows"] if r["failure"] == failure and r["watcher"] == RKSP]
    if not rows:
        return None
    row = rows[0]
    met = row.get("lead_bar_met")
    watched, _, held_out = results["held_out_runs_watched_under_today_s_code"].partition(" of ")
    if met is None and head_to_head is not None and watched == held_out:
        failed, counted = lead_bar_from_runs(head_to_head, failure)
        if failed:  # the head-to-head holds this failure's runs
            if failed != row["failed"]:
                raise ValueError(
                    f"the head-to-head runs of seeds {min(seeds)}-{max(seeds)} have {failed} failures, "
                    f"their comparison {row['failed']}"
                )
            met = counted
    return {
        "seeds": f"{min(seeds)}-{max(seeds)}", "first_seed": min(seeds), "failed": row["failed"],
        "lead_bar_met": met, "earliest": row["earlier_than_every_matched_detector"],
        "false_alarms": row["false_alarms"], "controls": row["controls"],
    }  # fmt: skip


def _spans(sets: list[dict[str, Any]]) -> list[str]:
    """The sets that counted the lead bar, each unbroken run of three or more named by its ends (the
    pooled row stays readable as sets accrue)."""
    runs: list[list[str]] = [[]]
    for s in sets:
        if s["lead_bar_met"] is None:
            runs.append([])
        else:
            runs[-1].append(s["seeds"])
    return [", ".join(run) if len(run) < 3 else f"{run[0]} to {run[-1]} ({len(run)} sets)" for run in runs if run]


def pool(sets: list[dict[str, Any]], label: str) -> dict[str, Any]:
    """Counts summed over ``sets`` (in the order they ran); the lead bar over those that counted it."""
    counted = [s for s in sets if s["lead_bar_met"] is not None]
    return {
        "seeds": label, "failed": sum(s["failed"] for s in sets),
        "lead_bar_met": sum(s["lead_bar_met"] for s in counted), "lead_failed": sum(s["failed"] for s in counted),
        "lead_sets": _spans(sets), "earliest": sum(s["earliest"] for s in sets),
        "false_alarms": sum(s["false_alarms"] for s in sets), "controls": sum(s["controls"] for s in sets),
    }  # fmt: skip


def _share(hits: int, n: int) -> str:
    if not n:
        return "-"
    low, high = wilson(hits, n)
    return f"{hits}/{n} ({low:.0%}-{high:.0%})"


def markdown(sets: list[dict[str, Any]], pooled: list[dict[str, Any]], per_set: bool = True) -> str:
    """The table: a row per set (unless ``per_set`` is false), then the pooled rows."""
    lines = [
        "| held-out seeds | failures | lead bar met | before every tuned detector | false alarms, controls |",
        "|---|---|---|---|---|",
    ]
    for s in sets if per_set else []:
        lead = "-" if s["lead_bar_met"] is None else f"{s['lead_bar_met']}/{s['failed']}"
        lines.append(
            f"| {s['seeds']} | {s['failed']} | {lead} | {s['earliest']}/{s['failed']} "
            f"| {s['false_alarms']}/{s['controls']} |"
        )
    for p in pooled:
        over = "" if p["lead_failed"] == p["failed"] else f" over {', '.join(p['lead_sets']) or 'no set'}"
        lines.append(
            f"| **{p['seeds']}** (95% Wilson) | {p['failed']} | {_share(p['lead_bar_met'], p['lead_failed'])}{over} "
            f"| {_share(p['earliest'], p['failed'])} | {_share(p['false_alarms'], p['controls'])} |"
        )
    return "\n".join(lines)


def set_rows(sets: list[tuple[Path, Path | None]], failure: str) -> list[dict[str, Any]]:
    """Each comparison's row for ``failure`` (with its head-to-head runs where given), in seed order;
    comparisons that did not run it left out."""
    found = (set_row(json.loads(m.read_text()), failure, json.loads(h.read_text()) if h else None) for m, h in sets)
    rows = sorted((s for s in found if s is not None), key=lambda s: s["first_seed"])
    if not rows:
        raise ValueError(f"no comparison has an rksp row for {failure}")
    return rows


def tables(sets: list[tuple[Path, Path | None]], failure: str, per_set: bool = True) -> str:
    """The Markdown the script prints for these comparisons, each with its head-to-head runs or None
    (the held-out record's table; without ``per_set``, the README's)."""
    rows = set_rows(sets, failure)
    newest = [s for s in rows if s["first_seed"] >= SUBLAYER_FROM]
    pooled = [pool(rows, "all sets"), *([pool(newest, f"{SUBLAYER_FROM} on, with sublayer_ratio")] if newest else [])]
    return markdown(rows, pooled, per_set)


RACES = ("rksp first", f"a detector first by < {DEFAULT_EVERY} steps", f"by {DEFAULT_EVERY} or more", "no rksp alarm")


def earliest_detectors(run: dict[str, Any]) -> tuple[int, set[str]]:
    """The earliest matched detector alarm before the failure of one run of
    ``matched_detectors.failing_runs``, and every detector that raised it (a tie names several)."""
    fired = {name: step for name, step in run["matched_detectors"].items() if lead(run["failed"], step) is not None}
    first = min(fired.values())
    return first, {name for name, step in fired.items() if step == first}


def race(run: dict[str, Any]) -> str:
    """Which of ``RACES`` one failing run of ``matched_detectors.failing_runs`` falls in: rksp first,
    or beaten (or tied) by the earliest matched detector's alarm before the failure, by how much, or
    rksp with no alarm before the failure."""
    if run["earlier_than_every_matched_detector"]:
        return RACES[0]
    if lead(run["failed"], run["rksp"]) is None:
        return RACES[3]
    first, _ = earliest_detectors(run)
    return RACES[1] if run["rksp"] - first < DEFAULT_EVERY else RACES[2]


def races(sets: list[tuple[Path, Path | None]], failure: str, per_set: bool = True) -> str:
    """Per set with a run-by-run record (unless ``per_set`` is false), its failures of ``failure`` by
    ``RACES``, and their sums."""
    rows = []
    for path, _ in sets:
        results = json.loads(path.read_text())
        runs = [r for r in results.get("failing_runs", []) if r["failure"] == failure and r["failed"] is not None]
        if runs:
            seeds = results["held_out_seeds"]
            tally = Counter(map(race, runs))
            rows.append((min(seeds), f"{min(seeds)}-{max(seeds)}", [tally[k] for k in RACES]))
    if not rows:
        raise ValueError(f"no comparison has a run-by-run record of {failure}")
    rows.sort()
    total = [sum(counts[i] for *_, counts in rows) for i in range(len(RACES))]
    lines = ["| held-out seeds | failures | " + " | ".join(RACES) + " |", "|---|---|" + "---|" * len(RACES)]
    for _, seeds, counts in rows if per_set else []:
        lines.append(f"| {seeds} | {sum(counts)} | " + " | ".join(map(str, counts)) + " |")
    lines.append(f"| **all** | {sum(total)} | " + " | ".join(map(str, total)) + " |")
    return "\n".join(lines)


WATCHERS = (*(cls.name for cls in DETECTORS), RKSP)  # the table's rows, rksp as shipped last


def watcher_sums(sets: list[tuple[Path, Path | None]]) -> dict[tuple[str, str], Counter[str]]:
    """Per failure and watcher (``WATCHERS``), summed over the comparisons: ``failed``, ``alarmed``
    (before the failure), ``met`` of ``counted`` (the lead bar, where the comparison counted it),
    and ``false`` of ``controls`` (false alarms on the held-out controls). A comparison records one
    row per failure and watcher, so a set that did not run a failure adds nothing to it."""
    sums: dict[tuple[str, str], Counter[str]] = {}
    for path, _ in sets:
        for row in json.loads(path.read_text())["rows"]:
            if row["watcher"] not in WATCHERS:
                continue  # rksp with a monitor left out: the per-set tables have it
            total = sums.setdefault((row["failure"], row["watcher"]), Counter())
            total.update(
                failed=row["failed"], alarmed=row["alarmed"], false=row["false_alarms"], controls=row["controls"]
            )
            if row.get("lead_bar_met") is not None:
                total.update(met=row["lead_bar_met"], counted=row["failed"])
    if not sums:
        raise ValueError("no comparison has a row for any of the watchers")
    return sums


def watchers(sets: list[tuple[Path, Path | None]]) -> str:
    """``watcher_sums`` as a table, a row per failure and watcher, rksp last in each failure."""
    sums = watcher_sums(sets)
    lines = [
        "| failure | watcher | failures alarmed before | lead bar met, sets counting it "
        "| false alarms, held-out controls |",
        "|---|---|---|---|---|",
    ]
    for failure in dict.fromkeys(f for f, _ in sorted(sums)):
        for watcher in WATCHERS:
            if (t := sums.get((failure, watcher))) is not None:
                lines.append(
                    f"| {failure} | {watcher} | {_share(t['alarmed'], t['failed'])} "
                    f"| {_share(t['met'], t['counted'])} | {_share(t['false'], t['controls'])} |"
                )
    return "\n".join(lines)


def default_sets() -> list[tuple[Path, Path | None]]:
    return [(RESULTS / m, RESULTS / h if h else None) for m, h in SETS]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="*", type=Path, help="matched_detectors.py results (default: SETS)")
    parser.add_argument("--with", dest="extra", type=Path, action="append", default=[], help="a set added to SETS")
    parser.add_argument("--failure", default="post_ln_without_warmup", help="which failure's rows to pool")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--races", action="store_true", help="where rksp was not first, by how much")
    which.add_argument("--watchers", action="store_true", help="every watcher's alarms and false alarms, pooled")
    parser.add_argument("--totals", action="store_true", help="the pooled rows only, not a row per set")
    args = parser.parse_args()
    if args.watchers and (args.totals or args.failure != parser.get_default("failure")):
        parser.error("--watchers tables every failure, pooled: --failure and --totals do not apply")
    sets = [(p, None) for p in args.results] or default_sets()
    for extra in args.extra:
        if extra.resolve() not in {m.resolve() for m, _ in sets}:  # a set named twice counts once
            sets.append((extra, None))
    try:
        if args.watchers:
            print(watchers(sets))
        else:
            print((races if args.races else tables)(sets, args.failure, per_set=not args.totals))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        parser.error(f"not a set of matched_detectors.py results: {exc}")


if __name__ == "__main__":
    main()
