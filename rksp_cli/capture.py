"""Read the residual stream h_0 .. h_L with forward hooks, at a fixed sample of token positions.

Hooks, not ``output_hidden_states``: transformers applies the final norm to the last entry of
``hidden_states``, and the paper's h_L is the stream before that norm (method reference 1.1).
h_0 is the input of the first block (a forward pre-hook), so it is exactly what the blocks see:
embeddings after any scaling or embedding norm the architecture applies.

Only the sampled token states are read, on the CPU, in the model's precision (float32 at least:
a bfloat16 stream is widened exactly); with a consumer callback only one or two of them are alive at
a time. The spectra are computed in float64 from them, with products in float32 where the states
were float32 and that resolves them (``koopman._gram_eigh``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


def sample_positions(n_positions: int, n_tokens: int, generator: torch.Generator) -> torch.Tensor:
    """N flat (batch x position) indices drawn without replacement (App. D.3)."""
    if n_tokens > n_positions:
        raise ValueError(f"cannot sample {n_tokens} token states from {n_positions} positions")
    return torch.randperm(n_positions, generator=generator)[:n_tokens]


@dataclass
class Capture:
    states: list[torch.Tensor]  # h_0 .. h_L at the sampled positions, each (N, d) (empty with on_state)
    result: Any  # what ``forward`` returned
    block_seconds: list[float]  # wall time of each block's forward


def capture_residual_stream(
    blocks: Sequence[nn.Module],
    forward: Callable[[], Any],
    positions: torch.Tensor,
    on_state: Callable[[int, torch.Tensor], None] | None = None,
) -> Capture:
    """Run ``forward`` once, no grad, reading the residual stream at ``positions``.

    With ``on_state(index, h)``, each state is handed over as soon as it exists and not kept, so a
    consumer that needs only h_l and h_{l+1} at a time holds O(N d) memory instead of O(L N d).
    An exception raised by ``on_state`` propagates as itself, not as a failure of the model.
    """
    kept: list[torch.Tensor | None] = [None] * (len(blocks) + 1)
    seen = [False] * (len(blocks) + 1)
    started = [0.0] * len(blocks)
    seconds = [0.0] * len(blocks)
    failures: list[BaseException] = []

    def take(h: Any, where: str) -> torch.Tensor:
        if isinstance(h, (tuple, list)):
            h = h[0]
        if not isinstance(h, torch.Tensor) or h.ndim != 3:
            raise RuntimeError(f"{where}: expected a (batch, positions, d) hidden-state tensor, got {type(h).__name__}")
        state = h.detach().reshape(-1, h.shape[-1])[positions.to(h.device)]
        return state.to("cpu", torch.promote_types(state.dtype, torch.float32))

    def deliver(index: int, state: torch.Tensor) -> None:
        seen[index] = True
        if on_state is None:
            kept[index] = state
            return
        try:
            on_state(index, state)
        except BaseException as exc:
            failures.append(exc)
            raise

    def before_first(module: nn.Module, args: tuple, kwargs: dict) -> None:
        deliver(0, take(args[0] if args else kwargs["hidden_states"], "input of block 0"))

    def before(index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple) -> None:
            started[index] = time.perf_counter()

        return hook

    def after(index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            seconds[index] = time.perf_counter() - started[index]
            deliver(index + 1, take(output, f"output of block {index}"))

        return hook

    handles = [blocks[0].register_forward_pre_hook(before_first, with_kwargs=True)]
    handles += [block.register_forward_pre_hook(before(i)) for i, block in enumerate(blocks)]
    handles += [block.register_forward_hook(after(i)) for i, block in enumerate(blocks)]
    try:
        with torch.no_grad():
            result = forward()
    except BaseException:
        if failures:  # the consumer failed, not the model: surface its own error
            raise failures[0] from None
        raise
    finally:
        for handle in handles:
            handle.remove()
    missing = [i for i, s in enumerate(seen) if not s]
    if missing:
        raise RuntimeError(f"the forward pass never reached residual states {missing}")
    return Capture([s for s in kept if s is not None], result, seconds)
