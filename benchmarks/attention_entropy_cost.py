"""What one `attention_entropy` check costs: today's Gram route against the QR/SVD route it replaced.

Issue 16: at width 512 on an H100 the earlier route (per head, batched thin QRs of [dQ | W_Q] and
[W_K | dK] and an SVD of the 2 d_k x 2 d_k core, all on the GPU) cost 25-118% of a training step.
Today's `delta2_entropy` forms float64 Gram matrices on the weights' device and solves the small
eigenproblems on the host. This times both on the same random weights (12 layers, an update of 1%
of their scale), alternating their order, and reports the medians, their ratio and the largest
difference between their entropies. On a GPU it synchronises before each clock reading.
Run: make bench-attention-entropy (or with DEVICE=cuda)
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from machine import cpu_model

from rksp_cli.monitors.attention_entropy import delta2_entropy, spectral_entropy

LAYERS, REPEATS = 12, 7


def qr_svd_entropy(
    q0: torch.Tensor, k0: torch.Tensor, q1: torch.Tensor, k1: torch.Tensor, n_heads: int
) -> torch.Tensor:
    """The route of releases before the Gram one (multi-head attention, no grouped keys)."""
    d_k = q0.shape[0] // n_heads

    def heads(w: torch.Tensor) -> torch.Tensor:
        return w.float().reshape(n_heads, d_k, -1).transpose(1, 2)

    R_A = torch.linalg.qr(torch.cat([heads(q1 - q0), heads(q0)], dim=2)).R
    R_B = torch.linalg.qr(torch.cat([heads(k0), heads(k1 - k0)], dim=2)).R
    return spectral_entropy(torch.linalg.svdvals(R_A @ R_B.transpose(1, 2)))


def layers(d: int, device: str) -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(LAYERS):
        q0, k0 = (torch.randn(d, d, generator=g) / d**0.5 for _ in range(2))
        q1, k1 = (w + 1e-2 * torch.randn(d, d, generator=g) / d**0.5 for w in (q0, k0))
        out.append(tuple(w.to(device) for w in (q0, k0, q1, k1)))
    return out


ROUTES = {
    "gram": lambda q0, k0, q1, k1, n_heads: delta2_entropy(q0, k0, q1, k1, n_heads, n_heads),
    "qr_svd": qr_svd_entropy,
}


def timed(route: str, weights: list[tuple[torch.Tensor, ...]], n_heads: int, device: str):
    """Seconds for one check of every layer, and the layers' entropies."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = [ROUTES[route](*w, n_heads) for w in weights]
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="where the weights live: cpu or cuda[:N]")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    where = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else cpu_model()
    print(f"{where}, {args.threads} CPU thread(s)")
    print(f"{LAYERS} layers, median of {REPEATS} checks, the routes alternated")
    for d, n_heads in ((128, 4), (512, 8)):
        weights = layers(d, args.device)
        for name in ROUTES:
            timed(name, weights, n_heads, args.device)  # warm-up: first calls load kernels
        seconds: dict[str, list[float]] = {name: [] for name in ROUTES}
        worst = 0.0
        for repeat in range(REPEATS):
            results = {}
            for name in sorted(ROUTES, reverse=bool(repeat % 2)):
                took, results[name] = timed(name, weights, n_heads, args.device)
                seconds[name].append(took)
            pairs = zip(results["gram"], results["qr_svd"], strict=True)
            worst = max(worst, max(float((a.cpu() - b.cpu()).abs().max()) for a, b in pairs))
        gram, qr_svd = (statistics.median(seconds[name]) for name in ("gram", "qr_svd"))
        print(f"  width {d}, {n_heads} heads: Gram {gram * 1e3:.1f} ms, QR/SVD {qr_svd * 1e3:.1f} ms a check")
        print(f"    QR/SVD / Gram {qr_svd / gram:.2f}x; largest entropy difference {worst:.1e}")


if __name__ == "__main__":
    main()
