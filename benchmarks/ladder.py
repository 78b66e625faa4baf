"""Does the proxy ladder predict the edge of a wider model? And what does it say about real ladders?

``transfer`` (issue 14's bar: fitted on widths up to W, predict the measured edge at 4W within
1.5x): the built-in GPT, 4 blocks, init std 0.02, 200 AdamW steps of the synthetic LM, batch 16,
no warmup or clipping, for pre-LN, post-LN and no normalisation. `rksp ladder`'s search brackets
the edge (1.25x) at widths 16, 32, 64 and 256, seeds 0 and 1; the law is fitted on 16-64 (W = 64)
and its prediction at 256 is compared with the edge measured there (geometric mean of the two
seeds). Beside it, two predictions without a fit: the edge at W unchanged, and the edge at W
scaled by W/4W (the 1/width rule for Adam under standard parametrisation).

``published``: one ladder of pre-LN proxies (widths 32, 64, 128; depths 2, 4, 8; warmup 50 of
200 steps, clipping 1.0, init std 0.02, AdamW (0.9, 0.95), weight decay 0.1), and its prediction
at the widths and depths of the GPT-3 (Brown et al. 2020, Table 2.1) and Pythia (model cards)
ladders, beside their published lrs. The proxies share those runs' width, depth, norm placement and
optimizer, not their data, batch (0.5-2M tokens), horizon, rotary embeddings or parallel blocks:
the prediction is the edge of a 200-step synthetic-LM probe at that size, a ranking and a trend
rather than the edge of the real run.

Writes benchmarks/results/ladder.json and prints Markdown. Resumable (journals under
benchmarks/results/ladder/). About 30 minutes on 2 cores with 2 workers. Run: make bench-ladder
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from rksp_cli.files import atomic_path
from rksp_cli.ladder import Search, Target, fit_ladder, proxy_edges, run_ladder
from rksp_cli.risk.edge_law import WIDTH
from rksp_cli.spec import spec_from_dict

HERE = Path(__file__).parent / "results"
RESULTS = HERE / "ladder.json"
FIT_WIDTHS, HELD_OUT = [16, 32, 64], 256
SEEDS = [0, 1]
NORMS = ("pre", "post", "none")
SEARCH = Search(lr_range=(1e-4, 3.0), lr_points=8, resolution=1.25)
BAR = 1.5

# (name, d_model, n_layers, published peak lr)
GPT3 = [
    ("Small", 768, 12, 6e-4), ("Medium", 1024, 24, 3e-4), ("Large", 1536, 24, 2.5e-4), ("XL", 2048, 24, 2e-4),
    ("2.7B", 2560, 32, 1.6e-4), ("6.7B", 4096, 32, 1.2e-4), ("13B", 5140, 40, 1e-4), ("175B", 12288, 96, 6e-5),
]  # fmt: skip
PYTHIA = [
    ("70M", 512, 6, 1e-3), ("160M", 768, 12, 6e-4), ("410M", 1024, 24, 3e-4), ("1B", 2048, 16, 3e-4),
    ("1.4B", 2048, 24, 2e-4), ("2.8B", 2560, 32, 1.6e-4), ("6.9B", 4096, 32, 1.2e-4), ("12B", 5120, 36, 1.2e-4),
]  # fmt: skip


def _target(model: dict, training: dict) -> Target:
    raw = {"model": model, "training": {"steps": 200, **training}, "probe": {"tokens": 512}}
    spec = spec_from_dict(raw, source="benchmark")
    return Target(spec.resolved(), model["d_model"], model["n_layers"], model["d_model"] // model["n_heads"])


def transfer(workers: int) -> list[dict]:
    rows = []
    for norm in NORMS:
        target = _target({"norm": norm, "d_model": HELD_OUT, "n_layers": 4, "n_heads": HELD_OUT // 16}, {})
        out = HERE / "ladder" / f"transfer-{norm}.parquet"
        frame = run_ladder(target, [*FIT_WIDTHS, HELD_OUT], [4], SEEDS, SEARCH, out, workers)
        fit = fit_ladder(frame[frame[WIDTH] <= max(FIT_WIDTHS)], target)
        edges = proxy_edges(frame)
        measured = _geomean(edges[(edges["width"] == HELD_OUT) & ~edges["censored"]]["edge"])
        at_w = _geomean(edges[(edges["width"] == max(FIT_WIDTHS)) & ~edges["censored"]]["edge"])
        p = fit.prediction
        rows.append({
            "norm": norm, "measured_edge_4w": measured, "predicted_edge_4w": p.edge, "interval": list(p.interval),
            "ratio": p.edge / measured, "within_bar": max(p.edge / measured, measured / p.edge) <= BAR,
            "measured_in_interval": p.interval[0] <= measured <= p.interval[1],
            "width_exponent": fit.law.exponents.get("width"), "edge_at_w": at_w,
            "ratio_unchanged": at_w / measured, "ratio_one_over_width": at_w * max(FIT_WIDTHS) / HELD_OUT / measured,
            "seed_edges_4w": edges[edges["width"] == HELD_OUT]["edge"].tolist(), "probes": len(frame),
        })  # fmt: skip
    return rows


def published(workers: int) -> dict:
    training = {"warmup_steps": 50, "grad_clip": 1.0}
    target = _target({"norm": "pre", "d_model": 768, "n_layers": 12, "n_heads": 12}, training)
    frame = run_ladder(target, [32, 64, 128], [2, 4, 8], [0], SEARCH, HERE / "ladder" / "published.parquet", workers)
    fit = fit_ladder(frame, target)
    out = {"exponents": fit.law.exponents, "proxies": fit.edges.to_dict("records"), "probes": len(frame)}
    for family, ladder in (("GPT-3", GPT3), ("Pythia", PYTHIA)):
        out[family] = []
        for name, width, depth, lr in ladder:
            p = fit.law.predict(width, depth)
            out[family].append({"model": name, "width": width, "depth": depth, "published_lr": lr, "edge": p.edge,
                                "interval": list(p.interval), "edge_over_lr": p.edge / lr})  # fmt: skip
    return out


def _geomean(values) -> float:
    values = [v for v in values if v == v]
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else math.nan


def markdown(results: dict) -> str:
    lines = []
    if "transfer" in results:
        lines += [
            f"Fitted on widths {', '.join(map(str, FIT_WIDTHS))}; edge at width {HELD_OUT} (4W), 4 blocks, seeds 0-1:",
            "",
            "| norm | measured edge at 4W | ladder prediction [90% interval] | ratio "
            "| edge at W unchanged | W/4W rule |",
            "|---|---|---|---|---|---|",
        ]
        for r in results["transfer"]:
            lo, hi = r["interval"]
            lines.append(
                f"| {r['norm']} | {r['measured_edge_4w']:.3g} | {r['predicted_edge_4w']:.3g} [{lo:.3g}, {hi:.3g}] "
                f"| {r['ratio']:.2f}x | {r['ratio_unchanged']:.2f}x | {r['ratio_one_over_width']:.2f}x |"
            )
        lines.append("")
    if "published" in results:
        pub = results["published"]
        law = ", ".join(f"{k}^{v:+.2f}" for k, v in pub["exponents"].items())
        lines += [f"Published ladders, one proxy ladder (edge ∝ {law}):", ""]
        lines += ["| model | width | depth | published lr | ladder edge [90% interval] | edge / lr |"]
        lines += ["|---|---|---|---|---|---|"]
        for family in ("GPT-3", "Pythia"):
            for r in pub[family]:
                lo, hi = r["interval"]
                lines.append(
                    f"| {family} {r['model']} | {r['width']} | {r['depth']} | {r['published_lr']:.2g} "
                    f"| {r['edge']:.2g} [{lo:.2g}, {hi:.2g}] | {r['edge_over_lr']:.0f} |"
                )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", nargs="?", choices=["transfer", "published", "all"], default="all")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    (HERE / "ladder").mkdir(parents=True, exist_ok=True)
    if args.part in ("transfer", "all"):
        results["transfer"] = transfer(args.workers)
    if args.part in ("published", "all"):
        results["published"] = published(args.workers)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(RESULTS) as tmp:
        tmp.write_text(json.dumps(results, indent=1, default=float))
    print(markdown(results))


if __name__ == "__main__":
    main()
