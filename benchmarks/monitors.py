"""Monitors against natural, slow failures, head to head with the spike detectors (issue 16).

For every failure in ``rksp_cli.monitors.failures.FAILURES``: failing runs and controls (same
model, same length, the one change that keeps it healthy), each watched by every rksp monitor at
the default interval and replayed through Lightning's, OLMo-core's, llm-foundry's and
Megatron-LM's detectors. Per failure and watcher: failing runs that failed, how many the watcher
alarmed on before the failure, its median lead (steps and share of the run), its false alarms on
the controls and its overhead per check at the default interval.

Then the actions (``rksp_cli.monitors.guard``): the same failing runs and controls with each
policy acting on the alarms. Per failure and policy: failing runs saved (failed unguarded, not
guarded; paired by seed), and the change of the controls' final loss against the unguarded
controls, beside the controls' own seed-to-seed spread.

Each run is saved as JSON under benchmarks/results/monitors/ as it finishes, so a rerun resumes;
a run saved under other monitor code (``monitor_code``: an alarm rule changed) is run again.
Writes benchmarks/results/monitors.json and prints Markdown.
Run: python benchmarks/monitors.py [--failures a,b] [--seeds 6] [--first-seed 0] [--workers 2]
[--threads N] [--policies skip,backoff,rollback,rollback-once] [--kinds failing,control,...]
[--seed-list 133,135] [--device cuda] [--progress] [--runs DIR] [--saved-only | --guarded-only
[--only-if failed|rolled-back-twice]]
(``--failures post_ln_without_warmup_wide``, ``failures.GPU_FAILURES``, is sized for a GPU and
not in the default list; ``--saved-only`` tables runs saved under ``--runs``, trained here or on
another machine, without training any). With every failure
and policy this is about 6.5 hours on 2 cores, two runs at a time (35 minutes for the two width-64
failures, about 6 hours for deep Post-LN's 72 runs of up to 5000 steps); ``--policies ''`` watches
without acting, about 2 hours. The alarm rules were chosen on seeds 0-53, all but the last two on 0-35;
``sublayer_ratio``'s on four failing runs of seeds 46-59 (its jump test on a fault-harness false
alarm, with seeds 60-65 in view); every failure of seeds 66-95 ran under one code, whose
sub-layer rule scored from 10 checks of history, today's from 16 (seeds 96 on; which seeds saw
which rule, and every held-out check: benchmarks/monitors-log.md). ``make
bench-monitors`` runs ``--first-seed 42 --policies ''``, every failure under today's code
(benchmarks/results/monitors.json, the README's table), then the three policies on its width-64
runs. ``rollback-once`` is rollback that acts on the first alarm only (``Guard(max_actions=1)``;
later alarms are recorded as ``ignored``): run on the failing runs that rolled back twice, it
tells whether the second rollback was needed (``--guarded-only --only-if rolled-back-twice`` picks
those runs from the saved twins, as ``--only-if failed`` picks the failing runs that failed). The
spike detectors at matched false alarms (tuned on these runs' controls):
``benchmarks/matched_detectors.py``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import multiprocessing
import os
import statistics
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from machine import cpu_model

from rksp_cli.errors import InputError
from rksp_cli.files import atomic_path
from rksp_cli.models import BuildOptions
from rksp_cli.monitors.failures import (
    BASE,
    DEFAULT_EVERY,
    FAILURES,
    GPU_FAILURES,
    WatchedRun,
    by_kind,
    head_to_head,
    monitor_code,
    watch_run,
)
from rksp_cli.monitors.guard import POLICIES

HERE = Path(__file__).parent / "results"
RUNS = HERE / "monitors"
RESULTS = HERE / "monitors.json"


Job = tuple[str, str, int, str | None]  # failure, kind, seed, policy
KNOWN = {**FAILURES, **GPU_FAILURES}
# benchmark-only policies: a guard policy with a cap on the alarms it acts on (``Guard.max_actions``)
CAPPED = {"rollback-once": ("rollback", 1)}
# --only-if: which runs of a held-out set get a guarded twin, read from the runs saved before it
ONLY_IF = {
    "failed": "its saved unguarded run failed within its horizon",
    "rolled-back-twice": "it failed and its saved `rollback` twin rolled back more than once",
}


@dataclass(frozen=True)
class Runner:
    """Where and how the runs train, and where each is saved as it finishes."""

    runs: Path = RUNS
    workers: int = 2
    threads: int = 1
    device: str = "cpu"
    progress: bool = False  # each run logs its step, loss and time a step (the probe's logger)

    def path(self, job: Job) -> Path:
        name, kind, seed, policy = job
        return self.runs / f"{name}-{kind}-{seed}{f'-{policy}' if policy else ''}.json"

    def read(self, job: Job) -> WatchedRun:
        return WatchedRun.from_dict(json.loads(self.path(job).read_text()))

    def resumable(self, job: Job, code: str) -> WatchedRun | None:
        """The saved run, unless there is none or it was watched under other monitor code."""
        run = self.read(job) if self.path(job).is_file() else None
        return run if run is not None and run.monitor_code == code else None

    def one(self, job: Job) -> Path:
        name, kind, seed, policy = job
        torch.set_num_threads(self.threads)
        if self.progress:  # named by run: the workers share one terminal
            logging.basicConfig(format=f"  {self.path(job).stem}: %(message)s", level=logging.INFO, force=True)
        guard, cap = CAPPED.get(policy or "", (policy, None))
        run = watch_run(KNOWN[name], kind, seed, DEFAULT_EVERY, guard, self.device, max_actions=cap)
        run = replace(run, policy=policy)  # the label, so that capped and uncapped runs table apart
        run.notes.append(f"{self.threads} torch thread(s)")
        with atomic_path(self.path(job)) as tmp:
            tmp.write_text(json.dumps(run.as_dict()))
        return self.path(job)

    def run_all(self, jobs: list[Job]) -> list[WatchedRun]:
        self.runs.mkdir(parents=True, exist_ok=True)
        code = monitor_code()
        saved = {job: self.resumable(job, code) for job in jobs}
        todo = [job for job, run in saved.items() if run is None]
        print(f"{len(jobs) - len(todo)} of {len(jobs)} runs already done; {len(todo)} to go", flush=True)
        # CUDA cannot be used in a forked child once the parent has touched it (the device check did)
        context = multiprocessing.get_context("fork" if self.device == "cpu" else "spawn")
        with ProcessPoolExecutor(max_workers=self.workers, mp_context=context) as pool:
            for done, path in enumerate(pool.map(self.one, todo), 1):
                print(f"[{done}/{len(todo)}] {path.name}", flush=True)
        return [saved[job] or self.read(job) for job in jobs]


def asked_for(runner: Runner, plain: WatchedRun, condition: str) -> bool:
    """Whether the saved unguarded run ``plain`` meets ``condition`` of ``ONLY_IF``: a held-out set
    twins only its failing runs that failed, and caps only those whose rollback twin acted at more
    than one alarm (did the later rollbacks matter?). A missing rollback twin is an error, not a no."""
    failed = plain.failed_step is not None
    if condition == "failed" or not failed:
        return failed
    twin = (plain.failure, plain.kind, plain.seed, "rollback")
    if not runner.path(twin).is_file():
        raise SystemExit(f"--only-if {condition}: no saved rollback twin {runner.path(twin).name}: run it first")
    return len(acted_steps(runner.read(twin))) > 1


def _unguarded(watched: list[WatchedRun]) -> dict[tuple[str, str, int], WatchedRun]:
    """The unguarded runs by (failure, kind, seed): where each guarded run finds its twin."""
    return {(r.failure, r.kind, r.seed): r for r in watched}


def actions(watched: list[WatchedRun], guarded: list[WatchedRun]) -> list[dict[str, Any]]:
    """Per failure and policy: failing runs saved (failed unguarded, did not *end* failed guarded),
    and what the policy did to the controls' final loss."""
    plain = _unguarded(watched)
    rows = []
    for failure, policy in dict.fromkeys((r.failure, r.policy) for r in guarded):
        runs = [r for r in guarded if r.failure == failure and r.policy == policy]
        failing = [(plain[(r.failure, r.kind, r.seed)], r) for r in runs if r.kind == "failing"]
        controls = [(plain[(r.failure, r.kind, r.seed)], r) for r in runs if r.kind != "failing"]
        shifts = [g.final_loss - p.final_loss for p, g in controls]
        rows.append({
            "failure": failure, "policy": policy,
            "failed_unguarded": sum(p.failed_step is not None for p, _ in failing),
            "saved": sum(p.failed_step is not None and not g.ended_failed for p, g in failing),
            "failed_guarded": sum(g.ended_failed for _, g in failing),
            "failing_final_loss": statistics.median(g.final_loss for _, g in failing) if failing else None,
            "control_final_loss": statistics.median(p.final_loss for p, _ in controls) if controls else None,
            "controls": len(controls), "controls_acted_on": sum(bool(acted_steps(g)) for _, g in controls),
            "control_final_loss_shift_max": max(shifts, key=abs) if shifts else None,
            # the seed-to-seed spread within each kind of control (Pre-LN and Post-LN end apart)
            "control_final_loss_sd": {
                kind: statistics.stdev(losses)
                for kind in dict.fromkeys(p.kind for p, _ in controls)
                if len(losses := [p.final_loss for p, _ in controls if p.kind == kind]) > 1
            },
        })  # fmt: skip
    return rows


