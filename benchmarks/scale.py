"""Screens of real-size configs on this CPU: wall time (process start included) and peak RSS.

Each screen runs as its own process under /usr/bin/time -v (peak RSS is the kernel's maximum
resident set size). Configs: GPT-2 124M, LLaMA-2-7B (N = 2048 token states) and a 70B-shaped
LLaMA (80 layers, d = 8192) with 512 token states. Run: make bench-scale (about 50 minutes on a
2-core EPYC). Pass config names to run a subset: python benchmarks/scale.py gpt2-124m

Issue 13's cost bars compare the screen with a bare forward pass of the same tokens, run as its
own process the same way (build, then one no-grad forward pass without hooks; for a streamed model
that includes materialising each block: a forward pass cannot run without it). The spectra's cost
is what the screen adds to it, screen wall - bare wall (capture, de-duplication, DMD, risk,
output), over the bare forward pass's own time; and the whole screen over the bare process. The
screen's own timings are kept beside them: its "forward" includes the capture of the sampled
states, its "dmd" the de-duplication and the spectra. Results: benchmarks/results/scale.json.
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
CASES = {  # name: (config, extra flags, bar, measure a bare forward too)
    "gpt2-124m": ("gpt2-124m.json", [], "spectra <= 1x bare forward", True),
    "llama-2-7b": ("llama-2-7b.json", [], "screen <= 2x bare forward, <= 3 GB", True),
    "llama-70b-shaped": ("llama-70b-shaped.json", ["--set", "probe.tokens=512"], "<= 8 GB", False),
}
RESULTS = HERE / "results" / "scale.json"


def _timed(cmd: list[str]) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run under /usr/bin/time -v: the process, its wall seconds and its peak RSS in GB."""
    proc = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", proc.stderr).group(1)
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    return proc, sum(float(p) * 60**i for i, p in enumerate(reversed(wall.split(":")))), rss_kb / 2**20


def run(name: str) -> dict:
    config, extra, bar, bare = CASES[name]
    cmd = [sys.executable, "-m", "rksp_cli", "screen", str(HERE / "configs" / config), *extra]
    proc, seconds, rss = _timed([*cmd, "--json", "--calibration", "none"])
    out = {"case": name, "bar": bar, "exit": proc.returncode, "wall_s": seconds, "peak_rss_gb": rss}
    if proc.returncode not in (0, 1):
        return {**out, "stderr": proc.stderr[-500:]}
    result = json.loads(proc.stdout)
    t = result["timings_s"]
    out.update(
        build_s=t["build"], forward_s=t["forward"], dmd_s=t["dmd"], layers=len(result["layers"]),
        near_unit_mass_mean=result["features"]["near_unit_mass_mean"], streamed=result["model"]["streamed"],
    )  # fmt: skip
    if bare:
        proc, bare_wall, _ = _timed([sys.executable, __file__, "--bare", config, *extra])
        timing = json.loads(proc.stdout)
        out.update(
            bare_wall_s=bare_wall, bare_forward_s=timing["forward"], spectra_s=seconds - bare_wall,
            spectra_over_bare_forward=(seconds - bare_wall) / timing["forward"], screen_over_bare=seconds / bare_wall,
        )  # fmt: skip
    return out


def bare_forward(config: str, extra: list[str], device: str = "cpu") -> None:
    """Build the screen's model and run one no-grad forward pass on the screen's tokens; print the
    times. torch's default thread count, as ``rksp screen``'s."""
    import time

    import torch

    from rksp_cli.data import screen_batch
    from rksp_cli.models import BuildOptions, build_subject
    from rksp_cli.spec import load_spec

    spec = load_spec(HERE / "configs" / config, extra[1::2])  # extra: ["--set", "field=value", ...]
    t0 = time.perf_counter()
    subject = build_subject(spec.model, spec.probe.seed, BuildOptions(device=device))
    t1 = time.perf_counter()
    gen = torch.Generator().manual_seed(spec.probe.seed)
    ids = screen_batch(spec.probe.input, spec.probe.tokens, subject.vocab_size, subject.seq_len, gen)
    with torch.no_grad():
        subject.forward(ids)
    if device != "cpu":
        torch.cuda.synchronize()
    print(json.dumps({"build": t1 - t0, "forward": time.perf_counter() - t1}))


def main() -> None:
    if sys.argv[1:2] == ["--bare"]:  # --bare CONFIG [--device D] [--set field=value ...]
        config, rest = sys.argv[2], sys.argv[3:]
        if rest[:1] == ["--device"]:
            return bare_forward(config, rest[2:], rest[1])
        return bare_forward(config, rest)
    names = sys.argv[1:] or list(CASES)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    print("| case | bar | wall (s) | peak RSS (GB) | build (s) | forward (s) | DMD (s) | bare wall (s) | bare "
          "forward (s) | spectra (s) | spectra / bare forward | screen / bare | layers | streamed |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        r = run(name)
        cells = [r["case"], r["bar"], f"{r['wall_s']:.1f}", f"{r['peak_rss_gb']:.2f}"]
        keys = ("build_s", "forward_s", "dmd_s", "bare_wall_s", "bare_forward_s", "spectra_s",
                "spectra_over_bare_forward", "screen_over_bare")  # fmt: skip
        cells += [f"{r[k]:.2f}" if k.endswith(("forward", "bare")) else f"{r[k]:.1f}" if k in r else "-" for k in keys]
        cells += [str(r.get("layers", "-")), str(r.get("streamed", "-"))]
        print("| " + " | ".join(cells) + " |", flush=True)
        if "stderr" in r:
            print(r["stderr"], file=sys.stderr)
        results[name] = {**r, "machine": f"{cpu_model()}, {os.cpu_count()} cores"}
        with atomic_path(RESULTS) as tmp:  # each case lands as it finishes
            tmp.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
