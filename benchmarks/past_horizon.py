"""Failing runs that had not failed by the benchmark's horizon, trained on past it without monitors:
when they fail, and how far ahead of that the watched run's first rksp alarm came (issue 16).

Deep Post-LN runs are 5000 steps; a failing run that is still training then is counted as not
failed, and its alarm as neither right nor wrong. Monitors only read the model, so the same seed
retrained without them takes the same steps: the rerun's first losses must equal the saved run's
bit for bit, which holds when both ran with the same torch threads on the same machine (1, as
``benchmarks/monitors.py --threads 1`` ran them), and is checked and reported, not assumed. The
alarm is the saved run's, rescored to today's rules (``matched_detectors.monitor_alarms``).
Each rerun is saved beside the watched runs (``...-failing-SEED-toSTEPS.json``) and resumed from;
while one trains, it holds a lock on a file beside it (``...-toSTEPS.json.training``), and a second
call for the same seed waits for that process's result instead of training the seed again.
About 19 minutes per deep Post-LN run to 10,000 steps on one core of a 2-core AMD EPYC, 14 on an
Intel Xeon (AVX-512) beside low-priority runs.
Run: python benchmarks/past_horizon.py --seeds 84-89 [--steps 10000] [--workers 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import math
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from machine import cpu_model
from matched_detectors import RUNS, bar_met, first_of, lead, monitor_alarms, seed_range

from rksp_cli.errors import InputError
from rksp_cli.files import atomic_path, check_writable
from rksp_cli.monitors.failures import FAILURES, WatchedRun, lost_step
from rksp_cli.probe import probe


def failed_step(losses: list[float], exploded: int | None) -> int | None:
    """As ``WatchedRun.failed_step``: the first of an explosion and the loss giving back half its progress.
    Not moved into failures.py to be shared: any code edit there changes ``monitor_code()``, and every
    saved run would then count as watched under other rules."""
    events = [s for s in (exploded, lost_step(losses)) if s is not None]
    return min(events) if events else None


@contextmanager
def claimed(path: Path) -> Iterator[bool]:
    """Hold the claim to train ``path``: yields True when this process should train it, False when
    another process trained it while this one waited. The claim is a lock on a file beside ``path``
    (``flock``), which the kernel drops when its holder exits, killed or not, so none goes stale."""
    lock = path.with_name(path.name + ".training")
    with lock.open("a") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logging.info("another process is training it; waiting for its result")
            fcntl.flock(held, fcntl.LOCK_EX)
        yield not path.is_file()
        if path.is_file():
            lock.unlink(missing_ok=True)  # while still held: a waiter wakes to find the result


def rerun(failure: str, seed: int, steps: int, threads: int, runs: Path) -> dict[str, Any]:
    """The failing run of ``seed`` trained to ``steps`` without monitors (saved, or resumed)."""
    path = runs / f"{failure}-failing-{seed}-to{steps}.json"
    if path.is_file():
        return json.loads(path.read_text())
    logging.basicConfig(format=f"  {path.stem}: %(message)s", level=logging.INFO, force=True)
    with claimed(path) as mine:
        if not mine:  # another process trained it while this one waited
            return json.loads(path.read_text())
        torch.set_num_threads(threads)
        spec = FAILURES[failure].spec("failing", seed)
        spec.training.steps = steps
        result = probe(spec)
        longer = {
            "seed": seed, "steps": steps, "threads": threads, "losses": result.losses, "grad_norms": result.grad_norms,
            "exploded_step": result.diverged_step if result.diverged else None,
        }  # fmt: skip
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(longer))
    return longer


def judge(watched: WatchedRun, longer: dict[str, Any]) -> dict[str, Any]:
    """The watched run's first alarm against the longer run's failure."""
    alarms = {m: step for m, step in monitor_alarms(watched).items() if step is not None}
    first = first_of(alarms.values())
    failed = failed_step(longer["losses"], longer["exploded_step"])
    ahead = lead(failed, first)
    n = len(watched.losses)
    prefix = longer["losses"][:n]
    diffs = [abs(a - b) for a, b in zip(prefix, watched.losses, strict=False) if math.isfinite(a - b)]
    return {
        "seed": watched.seed, "horizon": watched.steps, "steps": longer["steps"],
        "rksp": first, "monitors": sorted(m for m, step in alarms.items() if step == first),
        "failed": failed, "exploded": longer["exploded_step"], "lead": ahead,
        "lead_bar_met": bar_met(ahead, failed),
        "prefix_identical": len(prefix) == n and prefix == watched.losses,
        "prefix_max_abs_diff": max(diffs, default=math.nan),
    }  # fmt: skip


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| seed | trained to | failed at | rksp's first alarm (monitor) | lead | lead bar | first losses identical |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        failed = "did not fail" if r["failed"] is None else str(r["failed"])
        alarm = "none" if r["rksp"] is None else f"{r['rksp']} ({', '.join(r['monitors'])})"
        identical = "yes" if r["prefix_identical"] else f"no (max diff {r['prefix_max_abs_diff']:.2g})"
        lead = "-" if r["lead"] is None else str(r["lead"])
        lines.append(
            f"| {r['seed']} | {r['steps']} | {failed} | {alarm} | {lead} | {'met' if r['lead_bar_met'] else '-'} "
            f"| {identical} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=seed_range, required=True, help="the failing runs' seeds (a range a-b)")
    parser.add_argument("--failure", default="post_ln_without_warmup", choices=sorted(FAILURES))
    parser.add_argument("--steps", type=int, default=10_000, help="train each to this many steps")
    parser.add_argument("--workers", type=int, default=2, help="runs at a time")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (as the watched runs had)")
    parser.add_argument("--runs", type=Path, default=RUNS, help="folder of the saved runs")
    parser.add_argument("--out", type=Path, help="results JSON (default: results/monitors-past-horizon-SEEDS.json)")
    args = parser.parse_args()
    out = args.out or RUNS.parent / f"monitors-past-horizon-{min(args.seeds)}-{max(args.seeds)}.json"
    try:
        check_writable(out, "--out")
    except InputError as exc:
        parser.error(str(exc))
    watched = []
    for seed in sorted(args.seeds):
        path = args.runs / f"{args.failure}-failing-{seed}.json"
        if not path.is_file():
            parser.error(f"{path}: no saved failing run of seed {seed}; run benchmarks/monitors.py first")
        run = WatchedRun.from_dict(json.loads(path.read_text()))
        if run.steps >= args.steps:
            parser.error(f"--steps {args.steps} is not past {path.name}'s horizon of {run.steps}")
        if run.failed_step is None:
            watched.append(run)
    print(f"{len(watched)} of {len(args.seeds)} failing runs had not failed by their horizon", flush=True)
    if not watched:
        return  # nothing to train on: no results file
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        jobs = [pool.submit(rerun, args.failure, r.seed, args.steps, args.threads, args.runs) for r in watched]
        rows = [judge(run, job.result()) for run, job in zip(watched, jobs, strict=True)]
    results = {
        "machine": f"{cpu_model()}, {args.threads} torch thread(s) per run, {args.workers} run(s) at a time",
        "failure": args.failure, "seeds": sorted(args.seeds), "rows": rows,
    }  # fmt: skip
    with atomic_path(out) as tmp:
        tmp.write_text(json.dumps(results, indent=1))
    print(markdown(rows))


if __name__ == "__main__":
    main()