def acted_steps(run: WatchedRun) -> list[int]:
    """The steps at which a guarded run's guard acted (a rollback and its back-off are one step)."""
    return sorted({a["step"] for a in run.actions if a["action"] != "ignored"})


def guarded_runs(watched: list[WatchedRun], guarded: list[WatchedRun]) -> list[dict[str, Any]]:
    """Run by run, the guarded failing runs: when the unguarded twin failed, which alarms the guard
    acted on and which it ignored (past ``max_actions``), and how the guarded run ended."""
    plain = _unguarded(watched)
    return [
        {
            "failure": g.failure,
            "seed": g.seed,
            "policy": g.policy,
            "failed_unguarded": plain[(g.failure, g.kind, g.seed)].failed_step,
            "acted": acted_steps(g),
            "ignored": sorted({a["step"] for a in g.actions if a["action"] == "ignored"}),
            "final_loss": g.final_loss,
            "exploded_step": g.exploded_step,
            "ended_failed": g.ended_failed,
        }
        for g in guarded
        if g.kind == "failing"
    ]


def twin_parted(plain: WatchedRun, guarded: WatchedRun) -> int | None:
    """The first step at which a guarded run's losses differ from its unguarded twin's before the
    guard first acted, or None. Until then the two are one training run, bit for bit; a difference
    means they are not twins (trained on another CPU or torch build, say), and the pair measures
    nothing about the guard."""
    acted = [a["step"] for a in guarded.actions if a["action"] != "ignored"]
    until = min(acted, default=len(guarded.losses))
    pairs = zip(plain.losses[:until], guarded.losses[:until], strict=False)  # an explosion ends one early
    return next((t for t, (p, g) in enumerate(pairs) if p != g and not (math.isnan(p) and math.isnan(g))), None)


