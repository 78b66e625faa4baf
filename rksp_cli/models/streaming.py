"""Materialise a meta-device model part by part, so a 7B screen fits in a few GB of memory.

Models are built on the meta device (no storage). Each part, the non-block modules and then each
residual block, is materialised by a ``WeightSource``: random init from the model's own
initializer, or tensors read lazily from a checkpoint. When streaming, a block is materialised
by a forward pre-hook just before it runs and returned to the meta device right after, so peak
memory is about one block plus the non-block parts and the activations, whatever the depth.

Random init is seeded per part (a hash of the seed and the part's name), so a streamed model and
a fully materialised one get identical weights.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from rksp_cli.errors import InputError

try:  # glibc keeps freed heap pages; without handing them back, RSS creeps up block after block
    _LIBC = ctypes.CDLL("libc.so.6")
except OSError:  # not glibc (macOS, musl): nothing to do
    _LIBC = None


def release_free_memory() -> None:
    """Return freed heap memory to the OS (measured: keeps a 7B screen's peak RSS flat over depth)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


class WeightSource(Protocol):
    def materialize(self, name: str, module: nn.Module, recurse: bool = True) -> None: ...


def part_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") % (2**63)


def _init(model: nn.Module, module: nn.Module, recurse: bool, only_buffer_owners: bool = False) -> None:
    """The model's own ``_init_weights``, children before parents (as transformers applies it)."""
    subs = list(module.modules()) if recurse else [module]
    with torch.no_grad():
        for sub in reversed(subs):
            if only_buffer_owners and not any(True for _ in sub.buffers(recurse=False)):
                continue
            model._init_weights(sub)


class RandomInit:
    """Random init from the config's initializer, one seed per part."""

    def __init__(self, model: nn.Module, seed: int):
        self.model, self.seed = model, seed

    def materialize(self, name: str, module: nn.Module, recurse: bool = True) -> None:
        module.to_empty(device="cpu", recurse=recurse)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(part_seed(self.seed, name))
            _init(self.model, module, recurse)


class CheckpointWeights:
    """Trained weights read per part: safetensors lazily (``safe_open``), pickle with ``weights_only``.

    Names are matched directly (with or without the model's base prefix); transformers' key
    conversions are not applied here, so a block weight the checkpoint names differently is an
    error that says so. Non-persistent buffers (rotary frequencies, masks) are not in checkpoints;
    the modules that own buffers are initialised first, then every parameter and persistent buffer
    is loaded. Weights outside the blocks that the checkpoint lacks keep their init values and are
    listed in ``missing``.
    """

    def __init__(self, model: nn.Module, files: list[Path], blocks: str):
        """``files``: safetensors, or pickles the caller has been allowed to load (``--allow-pickle``)."""
        self.model = model
        self.blocks = f"{blocks}."
        self.prefix = f"{model.base_model_prefix}." if getattr(model, "base_model_prefix", "") else ""
        self.where: dict[str, tuple[Path, str]] = {}  # model key -> (file, checkpoint key)
        self.missing: set[str] = set()
        self._handles: dict[Path, object] = {}
        self._pickled: dict[Path, dict[str, torch.Tensor]] = {}
        for path in files:
            for key in self._keys(path):
                own = key[len(self.prefix) :] if self.prefix and key.startswith(self.prefix) else key
                self.where[own] = (path, key)

    def _keys(self, path: Path) -> list[str]:
        if path.suffix == ".safetensors":
            handle = open_safetensors(path)
            self._handles[path] = handle
            return list(handle.keys())
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:
            raise InputError(f"{path}: cannot load with weights_only=True: {exc}") from None
        self._pickled[path] = state
        return list(state)

    def _tensor(self, key: str) -> torch.Tensor:
        path, ckpt_key = self.where[key]
        if path in self._handles:
            return self._handles[path].get_tensor(ckpt_key)
        return self._pickled[path][ckpt_key]

    def materialize(self, name: str, module: nn.Module, recurse: bool = True) -> None:
        module.to_empty(device="cpu", recurse=recurse)
        _init(self.model, module, recurse, only_buffer_owners=True)
        prefix = f"{name}." if name else ""
        params = dict(module.named_parameters(recurse=recurse))
        persistent = _persistent_buffer_names(module, recurse)
        buffers = {n: b for n, b in module.named_buffers(recurse=recurse) if n in persistent}
        with torch.no_grad():
            for local, tensor in {**params, **buffers}.items():
                key = prefix + local
                if key not in self.where:
                    if local not in params:  # a persistent buffer may be absent: it keeps its init value
                        continue
                    if key.startswith(self.blocks):
                        raise InputError(
                            f"checkpoint lacks weight {key!r} of a screened block; if the checkpoint names it "
                            "differently (per-expert weights, say), screen with --no-stream, which loads "
                            "through transformers' own key conversions"
                        )
                    self.missing.add(key)
                    owner = module.get_submodule(local.rpartition(".")[0])
                    _init(self.model, owner, recurse=False)
                    continue
                value = self._tensor(key)
                if value.shape != tensor.shape:
                    got, want = tuple(value.shape), tuple(tensor.shape)
                    raise InputError(f"checkpoint weight {key!r} has shape {got}; the config wants {want}")
                if value.is_floating_point() and not torch.isfinite(value).all():
                    raise InputError(
                        f"checkpoint weight {self.where[key][1]!r} holds NaN or inf values; only finite weights "
                        "can be screened"
                    )
                tensor.copy_(value)


def open_safetensors(path: Path) -> Any:
    """A lazy handle on a safetensors file (reads its header only), with an error naming the file."""
    from safetensors import safe_open

    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except Exception as exc:
        raise InputError(f"{path}: not a readable safetensors file: {exc}") from None


def first_non_finite(module: nn.Module) -> str | None:
    """The name of the first parameter holding NaN or inf, in the module's own order."""
    for name, param in module.named_parameters():
        if param.is_floating_point() and not torch.isfinite(param).all():
            return name
    return None


def _persistent_buffer_names(module: nn.Module, recurse: bool) -> set[str]:
    names = set()
    for prefix, sub in module.named_modules() if recurse else [("", module)]:
        for b in sub._buffers:
            if b not in sub._non_persistent_buffers_set:
                names.add(f"{prefix}.{b}" if prefix else b)
    return names


def place(module: nn.Module, device: str, recurse: bool = True) -> None:
    """Move a materialised part to ``device``; without ``recurse``, only its own tensors."""
    if device == "cpu":
        return
    if recurse:
        module.to(device)
        return
    for name, param in module._parameters.items():
        if param is not None:
            module._parameters[name] = nn.Parameter(param.to(device), requires_grad=param.requires_grad)
    for name, buffer in module._buffers.items():
        if buffer is not None:
            module._buffers[name] = buffer.to(device)


def checkpoint_files(directory: Path) -> list[Path]:
    """The weight files of a Hugging Face directory: sharded (with an index) or not."""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = directory / index_name
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as exc:
                raise InputError(f"{index}: not a valid shard index ({exc.__class__.__name__})") from None
            return sorted({directory / f for f in weight_map.values()})
    for pattern in ("*.safetensors", "*.bin"):
        files = sorted(directory.glob(pattern))
        if files:
            return files
    raise InputError(f"{directory}: no .safetensors (or .bin) weights found")


def non_block_parts(model: nn.Module, blocks: nn.ModuleList) -> Iterator[tuple[str, nn.Module, bool]]:
    """(name, module, recurse) covering every module outside ``blocks`` exactly once."""

    def walk(prefix: str, module: nn.Module) -> Iterator[tuple[str, nn.Module, bool]]:
        if module is blocks:
            return
        if not any(m is blocks for m in module.modules()):
            yield prefix, module, True
            return
        yield prefix, module, False  # its own parameters and buffers only
        for child_name, child in module.named_children():
            yield from walk(f"{prefix}.{child_name}" if prefix else child_name, child)

    yield from walk("", model)


class BlockStreamer:
    """Forward hooks that materialise each block before it runs and free it after."""

    def __init__(self, source: WeightSource, blocks_name: str, blocks: list[nn.Module], device: str = "cpu"):
        self.device = device
        self.seconds: list[float] = [0.0] * len(blocks)
        self.handles = []
        for i, block in enumerate(blocks):
            self.handles.append(block.register_forward_pre_hook(self._load(source, f"{blocks_name}.{i}", i)))
            self.handles.append(block.register_forward_hook(self._free))

    @staticmethod
    def _free(module: nn.Module, args: tuple, output: object) -> None:
        module.to("meta")  # drops the block's storage; returning None keeps the block's output
        release_free_memory()

    def _load(self, source: WeightSource, name: str, index: int):
        def hook(module: nn.Module, args: tuple) -> None:
            t = time.perf_counter()
            source.materialize(name, module)
            place(module, self.device)
            self.seconds[index] = time.perf_counter() - t

        return hook
