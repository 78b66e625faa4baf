"""Which normalisation a residual block uses, read off one forward pass of any model.

The risk model's depth slope differs between normalisation families (README, "The risk number"),
and a transformers config does not say where its norms sit: LLaMA registers its norms after its
attention and MLP, BERT normalises after the residual sum, GPT-2 before each branch. So the
family is observed, not looked up: during the first forward pass of block 0,

* **pre-norm** when the first normalisation the block runs reads the block's own input (the
  residual stream), before any linear map; ``rms`` if that norm does not centre its input
  (RMSNorm: shifting every feature by one constant changes its output), else ``pre``;
* **post** when the block's output is the output of its last normalisation (Post-LN: the stream
  itself is normalised, as in BERT and DeepNet);
* **none** when the block runs no normalisation at all;
* ``None`` (not recognised) otherwise, e.g. norms only on the branch outputs (OLMo-2); the risk
  model then applies its shared depth slope alone and the screen says so.

A normalisation is a module whose class name contains "norm" (LayerNorm, RMSNorm, T5LayerNorm,
...). The names are those of ``rksp_cli.models.gpt.NORMS``, so built-in and transformers models
share one vocabulary.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle


def _tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, (tuple, list)) and value:
        value = value[0]
    return value if isinstance(value, torch.Tensor) else None


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return False
    return a is b or (a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b)))


def is_norm(module: nn.Module) -> bool:
    return "norm" in type(module).__name__.lower()


def centres(norm: nn.Module, x: torch.Tensor) -> bool | None:
    """Whether ``norm`` removes the mean over features (LayerNorm) or not (RMSNorm); None if it
    cannot be called on one row of its own input."""
    row = x.reshape(-1, x.shape[-1])[:1]
    shift = 3.0 * (row.float().std() + 1.0)
    try:
        with torch.no_grad():
            a, b = norm.forward(row), norm.forward(row + shift.to(row.dtype))
    except Exception:  # a norm with a signature of its own: leave the family untold
        return None
    a, b = _tensor(a), _tensor(b)
    if a is None or b is None:
        return None
    tolerance = 1e-3 * float(a.float().abs().max()) + 1e-6  # LayerNorm is exactly shift-invariant up to round-off
    return bool((a.float() - b.float()).abs().max() <= tolerance)


class NormFinder:
    """Hooks block 0 for one forward pass; ``family`` is then one of ``gpt.NORMS`` or None.

    Use as a context manager around the first forward pass. The hooks remove themselves when
    block 0 returns, so later passes pay nothing; the tensors held meanwhile are block 0's input
    and its last norm's output, already alive during that block.
    """

    def __init__(self, block: nn.Module):
        self.block = block
        self.family: str | None = None
        self._input: torch.Tensor | None = None
        self._first: torch.Tensor | None = None  # the input of the first norm run
        self._centred: bool | None = None  # whether that norm centres (asked while its weights exist)
        self._linear_first = False  # a linear map ran before any norm
        self._last_norm_output: torch.Tensor | None = None
        self._handles: list[RemovableHandle] = []

    def __enter__(self) -> NormFinder:
        self._handles.append(self.block.register_forward_pre_hook(self._block_in, with_kwargs=True))
        self._handles.append(self.block.register_forward_hook(self._block_out))
        for module in self.block.modules():
            if module is self.block:
                continue
            if is_norm(module):
                self._handles.append(module.register_forward_pre_hook(self._norm_in))
                self._handles.append(module.register_forward_hook(self._norm_out))
            elif isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D":  # GPT-2's linear maps
                self._handles.append(module.register_forward_pre_hook(self._linear_in))
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._release()

    def _release(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._input = self._first = self._last_norm_output = None

    def _block_in(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._input = _tensor(args) if args else _tensor(kwargs.get("hidden_states"))

    def _linear_in(self, module: nn.Module, args: tuple) -> None:
        if self._first is None:
            self._linear_first = True

    def _norm_in(self, module: nn.Module, args: tuple) -> None:
        x = _tensor(args)
        if self._first is None and x is not None:
            # now, not when the block returns: a streamed block's weights are freed by then
            self._first, self._centred = x, centres(module, x)

    def _norm_out(self, module: nn.Module, args: tuple, output: Any) -> None:
        self._last_norm_output = _tensor(output)

    def _block_out(self, module: nn.Module, args: tuple, output: Any) -> None:
        self.family = self._classify(_tensor(output))
        self._release()

    def _classify(self, output: torch.Tensor | None) -> str | None:
        if self._first is None:
            return "none"
        if not self._linear_first and _same(self._first, self._input):
            return None if self._centred is None else ("pre" if self._centred else "rms")
        if _same(output, self._last_norm_output):
            return "post"
        return None
