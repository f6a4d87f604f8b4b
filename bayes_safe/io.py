"""Whole-or-nothing output: files are written to a temporary name and renamed into place."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["atomic_output_dir", "atomic_write", "atomic_write_json", "atomic_write_text"]


@contextlib.contextmanager
def atomic_output_dir(out: str | os.PathLike):
    """Yield a scratch directory; on success move its files into ``out``, on failure leave ``out`` untouched.

    Each file is moved with ``os.replace`` (atomic on one file system), so a reader of ``out``
    never sees a half-written file, and a run that raises adds nothing to ``out``.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(tmp.rglob("*")):
        target = out / path.relative_to(tmp)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
    shutil.rmtree(tmp, ignore_errors=True)


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` to a temporary file beside ``path`` (same suffix, so writers that read the
    format from it still work), then rename it onto ``path``; if ``write`` raises, remove it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; outputs are meant to be read
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=float) + "\n")
