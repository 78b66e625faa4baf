"""Real configs at their published settings (issue 14's bar): do they screen low, with the edge
above the published lr, and does the edge fall with size as the published lrs do?

GPT-2 124M as nanoGPT reproduces it (lr 6e-4, warmup 2000, 512 sequences per batch, clipping 1.0,
weight decay 0.1), the Pythia suite from 70M to 1.4B (model cards: lr 1e-3 to 2e-4, warmup 1%
of 143,000 steps, 1024 sequences, clipping 1.0, weight decay 0.01) and GPT-3 Small to XL (Brown
et al. 2020, Table 2.1 and Appendix B: lr 6e-4 to 2e-4, 0.5M-token batches of 2048-token sequences
(1M for XL), warmup over 375M tokens, clipping 1.0, weight decay 0.1; the GPT-2 architecture with
a 2048 context, dense attention throughout, since transformers has no GPT-3 and its alternating
sparse layers do not change the init-time stream; XL with 16 heads of 128, the table's 24 x 128
not dividing 2048), randomly initialised from their configs (benchmarks/configs) and screened
once (N = 2048 token states) with the shipped risk model. Every one lies outside the calibrated
box (warmup and batch alone), so each reports an interval.

Writes benchmarks/results/published.json and prints Markdown. About 3 minutes on a 2-core AVX-512
EPYC at N = 2048, about 20 at N = 8192 (the 2048-wide screens dominate). Run: make bench-published

``--tokens N`` screens with N token states instead (results in published-N<N>.json): at N = 2048
the 1B and 1.4B widths (2048) leave the fit exact, so their risk is not scored; N = 8192 measures
them, best with ``--device cuda`` (on one H100 each screen took under a minute).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from rksp_cli.files import atomic_path
from rksp_cli.models import BuildOptions
from rksp_cli.risk import default_risk_model
from rksp_cli.risk.assessment import EDGE_LEVEL
from rksp_cli.screen import screen
from rksp_cli.spec import load_spec

HERE = Path(__file__).parent
RESULTS = HERE / "results" / "published.json"
GPT2 = {"lr": 6e-4, "warmup_steps": 2000, "batch_size": 512, "grad_clip": 1.0, "weight_decay": 0.1}
PYTHIA = {"warmup_steps": 1430, "batch_size": 1024, "grad_clip": 1.0, "weight_decay": 0.01}
GPT3 = {"warmup_steps": 750, "batch_size": 256, "grad_clip": 1.0, "weight_decay": 0.1}  # 375M / 0.5M tokens
CASES = {  # name: (config file, training settings)
    "GPT-2 124M": ("gpt2-124m.json", GPT2),
    "Pythia 70M": ("pythia-70m.json", PYTHIA | {"lr": 1e-3}),
    "Pythia 160M": ("pythia-160m.json", PYTHIA | {"lr": 6e-4}),
    "Pythia 410M": ("pythia-410m.json", PYTHIA | {"lr": 3e-4}),
    "Pythia 1B": ("pythia-1b.json", PYTHIA | {"lr": 3e-4}),
    "Pythia 1.4B": ("pythia-1.4b.json", PYTHIA | {"lr": 2e-4}),
    "GPT-3 Small": ("gpt3-small.json", GPT3 | {"lr": 6e-4}),
    "GPT-3 Medium": ("gpt3-medium.json", GPT3 | {"lr": 3e-4}),
    "GPT-3 Large": ("gpt3-large.json", GPT3 | {"lr": 2.5e-4}),
    "GPT-3 XL": ("gpt3-xl.json", GPT3 | {"lr": 2e-4, "batch_size": 512, "warmup_steps": 375}),  # 1M-token batches
}


# Inside the calibrated box: the same screen scored at a warmup and batch the calibration runs
# had, so that the edge's trend with size is not carried by the linear warmup and batch terms
# extrapolated 3.4 units of log-warmup and 5 doublings of batch beyond the runs.
IN_BOX = {"config.training.warmup_steps": 50, "config.training.batch_size": 32}


def run(name: str, tokens: int, device: str) -> tuple[dict, dict]:
    """The benchmark's record of one config, and its screen row."""
    config, training = CASES[name]
    sets = [f"training.{k}={v}" for k, v in training.items()] + [f"probe.tokens={tokens}"]
    risk_model = default_risk_model()
    result = screen(load_spec(HERE / "configs" / config, sets), risk_model, BuildOptions(device=device))
    r, box = result.risk, risk_model.assess(result.row() | IN_BOX)
    return result.row(), {
        "model": name, "width": int(result.features["d_model"]), "depth": int(result.features["n_layers"]),
        "lr": training["lr"], "risk": r.risk, "risk_interval": r.interval, "verdict": r.verdict, "reason": r.reason,
        "edge": r.lr_edge, "edge_interval": r.edge_interval, "edge_over_lr": r.lr_edge / training["lr"],
        "extrapolated": r.extrapolated, "out_of_range": r.out_of_range, "norm": result.model.get("norm"),
        "edge_in_box": box.lr_edge, "edge_in_box_interval": box.edge_interval,
        "in_box_out_of_range": box.out_of_range, "seconds": sum(
            v for v in result.timings.values() if isinstance(v, float)),
    }  # fmt: skip


