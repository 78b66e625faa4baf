"""The screen on a GPU against the same screen on the CPU. Needs CUDA: run it where a GPU exists.

For each config, `rksp screen --json` with --device cuda (and, for the configs small enough,
--device cpu on the same machine), each its own process, and a bare forward pass on the GPU
(`scale.py --bare`, build and one no-grad forward, no hooks). Reported: the largest difference of
any layer-mean feature between the devices, the risks and edges side by side, and the wall times.
The DMD runs where the states are (``--device``); a cuda screen is not bit-identical to a CPU one
(float32 round-off in the forward pass, other eigensolvers), so the comparison is what says
whether the difference matters. Results: benchmarks/results/device.json, each case as it lands.
Run: python benchmarks/device_screen.py [case ...] (a few minutes on one H100).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from machine import cpu_model

from rksp_cli.files import atomic_path

HERE = Path(__file__).parent
ROOT = HERE.parent
CASES = {  # name: (config, its published lr, also screen on the CPU)
    "gpt-small-preln": (ROOT / "screens" / "gpt-small-preln.yaml", None, True),
    "gpt2-124m": (HERE / "configs" / "gpt2-124m.json", 6e-4, True),
    "llama-2-7b": (HERE / "configs" / "llama-2-7b.json", 3e-4, False),
}
RESULTS = HERE / "results" / "device.json"
COMPARED = ("near_unit_mass_mean", "expansive_mass_mean", "gap_mass_mean", "contractive_mass_mean",
            "spectral_radius_mean", "eta_nl_mean", "log10_kappa_mean", "stream_growth", "init_loss")  # fmt: skip


def _screen(config: Path, lr: float | None, device: str) -> tuple[dict, float]:
    t = time.perf_counter()
    cmd = [sys.executable, "-m", "rksp_cli", "screen", str(config), "--json", "--device", device, "--spread", "1"]
    cmd += ["--set", f"training.lr={lr}"] if lr else []
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{config.name} on {device}: exit {proc.returncode}: {proc.stderr[-800:]}")
    return json.loads(proc.stdout), wall


def _bare(config: Path, device: str) -> tuple[dict, float]:
    t = time.perf_counter()
    cmd = [sys.executable, str(HERE / "scale.py"), "--bare", str(config), "--device", device]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout), time.perf_counter() - t


def _summary(result: dict, wall: float) -> dict:
    t = result["timings_s"]
    return {
        "wall_s": wall, "build_s": t["build"], "forward_s": t["forward"], "dmd_s": t["dmd"],
        "risk": result["risk"], "verdict": result["verdict"], "lr_edge": result["lr_edge"],
        "features": {k: result["features"].get(k) for k in COMPARED}, "warnings": result["warnings"],
    }  # fmt: skip


def run(name: str) -> dict:
    config, lr, on_cpu = CASES[name]
    gpu, gpu_wall = _screen(config, lr, "cuda")
    bare, bare_wall = _bare(config, "cuda")
    out = {"case": name, "cuda": _summary(gpu, gpu_wall), "bare_cuda": {**bare, "wall_s": bare_wall}}
    out["cuda"]["spectra_over_bare_forward"] = (gpu_wall - bare_wall) / bare["forward"]
    if on_cpu:
        cpu, cpu_wall = _screen(config, lr, "cpu")
        out["cpu"] = _summary(cpu, cpu_wall)
        a, b = out["cpu"]["features"], out["cuda"]["features"]
        out["max_feature_difference"] = max(
            (abs(a[k] - b[k]), k) for k in COMPARED if a.get(k) is not None and b.get(k) is not None
        )
        out["edge_ratio"] = max(gpu["lr_edge"], cpu["lr_edge"]) / min(gpu["lr_edge"], cpu["lr_edge"])
    return out


def main() -> None:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: this benchmark compares a GPU screen with a CPU one")
    names = sys.argv[1:] or list(CASES)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    machine = f"{torch.cuda.get_device_name()}, torch {torch.__version__}; CPU {cpu_model()}"
    print(f"machine: {machine}\n")
    print("| case | cuda wall (s) | cpu wall (s) | cuda DMD (s) | bare cuda forward (s) | risk cuda / cpu "
          "| edge cuda / cpu | largest feature difference |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        r = run(name)
        g, c = r["cuda"], r.get("cpu")
        diff = r.get("max_feature_difference")
        print(f"| {name} | {g['wall_s']:.1f} | {c['wall_s']:.1f} | {g['dmd_s']:.1f} | {r['bare_cuda']['forward']:.2f} "
              f"| {g['risk']:.3f} / {c['risk']:.3f} | {g['lr_edge']:.3g} / {c['lr_edge']:.3g} "
              f"| {diff[0]:.2g} ({diff[1]}) |" if c else
              f"| {name} | {g['wall_s']:.1f} | - | {g['dmd_s']:.1f} | {r['bare_cuda']['forward']:.2f} "
              f"| {g['risk']:.3f} / - | {g['lr_edge']:.3g} / - | - |", flush=True)  # fmt: skip
        results[name] = {**r, "machine": machine}
        with atomic_path(RESULTS) as tmp:
            tmp.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