def _summary(run: WatchedRun) -> dict[str, Any]:
    keep = ("failure", "kind", "seed", "failed_step", "exploded_step", "final_loss")
    return {k: getattr(run, k) for k in keep} | {"first_alarms": run.first_alarms()}


def _cell(value: Any, fmt: str) -> str:
    """A table cell: the value formatted, or "-" where there is none."""
    return "-" if value is None else format(value, fmt)


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| failure | watcher | failed | alarmed before | median lead (steps) | lead / failure step "
        "| false alarms (controls) | overhead @50 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['failure']} | {r['watcher']} | {r['failed']}/{r['failing_runs']} | {r['alarmed']} "
            f"| {_cell(r['median_lead_steps'], 'g')} | {_cell(r['median_lead_share'], '.0%')} "
            f"| {r['false_alarms']}/{r['controls']}{by_kind(r['false_alarms_by_control'])} "
            f"| {_cell(r['overhead_pct'], '.2f')}{'%' if r['overhead_pct'] else ''} |"
        )
    return "\n".join(lines)


def actions_markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| failure | policy | failing runs saved | still failed | final loss, failing guarded / controls "
        "| controls acted on | largest control final-loss change | controls' seed sd |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:  # a run of controls alone (--kinds control) has no failing final loss
        lines.append(
            f"| {r['failure']} | {r['policy']} | {r['saved']}/{r['failed_unguarded']} | {r['failed_guarded']} "
            f"| {_cell(r['failing_final_loss'], '.2f')} / {_cell(r['control_final_loss'], '.2f')} "
            f"| {r['controls_acted_on']}/{r['controls']} | {_cell(r['control_final_loss_shift_max'], '+.3f')} "
            f"| {', '.join(f'{sd:.3f}' for sd in r['control_final_loss_sd'].values()) or '-'} |"
        )
    return "\n".join(lines)


