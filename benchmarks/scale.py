"""Screens of real-size configs on this CPU: wall time (process start included) and peak RSS.

Each screen runs as its own process under /usr/bin/time -v (peak RSS is the kernel's maximum
resident set size). Configs: GPT-2 124M, LLaMA-2-7B (N = 2048 token states) and a 70B-shaped
LLaMA (80 layers, d = 8192) with 512 token states. Run: make bench-scale (about 30 minutes).
Pass config names to run a subset: python benchmarks/scale.py gpt2-124m
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
CASES = {  # name: (config, extra flags, bar)
    "gpt2-124m": ("gpt2-124m.json", [], "<= 30 s"),
    "llama-2-7b": ("llama-2-7b.json", [], "<= 10 min, <= 3 GB"),
    "llama-70b-shaped": ("llama-70b-shaped.json", ["--set", "probe.tokens=512"], "<= 8 GB"),
}


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
    else:
        out["stderr"] = proc.stderr[-500:]
    return out


def main() -> None:
    names = sys.argv[1:] or list(CASES)
    print("| case | bar | wall (s) | peak RSS (GB) | build (s) | forward (s) | DMD (s) | layers | streamed |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in names:
        r = run(name)
        cells = [r["case"], r["bar"], f"{r['wall_s']:.1f}", f"{r['peak_rss_gb']:.2f}"]
        cells += [f"{r[k]:.1f}" for k in ("build_s", "forward_s", "dmd_s")] if "build_s" in r else ["-"] * 3
        cells += [str(r.get("layers", "-")), str(r.get("streamed", "-"))]
        print("| " + " | ".join(cells) + " |", flush=True)
        if "stderr" in r:
            print(r["stderr"], file=sys.stderr)


if __name__ == "__main__":
    main()
