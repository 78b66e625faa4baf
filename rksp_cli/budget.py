"""What a screen will cost, estimated from the model's shape before any weight is made.

A screen of a config that cannot fit (d_model 10**6, probe.tokens 10**9, a 70B model without
streaming on a laptop) must be refused in a second with the field to change, not crash after
minutes of allocation. The model is first built on the meta device (no storage), which gives its
exact parameter counts; the estimate below turns them into peak memory and wall time.

The estimate is deliberately simple and says so ("≈"): memory is the sum of the largest terms
(weights, one block's activations, the captured states, the DMD's matrices, plus the interpreter
and its libraries); time is floating-point work over a throughput, which scales with the torch
thread count for the forward pass. It errs long: measured screens took 0.6-1.06x the estimated
time and 0.5-0.9x the estimated memory (README, "What a screen will cost").
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

from rksp_cli.errors import InputError

# Throughputs, measured on a 2-core AMD EPYC VM (README, "What a screen will cost"), rounded down so that the
# estimate errs long: forward passes ran at 35-50 GFLOP/s per thread, the DMD's float64 eig/SVD work
# at 15-23 GFLOP/s (LAPACK's eig barely scales with threads), random init at 50-95 M parameters/s.
RUNTIME_BYTES = 0.6e9  # Python, torch and transformers loaded, before any model (measured: ~450 MB RSS)
MATMUL_FLOPS_PER_THREAD = 3.5e10
EIG_FLOPS = 2.0e10
INIT_PARAMETERS_PER_SECOND = 5.0e7
STARTUP_SECONDS = 1.0  # the token batch and the first kernels of a tiny screen
ETA_TOKENS = 2048  # koopman.DMDSettings.eta_tokens, kept here so that the estimate needs no torch (a test checks)
DEFAULT_MAX_MINUTES = 60.0


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs to know about a model; counted on the meta device."""

    parameters: int
    block_parameters: int  # of the largest block
    n_layers: int
    d_model: int
    vocab_size: int
    seq_len: int
    n_heads: int
    lm_head: bool  # the forward pass computes vocabulary logits (the built-in GPT)
    streamed: bool  # one block materialised at a time


@dataclass(frozen=True)
class Cost:
    """Estimated peak memory and wall time of one screen, and the config field that drives each."""

    memory_bytes: float
    seconds: float
    memory_driver: str
    time_driver: str
    shape: ModelShape

    def describe(self) -> str:
        s = self.shape
        streamed = ", streamed" if s.streamed else ""
        return (
            f"{_count(s.parameters)} parameters, {s.n_layers} blocks, d={s.d_model}{streamed}: "
            f"≈ {_bytes(self.memory_bytes)} peak memory, ≈ {_duration(self.seconds)}"
        )


def concurrent_transitions(threads: int, device: str = "cpu") -> int:
    """How many transitions the screen profiles at once: two on a CPU with two or more torch threads,
    else one.

    Why: a transition's eigenvalue solve (LAPACK's Hessenberg QR) runs on one core whatever the
    thread count, so a serial DMD leaves the second core idle for almost half its time. Measured
    on a 2-core AVX-512 EPYC at d = 768, N = 2048: 0.29 s per transition one after another on 2
    threads, 0.215 s two at a time on 1 thread each (0.43 s for one alone on 1 thread). Design
    choice: two, not one per thread, to bound the memory (each holds its own Gram matrix and
    products); on a GPU the solves queue on one device, so one. Here, not in the screen, so that
    the cost estimate counts the same rule without importing torch."""
    return 2 if device == "cpu" and threads >= 2 else 1


