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

from rksp_cli.budget import ModelShape
from rksp_cli.errors import InputError
from rksp_cli.models.gpt import GPT

# Shown the model's shape (and what sets its size) once it is known and before any weight is
# made: the screen's cost check, which raises InputError to stop a build that cannot fit.
ShapeCheck = Callable[[ModelShape, str], None]


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

    @property
    def streamed(self) -> bool:
        """Built one block at a time (its weights are made, and freed, during the forward pass)."""
        return self.load_seconds is not None


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


def build_subject(
    model_spec: Any, seed: int, options: BuildOptions = BuildOptions(), check: ShapeCheck | None = None
) -> Subject:
    """Build (and initialise or load) the model a ``ModelSpec`` describes, deterministically.

    ``check`` sees the model's shape before any weight exists (the model is first built on the
    meta device), so a model that cannot fit is refused before it is allocated.
    """
    torch.manual_seed(seed)
    if model_spec.arch == "gpt":
        cfg = model_spec.gpt_config()
        if check is not None:
            embeddings_dominate = cfg.vocab_size > cfg.n_layers * 12 * cfg.d_model  # vocab x d against 12 d^2 L
            with torch.device("meta"):
                check(
                    gpt_shape(GPT(cfg)), "model.vocab_size" if embeddings_dominate else "model.d_model, model.n_layers"
                )
        return _gpt_subject(GPT(cfg).to(options.device), options.device)
    from rksp_cli.models import hf  # transformers is slow to import; only pay for it when used

    check = check or (lambda shape, fields: None)
    if model_spec.checkpoint is not None:
        return hf.load_checkpoint(model_spec.checkpoint, model_spec.hf_config, model_spec.seq_len, options, check)
    return hf.from_config(model_spec.hf_config, model_spec.seq_len, model_spec.init_std, seed, options, check)


def gpt_shape(model: GPT) -> ModelShape:
    cfg = model.cfg
    return ModelShape(
        parameters=sum(p.numel() for p in model.parameters()),
        block_parameters=sum(p.numel() for p in model.blocks[0].parameters()),
        n_layers=cfg.n_layers,
        d_model=cfg.d_model,
        vocab_size=cfg.vocab_size,
        seq_len=cfg.seq_len,
        n_heads=cfg.n_heads,
        lm_head=True,
        streamed=False,
    )


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
        summary={
            "source": "built-in gpt",
            "architecture": f"GPT ({cfg.norm})",
            "norm": cfg.norm,
            "parameters": n_params,
            "n_experts": cfg.n_experts,
        },
        forward=forward,
    )
