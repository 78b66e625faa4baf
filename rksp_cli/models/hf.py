"""transformers models: random init from a ``config.json``, or trained weights from a checkpoint.

Nothing here reaches a hub: configs and weights are read from local paths only.
"""

from __future__ import annotations

import inspect
import json
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from torch import nn
from transformers import AutoConfig, AutoModel, PretrainedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from rksp_cli.budget import ModelShape
from rksp_cli.errors import InputError
from rksp_cli.models import BuildOptions, ShapeCheck, Subject
from rksp_cli.models.streaming import (
    BlockStreamer,
    CheckpointWeights,
    RandomInit,
    WeightSource,
    checkpoint_files,
    first_non_finite,
    non_block_parts,
    open_safetensors,
    place,
)

# keep the terminal free of library chatter and loading bars (stdout may hold --json)
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

DEFAULT_SEQ_LEN = 64
STREAM_ABOVE_BYTES = 2 * 2**30  # stream block by block when the fp32 weights exceed 2 GiB (design choice)


def read_config(path: Path) -> PretrainedConfig:
    """A transformers config from a ``config.json`` file, read by transformers' own loader (which
    also decodes its ``{"__float__": "Infinity"}`` values), with errors that name the file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read ({exc.__class__.__name__})") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON (line {exc.lineno})") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise InputError(f"{path}: no 'model_type' field, so transformers cannot tell which architecture it is")
    model_type = data["model_type"]
    if model_type not in CONFIG_MAPPING:
        raise InputError(f"{path}: transformers {transformers.__version__} does not know model_type {model_type!r}")
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # transformers validates configs with several exception types
        raise InputError(f"{path}: not a valid {model_type} config: {_first_line(exc)}") from None
    if getattr(config, "is_encoder_decoder", False):
        raise InputError(
            f"{path}: {model_type} is an encoder-decoder model; rksp screens one stack of residual blocks "
            "(decoder-only or encoder-only models), and its risk model knows no cross-attention"
        )
    return config


def from_config(
    path: Path, seq_len: int | None, init_std: float | None, seed: int, options: BuildOptions, check: ShapeCheck
) -> Subject:
    """Random init from the config's own initializer, seeded per part (see ``streaming``)."""
    config = read_config(path)
    if init_std is not None:
        if not hasattr(config, "initializer_range"):
            raise InputError(f"model.init_std: {config.model_type} configs have no initializer_range to set")
        config.initializer_range = init_std
    model = _meta_model(config, path)
    layout = _layout(model, config, seq_len, options, check, path)
    streamer = _materialize(model, layout, RandomInit(model, seed), options.device)
    return _subject(model, config, layout, options, f"random init from {path}", streamer)


def load_checkpoint(
    path: Path, hf_config: Path | None, seq_len: int | None, options: BuildOptions, check: ShapeCheck
) -> Subject:
    """Trained weights: a Hugging Face directory (sharded or not) or a bare weights file.

    Whole models are loaded by transformers' own ``from_pretrained``, with its key conversions
    (per-expert Mixtral weights, ``bert.`` prefixes, renamed norms). Streamed models are read one
    block at a time by ``CheckpointWeights``, which matches names directly. Weights outside the
    blocks that the checkpoint lacks (a pooler, a head) are initialised and listed in the summary;
    if one of them feeds the first block, the screen stops (see ``_guard_missing``).
    """
    config_path = hf_config or (path if path.is_dir() else path.parent) / "config.json"
    if not path.is_dir() and not config_path.is_file():
        raise InputError(f"{path}: bare weights need a config.json beside them or model.hf_config")
    config = read_config(config_path)
    files = checkpoint_files(path) if path.is_dir() else [path]
    if not options.allow_pickle and any(f.suffix != ".safetensors" for f in files):
        raise InputError(
            f"{path}: pickle checkpoints can run code when loaded; convert to safetensors, "
            "or pass --allow-pickle to load it with weights_only=True"
        )
    model = _meta_model(config, path)
    layout = _layout(model, config, seq_len, options, check, path)
    source = f"checkpoint {path}"
    if layout.stream:
        weights = CheckpointWeights(model, files, layout.name)
        streamer = _materialize(model, layout, weights, options.device)
        _guard_missing(model, layout, weights.missing)
        return _subject(model, config, layout, options, source, streamer, sorted(weights.missing))
    for file in files:  # a corrupt file is named here; transformers would name only the folder
        if file.suffix == ".safetensors":
            open_safetensors(file)
    model, missing = _from_pretrained(path, config)
    if inside := [k for k in missing if k.startswith(f"{layout.name}.")]:
        raise InputError(f"{path}: checkpoint lacks weight {inside[0]!r} of a screened block")
    if bad := first_non_finite(model):
        raise InputError(f"{path}: weight {bad!r} holds NaN or inf values; only finite weights can be screened")
    layout = _layout(model, config, seq_len, options, None, path)
    place(model, options.device)
    _guard_missing(model, layout, missing)
    return _subject(model, config, layout, options, source, None, sorted(missing))