def screen_cost(shape: ModelShape, tokens: int, threads: int | None = None, training: bool = False) -> Cost:
    """Peak memory and time of a screen on ``tokens`` token states.

    ``training``: the model will also be trained (``rksp probe``), which holds gradients and two
    Adam moments beside the weights: memory for the weights counts four times. (The probe's own
    training time depends on its steps and is not part of this estimate.)
    """
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    s = shape
    batch_tokens = math.ceil(tokens / s.seq_len) * s.seq_len
    sequences = batch_tokens // s.seq_len
    r = min(s.d_model, tokens)
    weights = 4.0 * (s.parameters - (s.n_layers - 2) * s.block_parameters if s.streamed else s.parameters)
    weights *= 4 if training else 1
    # a block's widest activations: about (its parameters / d) features per token, plus attention scores
    activations = 4.0 * batch_tokens * (s.block_parameters / s.d_model + 4 * s.d_model)
    activations += 8.0 * sequences * s.n_heads * s.seq_len**2
    logits = 12.0 * batch_tokens * s.vocab_size if s.lm_head else 0.0
    states = 10 * 8.0 * tokens * s.d_model  # h_l, h_l+1, their copies while whitening (float64)
    dmd = 12 * 16.0 * r * r  # Gram matrix, operator, eigenvectors and their inverse (complex128)
    # a second transition profiled at once: measured +50% of this term at GPT-2 124M (d = 768), +12% at
    # LLaMA-2-7B (d = 4096, N = 2048); take +50% (on a GPU, where it is one at a time, this errs long)
    spectra_memory = (states + dmd) * (1.5 if concurrent_transitions(threads) == 2 else 1.0)
    memory = {"weights": weights, "activations": activations, "logits": logits, "spectra": spectra_memory}
    # init (random, or reading a checkpoint) at a parameter rate, the forward pass at a matmul rate
    forward = 2.0 * batch_tokens * (s.n_layers * s.block_parameters + (s.d_model * s.vocab_size if s.lm_head else 0))
    forward += 4.0 * batch_tokens * s.seq_len * s.d_model * s.n_layers
    spectra = s.n_layers * (6.0 * s.d_model * tokens * r + 30.0 * r**3)
    if tokens > ETA_TOKENS and s.d_model < ETA_TOKENS - 1:  # eta_nl refitted on groups of ~ETA_TOKENS states
        groups = math.ceil(tokens / ETA_TOKENS)
        spectra += s.n_layers * groups * (6.0 * s.d_model * ETA_TOKENS * s.d_model + 10.0 * s.d_model**3)
    model_seconds = s.parameters / INIT_PARAMETERS_PER_SECOND + forward / (MATMUL_FLOPS_PER_THREAD * threads)
    spectra_seconds = spectra / EIG_FLOPS
    return Cost(
        memory_bytes=RUNTIME_BYTES + sum(memory.values()),
        seconds=STARTUP_SECONDS + model_seconds + spectra_seconds,
        memory_driver=_driver(max(memory, key=memory.get)),
        time_driver="probe.tokens" if spectra_seconds > model_seconds else "model size",
        shape=shape,
    )


def _driver(term: str) -> str:
    return {
        "weights": "model size",
        "activations": "probe.tokens and model.seq_len",
        "logits": "model.vocab_size",
        "spectra": "probe.tokens",
    }[term]


@dataclass(frozen=True)
class Budget:
    """Limits a screen must fit before it starts; ``force`` runs it anyway (the estimate is rough)."""

    memory_bytes: float | None = None  # None: what this machine has available now
    seconds: float | None = DEFAULT_MAX_MINUTES * 60
    force: bool = False
    notify: Callable[[Cost], None] | None = None  # shown the estimate before the work starts

    def check(self, cost: Cost, model_fields: str) -> None:
        """Raise ``InputError`` naming the field to change when ``cost`` does not fit.

        ``model_fields`` names what sets the model's size (``model.d_model, model.n_layers`` for the
        built-in GPT, the config file for a transformers model).
        """
        if not self.force:
            self._refuse_if_over(cost, model_fields)
        if self.notify is not None:
            self.notify(cost)

    def _refuse_if_over(self, cost: Cost, model_fields: str) -> None:
        limit = self.memory_bytes if self.memory_bytes is not None else available_memory()
        if limit is not None and cost.memory_bytes > limit:
            field = model_fields if cost.memory_driver == "model size" else cost.memory_driver
            raise InputError(
                f"{field}: this screen needs ≈ {_bytes(cost.memory_bytes)} of memory and "
                f"{_bytes(limit)} is available ({cost.describe()}); make it smaller, or pass --force"
            )
        if self.seconds is not None and cost.seconds > self.seconds:
            field = model_fields if cost.time_driver == "model size" else cost.time_driver
            raise InputError(
                f"{field}: this screen would take ≈ {_duration(cost.seconds)}, over the "
                f"{_duration(self.seconds)} limit; raise --max-minutes, or pass --force"
            )


def available_memory() -> float | None:
    """Bytes the kernel says a new allocation can use now (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _count(n: float) -> str:
    if n >= 1e15:
        return f"{n:.3g}"
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(int(n))


def _bytes(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n / 1e3:.3g} kB"


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.3g} h"
    if seconds >= 60:
        return f"{seconds / 60:.3g} min"
    return f"{max(seconds, 0.1):.2g} s"
