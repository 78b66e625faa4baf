"""Built-in training tasks for probes: the RKSP paper's two (App. D.1, D.2) and character-level LM.

Each task draws fresh batches from a seeded generator (an endless stream, rather than the
paper's fixed 20K training sequences: a short probe sees each sequence once either way).
A batch is ``(inputs, targets)`` of shape (batch, seq_len); targets are -100 where no loss is taken.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from rksp_cli.data import load_token_ids
from rksp_cli.errors import InputError

IGNORE = -100
TASKS = ("synthetic_lm", "assoc_recall")


class Task(Protocol):
    def batch(self, size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]: ...


class AssociativeRecall:
    """[k1, v1, ..., k4, v4, fillers..., q] -> value of q, loss on the last position only.

    Design choices (the paper gives neither): keys from the lower half of the vocabulary, values
    from the upper half, fillers uniform over the whole vocabulary.
    """

    pairs = 4

    def __init__(self, vocab_size: int, seq_len: int):
        if seq_len < 2 * self.pairs + 1:
            raise InputError(f"training.task: assoc_recall needs seq_len >= {2 * self.pairs + 1}, got {seq_len}")
        if vocab_size < 2 * self.pairs:
            raise InputError(f"training.task: assoc_recall needs vocab_size >= {2 * self.pairs}, got {vocab_size}")
        self.vocab_size, self.seq_len = vocab_size, seq_len

    def batch(self, size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        half = self.vocab_size // 2
        keys = torch.rand(size, half, generator=generator).argsort(dim=1)[:, : self.pairs]  # distinct keys
        values = torch.randint(half, self.vocab_size, (size, self.pairs), generator=generator)
        seq = torch.randint(0, self.vocab_size, (size, self.seq_len), generator=generator)
        seq[:, 0 : 2 * self.pairs : 2] = keys
        seq[:, 1 : 2 * self.pairs : 2] = values
        which = torch.randint(0, self.pairs, (size,), generator=generator)
        rows = torch.arange(size)
        seq[:, -1] = keys[rows, which]
        targets = torch.full_like(seq, IGNORE)
        targets[:, -1] = values[rows, which]
        return seq, targets


class SyntheticLM:
    """Concatenated segments over tokens {10, ..., V-1}: repetition, sequential runs, i.i.d.

    Repetition: a pattern of length 2-5 repeated 2-4 times; sequential: consecutive ids (wrapping),
    length 5-15; i.i.d.: length 5-15. Segment kinds are equally likely (design choice: the paper
    gives no mixture). Next-token cross-entropy on every position.
    """

    low = 10

    def __init__(self, vocab_size: int, seq_len: int):
        if vocab_size < self.low + 8:
            raise InputError(f"training.task: synthetic_lm needs vocab_size >= {self.low + 8}, got {vocab_size}")
        self.vocab_size, self.seq_len = vocab_size, seq_len

    def _sequence(self, g: torch.Generator) -> torch.Tensor:
        def draw(lo: int, hi: int) -> int:  # uniform in [lo, hi]
            return int(torch.randint(lo, hi + 1, (1,), generator=g))

        span = self.vocab_size - self.low
        parts, n = [], 0
        while n < self.seq_len + 1:
            kind = draw(0, 2)
            if kind == 0:
                part = torch.randint(0, span, (draw(2, 5),), generator=g).repeat(draw(2, 4))
            elif kind == 1:
                part = (draw(0, span - 1) + torch.arange(draw(5, 15))) % span
            else:
                part = torch.randint(0, span, (draw(5, 15),), generator=g)
            parts.append(part)
            n += part.numel()
        return torch.cat(parts)[: self.seq_len + 1] + self.low

    def batch(self, size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        seqs = torch.stack([self._sequence(generator) for _ in range(size)])
        return seqs[:, :-1], seqs[:, 1:]


class CharLM:
    """Next-character prediction on windows of a text file (or next-token on a .npy id file)."""

    def __init__(self, path: Path, vocab_size: int, seq_len: int):
        self.ids = load_token_ids(path, vocab_size)
        if self.ids.numel() < seq_len + 2:
            raise InputError(f"training.task: {path} holds {self.ids.numel()} tokens, too few for seq_len={seq_len}")
        self.seq_len = seq_len

    def batch(self, size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, self.ids.numel() - self.seq_len, (size,), generator=generator)
        windows = torch.stack([self.ids[s : s + self.seq_len + 1] for s in starts.tolist()])
        return windows[:, :-1], windows[:, 1:]


def make_task(name: str, vocab_size: int, seq_len: int) -> Task:
    """``synthetic_lm``, ``assoc_recall``, or a path to a text/.npy file for character-level LM."""
    if name == "synthetic_lm":
        return SyntheticLM(vocab_size, seq_len)
    if name == "assoc_recall":
        return AssociativeRecall(vocab_size, seq_len)
    path = Path(name)
    if not path.is_file():
        raise InputError(f"training.task: must be one of {', '.join(TASKS)} or a text file; {name} does not exist")
    return CharLM(path, vocab_size, seq_len)
