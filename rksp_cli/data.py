"""Token batches for the screen's forward pass: random tokens, a text file, or a token file."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from rksp_cli.errors import InputError


def screen_batch(source: str, n_tokens: int, vocab_size: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    """ceil(N / seq_len) sequences of ``seq_len`` token ids, so N states can be drawn from them.

    ``source`` is ``"random"`` (uniform ids) or a file: ``.npy`` (1-D integer token ids) or any
    other file read as UTF-8 text, tokenised character-level (sorted unique characters, as
    nanoGPT's shakespeare_char does). Windows start at random offsets in the file.
    """
    batch = math.ceil(n_tokens / seq_len)
    if source == "random":
        return torch.randint(0, vocab_size, (batch, seq_len), generator=generator)
    ids = load_token_ids(Path(source), vocab_size)
    if ids.numel() < seq_len:
        raise InputError(f"probe.input: {source} holds {ids.numel()} tokens, fewer than seq_len={seq_len}")
    starts = torch.randint(0, ids.numel() - seq_len + 1, (batch,), generator=generator)
    return torch.stack([ids[s : s + seq_len] for s in starts.tolist()])


def load_token_ids(path: Path, vocab_size: int) -> torch.Tensor:
    """A 1-D tensor of token ids in [0, vocab_size)."""
    if path.suffix == ".npy":
        try:
            arr = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InputError(f"probe.input: {path} is not a readable .npy array ({exc})") from None
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise InputError(f"probe.input: {path} must hold a 1-D integer array, got {arr.dtype} of shape {arr.shape}")
        ids = torch.from_numpy(arr.astype(np.int64))
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
            raise InputError(f"probe.input: {path} has token ids outside [0, {vocab_size})")
        return ids
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"probe.input: {path} is neither UTF-8 text nor a .npy token array") from None
    chars = sorted(set(text))
    if len(chars) > vocab_size:
        raise InputError(f"probe.input: {path} has {len(chars)} distinct characters, more than vocab_size={vocab_size}")
    index = {c: i for i, c in enumerate(chars)}
    return torch.tensor([index[c] for c in text], dtype=torch.int64)
