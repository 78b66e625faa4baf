"""Writing files so that no reader ever sees half of one, and checking before the work that we can."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rksp_cli.errors import InputError


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path``; renamed onto it when the block succeeds, removed if not."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def check_writable(path: Path, what: str) -> None:
    """Fail before the work, not after it: ``path`` is not a folder, and the nearest existing
    folder on its way takes a new file (tried for real, since permission bits say nothing to root
    and nothing about a read-only mount). ``what`` names the option or field in the message."""
    if path.is_dir():
        raise InputError(f"{what} {path}: is a directory; give a file path")
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise InputError(f"{what} {path}: {folder} is not a directory")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".rksp-write-check-"):
            pass
    except OSError as exc:
        raise InputError(f"{what} {path}: cannot write in {folder} ({exc.strerror or type(exc).__name__})") from None
