"""Sweep throughput: points per minute with 2 local workers, and the machinery's overhead.

40 screens of the built-in GPT (4 blocks, d=64, N=2048 token states), three ways, each repeated
and reported as the median:
  loop      run_point() over every point in one process (one torch thread): the baseline
  sweep x1  rksp's sweep in-process (store, resume bookkeeping), one worker
  sweep x2  rksp's sweep with 2 spawned worker processes
Overhead of the machinery = sweep x1 / loop - 1. Run: make bench-sweep (on a quiet machine).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch

from rksp_cli.spec import spec_from_dict
from rksp_cli.sweep import Point, run_point, run_sweep

REPEATS = 3


def points(n: int = 40) -> list[Point]:
    out = []
    for i in range(n):
        spec = spec_from_dict({"model": {"norm": ["pre", "none"][i % 2]}, "training": {"lr": 1e-4 * (1 + i)}})
        out.append(Point.of(spec))
    return out


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    torch.set_num_threads(1)
    pts = points()
    run_point(pts[0].config, pts[0].key, False)  # warm imports and caches for every arm alike

    def loop() -> None:
        for p in pts:
            run_point(p.config, p.key, False)

    def sweep(workers: int) -> float:
        with tempfile.TemporaryDirectory() as tmp:
            return timed(lambda: run_sweep(pts, Path(tmp) / "r.parquet", workers=workers))

    results = {"loop": [], "sweep x1": [], "sweep x2": []}
    for _ in range(REPEATS):
        results["loop"].append(timed(loop))
        results["sweep x1"].append(sweep(1))
        results["sweep x2"].append(sweep(2))
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"{len(pts)} points, median of {REPEATS} runs")
    for name, seconds in med.items():
        print(f"  {name:9s} {seconds:6.1f} s   {60 * len(pts) / seconds:6.1f} points/min")
    print(f"  machinery overhead (sweep x1 vs loop): {100 * (med['sweep x1'] / med['loop'] - 1):+.1f}%")
    print(f"  2-worker speed-up over the loop: {med['loop'] / med['sweep x2']:.2f}x")


if __name__ == "__main__":
    main()