def guarded_runs_markdown(rows: list[dict[str, Any]]) -> str:
    steps = ", ".join
    lines = [
        "| seed | policy | failed unguarded | acted at | alarms ignored at | final loss | ended failed |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ended = f"exploded at {r['exploded_step']}" if r["exploded_step"] is not None else "yes"
        lines.append(
            f"| {r['seed']} | {r['policy']} | {_cell(r['failed_unguarded'], 'd')} "
            f"| {steps(map(str, r['acted'])) or '-'} | {steps(map(str, r['ignored'])) or '-'} "
            f"| {r['final_loss']:.2f} | {ended if r['ended_failed'] else 'no'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--failures", default=",".join(FAILURES), help="comma-separated names")
    parser.add_argument("--seeds", type=int, default=6, help="failing runs and controls per failure")
    parser.add_argument(
        "--first-seed", type=int, default=0, help="seeds first-seed.. (the alarm rules were chosen on 0-59)"
    )
    parser.add_argument(
        "--seed-list", default="", help="comma-separated seeds, instead of --first-seed and --seeds (e.g. 133,135)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="results JSON")
    parser.add_argument("--runs", type=Path, default=RUNS, help="folder of the saved runs (resumed from)")
    parser.add_argument("--workers", type=int, default=2, help="runs at a time")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads per run (default: the cores over the workers)"
    )
    parser.add_argument(
        "--device", default="cpu", help="cpu or cuda[:N]: where the runs train (the GPU-sized failures need cuda)"
    )
    parser.add_argument(
        "--progress", action="store_true", help="each run prints its step, loss and time a step 20 times"
    )
    parser.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help=f"guard policies to measure, from {', '.join((*POLICIES, *CAPPED))}; '' for none",
    )
    parser.add_argument(
        "--kinds",
        default="",
        help="which runs, comma-separated: failing, control, control_low_lr (deep Post-LN); "
        "default: every kind a failure has. Controls alone check false alarms on fresh seeds",
    )
    saved = parser.add_mutually_exclusive_group()
    saved.add_argument(
        "--guarded-only",
        action="store_true",
        help="run only the guarded runs, each paired with its saved unguarded twin whatever monitor code "
        "watched it (the pairing reads only its losses, which no monitor changes), and refused if their "
        "losses part before the guard first acts (trained on another machine); no head-to-head table",
    )
    saved.add_argument(
        "--saved-only",
        action="store_true",
        help="train nothing: table the runs of these failures, seeds and kinds saved under --runs, whatever "
        "monitor code watched them (the results count each code), e.g. runs trained on another machine",
    )
    parser.add_argument(
        "--only-if",
        choices=sorted(ONLY_IF),
        help="with --guarded-only, twin only the runs where "
        + "; or where ".join(f"{k}: {v}" for k, v in ONLY_IF.items())
        + " (a held-out set's twins); nothing to twin writes nothing",
    )
    args = parser.parse_args()
    names = args.failures.split(",")
    if unknown := set(names) - set(KNOWN):
        raise SystemExit(f"--failures: unknown {sorted(unknown)}; choose from {', '.join(KNOWN)}")
    try:
        BuildOptions(device=args.device)  # the probes' own check of the device, before any run
    except InputError as error:
        raise SystemExit(str(error)) from None
    policies = [p for p in args.policies.split(",") if p]
    if unknown := set(policies) - {*POLICIES, *CAPPED}:
        raise SystemExit(f"--policies: unknown {sorted(unknown)}; choose from {', '.join((*POLICIES, *CAPPED))}")
    try:
        seeds = [int(s) for s in args.seed_list.split(",") if s] or range(args.first_seed, args.first_seed + args.seeds)
    except ValueError:
        parser.error(f"--seed-list: expected comma-separated whole numbers, got {args.seed_list!r}")
    known = {k for n in names for k in KNOWN[n].kinds}
    kinds = [k for k in args.kinds.split(",") if k] or sorted(known)
    if unknown := set(kinds) - known:
        raise SystemExit(f"--kinds: unknown {sorted(unknown)}; choose from {', '.join(sorted(known))}")
    if args.only_if and not args.guarded_only:
        parser.error("--only-if: only with --guarded-only (it reads the runs saved before the twins)")
    # a failing run beside its controls, seed by seed
    cells = [(n, k, s) for n in names for s in seeds for k in KNOWN[n].kinds if k in kinds]
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.workers)
    runner = Runner(args.runs, args.workers, threads, args.device, args.progress)
    if args.saved_only:
        jobs = [(*c, p) for p in (None, *policies) for c in cells]
        if not (saved := [job for job in jobs if runner.path(job).is_file()]):
            parser.error(f"--saved-only: none of the {len(jobs)} runs asked for is saved under {args.runs}")
        print(f"--saved-only: {len(saved)} of the {len(jobs)} runs asked for are saved; tabling those", flush=True)
        runs = [runner.read(job) for job in saved if job[3] is None]
        # a guarded run is judged against its unguarded twin, so one saved without it is left out
        guarded = [runner.read(job) for job in saved if job[3] is not None and (*job[:3], None) in saved]
    elif args.guarded_only:
        if not policies:
            raise SystemExit("--guarded-only: name the policies to run (--policies)")
        if missing := [runner.path((*c, None)).name for c in cells if not runner.path((*c, None)).is_file()]:
            raise SystemExit(
                f"--guarded-only: no saved unguarded run {missing[0]} under {args.runs}: run without it first"
            )
        runs = [runner.read((*c, None)) for c in cells]
        if args.only_if:
            runs = [r for r in runs if asked_for(runner, r, args.only_if)]
            cells = [(r.failure, r.kind, r.seed) for r in runs]
            named = ", ".join(f"{r.failure} {r.seed}" for r in runs) or "none"
            print(f"--only-if {args.only_if}: {len(runs)} run(s): {named}", flush=True)
            if not runs:
                return  # nothing to twin: no results file, as for a set with no run past its horizon
            seeds = sorted({r.seed for r in runs})
        guarded = runner.run_all([(*c, p) for p in policies for c in cells])
    else:
        runs = runner.run_all([(*c, None) for c in cells])
        guarded = runner.run_all([(*c, p) for p in policies for c in cells]) if policies else []
    plain = _unguarded(runs)
    for g in guarded:
        if (step := twin_parted(plain[(g.failure, g.kind, g.seed)], g)) is not None:
            raise SystemExit(
                f"{runner.path((g.failure, g.kind, g.seed, g.policy))}: its losses part from "
                f"its unguarded run's at step {step}, before the guard acted, so the two are not twins "
                "(trained on another machine?); train both on one machine, under their own --runs"
            )
    rows = [] if args.guarded_only else head_to_head(runs)  # a twin's alarms may be another code's
    gpu = f", {torch.cuda.get_device_name(args.device)}" if args.device.startswith("cuda") else ""
    trained = f"{cpu_model()}{gpu}, {threads} torch thread(s) per run, {args.workers} run(s) at a time"
    results = {
        # saved runs may have trained elsewhere: each run's notes name its device and threads
        "machine": f"tabled on {cpu_model()} from saved runs" if args.saved_only else trained,
        "every": DEFAULT_EVERY,
        "seeds": sorted({r.seed for r in runs + guarded}) if args.saved_only else list(seeds),
        "base": BASE,
        "failures": {n: asdict(KNOWN[n]) for n in names},
        "monitor_codes": dict(Counter(r.monitor_code for r in runs + guarded)),
        "runs": [_summary(r) for r in runs],
        "head_to_head": rows,
        "actions": actions(runs, guarded),
        "guarded_runs": guarded_runs(runs, guarded),
    }
    with atomic_path(args.out) as tmp:
        tmp.write_text(json.dumps(results, indent=1))
    if rows:
        print(markdown(rows))
    for r in (r for r in runs if r.kind != "failing" and r.failed_step is not None):
        print(f"Not a clean control (no false alarm counted): {r.failure} {r.kind} {r.seed} failed at {r.failed_step}.")
    if results["actions"]:
        print("\n" + actions_markdown(results["actions"]))
    if results["guarded_runs"]:
        print("\n" + guarded_runs_markdown(results["guarded_runs"]))


if __name__ == "__main__":
    main()