def _from_pretrained(path: Path, config: PretrainedConfig) -> tuple[nn.Module, list[str]]:
    """transformers' own loader; a bare file is linked into a temporary checkpoint directory."""
    with tempfile.TemporaryDirectory(prefix="rksp-") as tmp:
        where = path
        if not path.is_dir():
            where = Path(tmp)
            name = "model.safetensors" if path.suffix == ".safetensors" else "pytorch_model.bin"
            (where / name).symlink_to(path.resolve())
            config.to_json_file(where / "config.json")
        try:
            model, info = AutoModel.from_pretrained(
                where, config=config, dtype=torch.float32, local_files_only=True, output_loading_info=True
            )
        except Exception as exc:
            raise InputError(f"{path}: transformers cannot load these weights: {_first_line(exc)}") from None
    mismatched = info.get("mismatched_keys") or []
    if mismatched:
        raise InputError(f"{path}: checkpoint weight {mismatched[0][0]!r} has a shape the config does not want")
    return model.eval(), list(info.get("missing_keys") or [])


def _guard_missing(model: nn.Module, layout: _Layout, missing: Iterable[str]) -> None:
    """Stop the screen if a module whose weights the checkpoint lacked runs before the first block.

    Such a module (an embedding, say) would feed random numbers into every state the screen reads.
    Modules that run after the blocks (a pooler, a head) never touch h_0 .. h_L, so their absence
    is harmless and only noted.
    """
    owners = {key.rpartition(".")[0] for key in missing}
    if not owners:
        return
    started = [False]

    def first_block(module: nn.Module, args: tuple) -> None:
        started[0] = True

    def guard(name: str):
        def hook(module: nn.Module, args: tuple) -> None:
            if not started[0]:
                raise InputError(f"checkpoint lacks the weights of {name!r}, which feeds the first block")

        return hook

    layout.container[0].register_forward_pre_hook(first_block)
    for name, module in model.named_modules():
        if name in owners:
            module.register_forward_pre_hook(guard(name))


@dataclass
class _Layout:
    """Where a model keeps its residual blocks, its sizes, and whether to stream it."""

    name: str
    container: nn.ModuleList
    n_layers: int
    d_model: int
    vocab_size: int
    seq_len: int
    stream: bool


def _layout(
    model: nn.Module,
    config: PretrainedConfig,
    seq_len: int | None,
    options: BuildOptions,
    check: ShapeCheck | None,
    path: Path,
) -> _Layout:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    n_layers = getattr(text, "num_hidden_layers", None)
    d_model = getattr(text, "hidden_size", None)
    vocab = getattr(text, "vocab_size", None)
    if not n_layers or not d_model or not vocab:
        raise InputError(f"{path}: the config lacks num_hidden_layers, hidden_size or vocab_size")
    name, container = find_blocks(model, n_layers)
    max_pos = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    if seq_len is None:
        seq_len = min(DEFAULT_SEQ_LEN, max_pos) if max_pos else DEFAULT_SEQ_LEN
    elif max_pos and seq_len > max_pos:
        raise InputError(f"model.seq_len: {seq_len} exceeds the model's {max_pos} positions")
    n_params = sum(p.numel() for p in model.parameters())
    stream = options.stream if options.stream is not None else 4 * n_params > STREAM_ABOVE_BYTES
    if check is not None:
        heads = getattr(text, "num_attention_heads", None) or max(1, d_model // 64)
        shape = ModelShape(
            parameters=n_params,
            block_parameters=max(sum(p.numel() for p in block.parameters()) for block in container),
            n_layers=n_layers,
            d_model=d_model,
            vocab_size=vocab,
            seq_len=seq_len,
            n_heads=heads,
            lm_head=False,
            streamed=stream,
        )
        check(shape, str(path))
    return _Layout(name, container, n_layers, d_model, vocab, seq_len, stream)


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


def _materialize(model: nn.Module, layout: _Layout, weights: WeightSource, device: str) -> BlockStreamer | None:
    """Make the non-block parts, then every block now, or each block just before it runs."""
    for part_name, part, recurse in non_block_parts(model, layout.container):
        weights.materialize(part_name, part, recurse)
        place(part, device, recurse)
    blocks = list(layout.container)
    if layout.stream:
        return BlockStreamer(weights, layout.name, blocks, device)
    for i, block in enumerate(blocks):
        weights.materialize(f"{layout.name}.{i}", block)
        place(block, device)
    return None


def _subject(
    model: nn.Module,
    config: PretrainedConfig,
    layout: _Layout,
    options: BuildOptions,
    source: str,
    streamer: BlockStreamer | None,
    missing: list[str] | None = None,
) -> Subject:
    model.eval()
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    device = options.device
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

    blocks = list(layout.container)
    summary = {
        "source": source,
        "architecture": type(model).__name__,
        "model_type": config.model_type,
        "blocks": layout.name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "parameters_per_block": sum(p.numel() for p in layout.container.parameters()) // len(blocks),
        "initializer_range": getattr(text, "initializer_range", None),
        "n_experts": n_experts(text),
        "streamed": layout.stream,
    }
    if missing:
        summary["initialised_not_loaded"] = missing
    return Subject(
        module=model,
        blocks=blocks,
        vocab_size=layout.vocab_size,
        seq_len=layout.seq_len,
        d_model=layout.d_model,
        summary=summary,
        forward=forward,
        load_seconds=streamer.seconds if streamer else None,
    )


def n_experts(config: PretrainedConfig) -> int:
    """Experts per MoE layer under the names transformers configs use; 0 for a dense model."""
    for name in ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 0


def _first_line(exc: BaseException) -> str:
    """The exception's message on one line: its first two non-blank lines (transformers' validation
    errors put the field on the first and the reason on the second)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return " ".join(lines[:2]) if lines else exc.__class__.__name__
