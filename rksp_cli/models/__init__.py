"""Model builders: turn a ``ModelSpec`` into a ``Subject``, a model the screen can run.

A ``Subject`` hides where the model came from (built-in GPT, transformers config, checkpoint):
the capture only needs the ordered residual blocks and a way to run one forward pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from rksp_cli.errors import InputError
from rksp_cli.models.gpt import GPT


@dataclass
class Subject:
    """A model at the state to be screened, with what the screen needs to know about it."""

    module: nn.Module
    blocks: list[nn.Module]  # residual blocks in order; h_{l+1} is block l's output
    vocab_size: int
    seq_len: int
    d_model: int
    summary: dict[str, Any] = field(default_factory=dict)  # what was built, for the report
    # Runs one forward pass on token ids; returns the mean next-token loss where the model has an
    # LM head (the built-in GPT), else None.
    forward: Callable[[torch.Tensor], torch.Tensor | None] = lambda ids: None
    # Streaming only: seconds spent materialising each block (filled during the forward pass).
    load_seconds: list[float] | None = None

    @property
    def n_layers(self) -> int:
        return len(self.blocks)


@dataclass(frozen=True)
class BuildOptions:
    """How to build a model, not which: none of these changes the numbers a screen reports."""

    allow_pickle: bool = False  # load .bin/.pt checkpoints (with weights_only=True)
    stream: bool | None = None  # transformers models: one block at a time; None decides by size
    device: str = "cpu"  # where the forward pass and the DMD run; weights are made on the CPU first

    def __post_init__(self) -> None:
        if self.device != "cpu" and not (self.device.startswith("cuda") and torch.cuda.is_available()):
            raise InputError(
                f"--device {self.device}: no such device here (CUDA available: {torch.cuda.is_available()})"
            )


def build_subject(model_spec: Any, seed: int, options: BuildOptions = BuildOptions()) -> Subject:
    """Build (and initialise or load) the model a ``ModelSpec`` describes, deterministically."""
    torch.manual_seed(seed)
    if model_spec.arch == "gpt":
        return _gpt_subject(GPT(model_spec.gpt_config()).to(options.device), options.device)
    from rksp_cli.models import hf  # transformers is slow to import; only pay for it when used

    if model_spec.checkpoint is not None:
        return hf.load_checkpoint(model_spec.checkpoint, model_spec.hf_config, model_spec.seq_len, options)
    return hf.from_config(model_spec.hf_config, model_spec.seq_len, model_spec.init_std, seed, options)


def _gpt_subject(model: GPT, device: str) -> Subject:
    cfg = model.cfg
    model.eval()

    def forward(ids: torch.Tensor) -> torch.Tensor:
        # next-token loss on the batch itself; the last position has no target
        ids = ids.to(device)
        targets = torch.full_like(ids, -100)
        targets[:, :-1] = ids[:, 1:]
        return model(ids, targets)[1]

    n_params = sum(p.numel() for p in model.parameters())
    return Subject(
        module=model,
        blocks=list(model.blocks),
        vocab_size=cfg.vocab_size,
        seq_len=cfg.seq_len,
        d_model=cfg.d_model,
        summary={"source": "built-in gpt", "architecture": f"GPT ({cfg.norm})", "parameters": n_params},
        forward=forward,
    )
