"""Screens of real-size configs on this CPU: wall time (process start included) and peak RSS.

Each screen runs as its own process under /usr/bin/time -v (peak RSS is the kernel's maximum
resident set size). Configs: GPT-2 124M, LLaMA-2-7B (N = 2048 token states) and a 70B-shaped
LLaMA (80 layers, d = 8192) with 512 token states. Run: make bench-scale (about 35 minutes on a
2-core EPYC). Pass config names to run a subset: python benchmarks/scale.py gpt2-124m

Issue 13's cost bars are ratios measured inside one screen: the spectra's time over the forward
pass's, and the whole screen over a bare forward pass of the same tokens (build + forward, which
for a streamed model includes materialising each block: a forward pass cannot run without it).
The screen's forward also samples and copies the states it hands to the DMD, so the bare-forward
figure is slightly high and the ratio slightly flattering. Results: benchmarks/results/scale.json.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from machine import cpu_model

from rksp_cli.files import atomic_path

HERE = Path(__file__).parent
CASES = {  # name: (config, extra flags, bar)
    "gpt2-124m": ("gpt2-124m.json", [], "DMD <= 1x forward"),
    "llama-2-7b": ("llama-2-7b.json", [], "screen <= 2x bare forward, <= 3 GB"),
    "llama-70b-shaped": ("llama-70b-shaped.json", ["--set", "probe.tokens=512"], "<= 8 GB"),
}
RESULTS = HERE / "results" / "scale.json"


def run(name: str) -> dict:
    config, extra, bar = CASES[name]
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "rksp_cli", "screen", str(HERE / "configs" / config)]
    cmd += [*extra, "--json", "--calibration", "none"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", proc.stderr).group(1)
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    seconds = sum(float(p) * 60**i for i, p in enumerate(reversed(wall.split(":"))))
    out = {"case": name, "bar": bar, "exit": proc.returncode, "wall_s": seconds, "peak_rss_gb": rss_kb / 2**20}
    if proc.returncode in (0, 1):
        result = json.loads(proc.stdout)
        t = result["timings_s"]
        out.update(
            build_s=t["build"], forward_s=t["forward"], dmd_s=t["dmd"], layers=len(result["layers"]),
            near_unit_mass_mean=result["features"]["near_unit_mass_mean"], streamed=result["model"]["streamed"],
        )  # fmt: skip
        bare = t["build"] + t["forward"]
        out.update(dmd_over_forward=t["dmd"] / t["forward"], screen_over_bare_forward=(bare + t["dmd"]) / bare)
    else:
        out["stderr"] = proc.stderr[-500:]
    return out


def main() -> None:
    names = sys.argv[1:] or list(CASES)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    print("| case | bar | wall (s) | peak RSS (GB) | build (s) | forward (s) | DMD (s) | DMD / forward "
          "| screen / bare forward | layers | streamed |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        r = run(name)
        cells = [r["case"], r["bar"], f"{r['wall_s']:.1f}", f"{r['peak_rss_gb']:.2f}"]
        keys = ("build_s", "forward_s", "dmd_s", "dmd_over_forward", "screen_over_bare_forward")
        if "build_s" in r:
            cells += [f"{r[k]:.2f}" if k.endswith("forward") else f"{r[k]:.1f}" for k in keys]
        else:
            cells += ["-"] * len(keys)
        cells += [str(r.get("layers", "-")), str(r.get("streamed", "-"))]
        print("| " + " | ".join(cells) + " |", flush=True)
        if "stderr" in r:
            print(r["stderr"], file=sys.stderr)
        results[name] = {**r, "machine": f"{cpu_model()}, {os.cpu_count()} cores"}
        with atomic_path(RESULTS) as tmp:  # each case lands as it finishes
            tmp.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
