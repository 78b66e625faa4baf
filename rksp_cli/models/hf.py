"""transformers models: random init from a ``config.json``, or trained weights from a checkpoint.

Nothing here reaches a hub: configs and weights are read from local paths only.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import torch
import transformers
from torch import nn
from transformers import AutoConfig, AutoModel, PretrainedConfig

from rksp_cli.errors import InputError
from rksp_cli.models import BuildOptions, Subject
from rksp_cli.models.streaming import (
    BlockStreamer,
    CheckpointWeights,
    RandomInit,
    WeightSource,
    checkpoint_files,
    non_block_parts,
    place,
)

# keep the terminal free of library chatter and loading bars (stdout may hold --json)
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

DEFAULT_SEQ_LEN = 64
STREAM_ABOVE_BYTES = 2 * 2**30  # stream block by block when the fp32 weights exceed 2 GiB (design choice)


def read_config(path: Path) -> PretrainedConfig:
    """A transformers config from a ``config.json`` file, with errors that name the file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read ({exc.__class__.__name__})") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON (line {exc.lineno})") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise InputError(f"{path}: no 'model_type' field, so transformers cannot tell which architecture it is")
    model_type = data.pop("model_type")
    try:
        return AutoConfig.for_model(model_type, **data)
    except (ValueError, KeyError, TypeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
        if "Unrecognized model identifier" in first:
            first = f"transformers {transformers.__version__} does not know model_type {model_type!r}"
        raise InputError(f"{path}: {first}") from None


def from_config(path: Path, seq_len: int | None, init_std: float | None, seed: int, options: BuildOptions) -> Subject:
    """Random init from the config's own initializer, seeded per part (see ``streaming``)."""
    config = read_config(path)
    if init_std is not None:
        if not hasattr(config, "initializer_range"):
            raise InputError(f"model.init_std: {config.model_type} configs have no initializer_range to set")
        config.initializer_range = init_std
    model = _meta_model(config, path)
    return _subject(model, config, RandomInit(model, seed), seq_len, options, source=f"random init from {path}")


def load_checkpoint(path: Path, hf_config: Path | None, seq_len: int | None, options: BuildOptions) -> Subject:
    """Trained weights, read per block: a Hugging Face directory (sharded or not) or a bare file."""
    if path.is_dir():
        config = read_config(hf_config or path / "config.json")
        files = checkpoint_files(path)
    else:
        config_path = hf_config or path.parent / "config.json"
        if not config_path.is_file():
            raise InputError(f"{path}: bare weights need a config.json beside them or model.hf_config")
        config = read_config(config_path)
        files = [path]
    model = _meta_model(config, path)
    weights = CheckpointWeights(model, files, options.allow_pickle)
    return _subject(model, config, weights, seq_len, options, source=f"checkpoint {path}")


def _meta_model(config: PretrainedConfig, path: Path) -> nn.Module:
    try:
        with torch.device("meta"):
            return AutoModel.from_config(config)
    except Exception as exc:  # transformers raises many types for configs it cannot build
        raise InputError(f"{path}: transformers cannot build a model from it: {_first_line(exc)}") from None


def find_blocks(model: nn.Module, n_layers: int) -> tuple[str, nn.ModuleList]:
    """The ModuleList of ``n_layers`` residual blocks: the largest such list in the model."""
    candidates = [
        (name, mod) for name, mod in model.named_modules() if isinstance(mod, nn.ModuleList) and len(mod) == n_layers
    ]
    if not candidates:
        seen = ", ".join(
            f"{n or '<root>'} ({len(m)})" for n, m in model.named_modules() if isinstance(m, nn.ModuleList)
        )
        raise InputError(
            f"cannot find the residual blocks of {type(model).__name__}: looked for a ModuleList of "
            f"num_hidden_layers={n_layers} modules; module lists present: {seen or 'none'}"
        )
    return max(candidates, key=lambda c: sum(p.numel() for p in c[1].parameters()))


def _subject(
    model: nn.Module,
    config: PretrainedConfig,
    weights: WeightSource,
    seq_len: int | None,
    options: BuildOptions,
    source: str,
) -> Subject:
    model.eval()
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    n_layers = getattr(text, "num_hidden_layers", None)
    d_model = getattr(text, "hidden_size", None)
    vocab = getattr(text, "vocab_size", None)
    if not n_layers or not d_model or not vocab:
        raise InputError(f"{source}: the config lacks num_hidden_layers, hidden_size or vocab_size")
    name, container = find_blocks(model, n_layers)
    max_pos = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    if seq_len is None:
        seq_len = min(DEFAULT_SEQ_LEN, max_pos) if max_pos else DEFAULT_SEQ_LEN
    elif max_pos and seq_len > max_pos:
        raise InputError(f"model.seq_len: {seq_len} exceeds the model's {max_pos} positions")

    n_params = sum(p.numel() for p in model.parameters())
    block_params = sum(p.numel() for p in container.parameters())
    stream = options.stream if options.stream is not None else 4 * n_params > STREAM_ABOVE_BYTES
    device = options.device
    for part_name, part, recurse in non_block_parts(model, container):
        weights.materialize(part_name, part, recurse)
        place(part, device, recurse)
    blocks = list(container)
    streamer = None
    if stream:
        streamer = BlockStreamer(weights, name, blocks, device)
    else:
        for i, block in enumerate(blocks):
            weights.materialize(f"{name}.{i}", block)
            place(block, device)

    # A decoder's KV cache would hold every layer's keys and values until the pass ends (about
    # 70 MB per layer for a 7B model at 2048 tokens): the screen never decodes, so turn it off.
    no_cache = {"use_cache": False} if "use_cache" in inspect.signature(model.forward).parameters else {}

    def forward(ids: torch.Tensor) -> None:
        try:
            model(input_ids=ids.to(device), **no_cache)
        except InputError:
            raise
        except Exception as exc:
            raise InputError(f"{type(model).__name__} forward pass failed: {_first_line(exc)}") from None

    return Subject(
        module=model,
        blocks=blocks,
        vocab_size=vocab,
        seq_len=seq_len,
        d_model=d_model,
        summary={
            "source": source,
            "architecture": type(model).__name__,
            "model_type": config.model_type,
            "blocks": name,
            "parameters": n_params,
            "parameters_per_block": block_params // len(blocks),
            "initializer_range": getattr(text, "initializer_range", None),
            "streamed": stream,
        },
        forward=forward,
        load_seconds=streamer.seconds if streamer else None,
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else exc.__class__.__name__