SUITES = {  # each by size
    "Pythia": ("Pythia 70M", "Pythia 160M", "Pythia 410M", "Pythia 1B", "Pythia 1.4B"),
    "GPT-3": ("GPT-3 Small", "GPT-3 Medium", "GPT-3 Large", "GPT-3 XL"),
}


def trend(screened: dict[str, dict], suite: tuple[str, ...]) -> list[dict]:
    """Does the edge fall along a suite as its published lr does? Per step up in size, the edge
    ratio (larger / smaller) of the shipped fit and its 90% interval over the group-bootstrap
    refits, each refit comparing the two models with the same coefficients, and the share of
    refits in which the edge fell. Read at the published settings: the fit has no term coupling
    warmup or batch to size, so within a suite that shares them the ratios are the same at any
    shared settings (checked on Pythia: identical at warmup 50, batch 32); GPT-3 XL's larger batch
    and shorter warmup enter its step too, as they enter its published lr."""
    model, level = default_risk_model().calibration.model, EDGE_LEVEL
    names = [n for n in suite if n in screened and "row" in screened[n] and math.isfinite(screened[n]["edge"])]
    if len(names) < 2:
        return []
    frame = pd.DataFrame([screened[n]["row"] for n in names])
    edges, boot = model.edge(frame, level), np.log10(model.bootstrap_edges(frame, level))
    out = []
    for i in range(1, len(names)):
        ratios = boot[:, i] - boot[:, i - 1]
        lo, hi = np.quantile(ratios, [0.05, 0.95])
        out.append({
            "from": names[i - 1], "to": names[i],
            "published_lr_ratio": CASES[names[i]][1]["lr"] / CASES[names[i - 1]][1]["lr"],
            "edge_ratio": float(edges[i] / edges[i - 1]), "edge_ratio_interval": [float(10**lo), float(10**hi)],
            "refits_falling": float(np.mean(ratios < 0)),
        })  # fmt: skip
    return out


def markdown(rows: list[dict]) -> str:
    lines = ["| model | width x depth | published lr | risk [90% interval] | verdict | edge [90% interval] "
             "| edge / lr | edge at warmup 50, batch 32 |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        head = f"| {r['model']} | {r['width']} x {r['depth']} | {r['lr']:.2g} | "
        if r["risk_interval"] is None or r["edge_interval"] is None:  # not scored: the reason says why
            lines.append(head + f"not scored | {r['verdict']} | - | - | - |")
            continue
        ri, ei, bi = r["risk_interval"], r["edge_interval"], r["edge_in_box_interval"]
        lines.append(
            head + f"{r['risk']:.3f} [{ri[0]:.3f}, {ri[1]:.3f}] | {r['verdict']} | {r['edge']:.2g} "
            f"[{ei[0]:.2g}, {ei[1]:.2g}] | {r['edge_over_lr']:.0f} | "
            f"{r['edge_in_box']:.2g} [{bi[0]:.2g}, {bi[1]:.2g}] |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description="Real configs at their published settings, screened.")
    parser.add_argument("cases", nargs="*", metavar="case", help=f"a subset: {', '.join(CASES)}")
    parser.add_argument("--tokens", type=int, default=2048, help="probe.tokens of every screen")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()
    if unknown := [c for c in args.cases if c not in CASES]:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    torch.set_num_threads(2)
    out = RESULTS if args.tokens == 2048 else RESULTS.with_name(f"published-N{args.tokens}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    # a subset is merged into the results already there (each model keeps its screen row for the trend)
    earlier = json.loads(out.read_text())["models"] if out.is_file() else []
    screened = {r["model"]: r for r in earlier}
    for name in args.cases or CASES:
        row, record = run(name, args.tokens, args.device)
        screened[name] = record | {"row": row}
    screened = {name: screened[name] for name in CASES if name in screened}  # the table's order
    rows = [{k: v for k, v in r.items() if k != "row"} for r in screened.values()]
    steps = [step for suite in SUITES.values() for step in trend(screened, suite)]
    with atomic_path(out) as tmp:
        tmp.write_text(json.dumps({"models": list(screened.values()), "trend": steps}, indent=1, default=str))
    print(markdown(rows))
    print()
    print("| from -> to | published lr ratio | edge ratio [90% over refits] | refits where it fell |")
    print("|---|---|---|---|")
    for t in steps:
        lo, hi = t["edge_ratio_interval"]
        print(f"| {t['from']} -> {t['to']} | {t['published_lr_ratio']:.2f} | "
              f"{t['edge_ratio']:.2f} [{lo:.2f}, {hi:.2f}] | {100 * t['refits_falling']:.0f}% |")  # fmt: skip


if __name__ == "__main__":
    main()
