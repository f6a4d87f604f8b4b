"""Whole-or-nothing output: files and directories are written under a scratch name and renamed into place.

* ``atomic_write(path, write)`` (and ``atomic_write_text``, ``atomic_write_json``,
  ``atomic_write_bytes``): one file, written to a temporary name beside it and renamed onto it.
* ``atomic_output_dir(out, replace=True)``: a whole output directory, written into a sibling
  scratch directory and committed in one rename: on Linux ``renameat2(RENAME_EXCHANGE)`` swaps
  the new directory with the old one atomically, so a reader (or a kill) sees either the old run
  or the new one, never a mix; the old one is removed afterwards. Elsewhere the old directory is
  renamed aside first, and a run interrupted between the two renames is completed by the next
  run in the same place. ``replace=False`` (the default, for writers that add files to a
  directory holding other state, such as a study database) moves the files in one by one
  instead.

Scratch names carry the writer's process id, ``.OUT.tmp-PID-TOKEN``: every ``atomic_output_dir``
first removes the scratch directories beside ``out`` whose process is dead (a kill leaves them).
Outputs follow the umask, like files created by ``open``: files ``0o666 & ~umask``,
directories ``0o777 & ~umask``.

This module imports only the standard library (the command line imports it before any work).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = [
    "atomic_output_dir",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "check_free_space",
    "check_output_path",
    "clear_stale_scratch",
    "exchange_paths",
]

#: what a scratch name puts between the target's name and the writer's pid: ``.OUT.tmp-PID-TOKEN``
_SCRATCH_TAG = ".tmp-"
_SCRATCH_PID = re.compile(r"(\d+)-[0-9a-f]+")
#: inside a scratch container, where the rename-aside fallback keeps the old directory during the commit
_OLD = ".old"
#: errors for which a disk write is not worth a traceback: the caller reports them as one line
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM,
                          errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENAMETOOLONG, errno.EIO})


# ----------------------------------------------------------------------------------------- scratch names
def _scratch_path(target: Path, suffix: str = "") -> Path:
    return target.parent / f".{target.name}{_SCRATCH_TAG}{os.getpid()}-{secrets.token_hex(4)}{suffix}"


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a pid reused by another process counts as alive: its scratch is kept)."""
    if pid <= 0:
        return True  # not a pid this module wrote: leave it alone
    if pid == os.getpid():
        return True
    if os.path.isdir("/proc/self"):
        return os.path.exists(f"/proc/{pid}")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _scratch_owner(name: str, target_name: str) -> int | None:
    """The pid in scratch name ``name`` of target ``target_name``, or None if ``name`` is not one."""
    prefix = f".{target_name}{_SCRATCH_TAG}"
    if not name.startswith(prefix):
        return None
    match = _SCRATCH_PID.fullmatch(name[len(prefix):])
    return int(match.group(1)) if match else None


def clear_stale_scratch(out: str | os.PathLike) -> list[Path]:
    """Remove the scratch directories of ``out`` (``.OUT.tmp-PID-*`` beside it) whose process is dead.

    A scratch directory whose commit was interrupted between the two renames of the fallback
    (``out`` missing, the old directory set aside inside it) is completed first: the new
    directory, finished before the commit began, becomes ``out``. Scratch directories of live
    processes are kept. Returns the paths removed.
    """
    out = Path(out)
    removed: list[Path] = []
    try:
        entries = list(os.scandir(out.parent))
    except OSError:
        return removed
    for entry in entries:
        pid = _scratch_owner(entry.name, out.name)
        if pid is None or _pid_alive(pid):
            continue
        path = Path(entry.path)
        if not entry.is_dir(follow_symlinks=False):
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path)
            continue
        new = path / out.name
        if (path / _OLD).exists() and new.is_dir() and not os.path.lexists(out):
            with contextlib.suppress(OSError):
                os.rename(new, out)  # the fallback's second rename, interrupted: complete the commit
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            removed.append(path)
    return removed


# ---------------------------------------------------------------------------------------- the swap
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_renameat2 = None


def _load_renameat2():
    """``renameat2`` of the C library (glibc >= 2.28), or None where there is none."""
    global _renameat2
    if _renameat2 is None:
        try:
            fn = ctypes.CDLL(None, use_errno=True).renameat2
        except (AttributeError, OSError):
            fn = False
        else:
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            fn.restype = ctypes.c_int
        _renameat2 = fn
    return _renameat2 or None


def exchange_paths(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Swap ``a`` and ``b`` (both must exist) in one atomic step; False where the system cannot.

    Linux ``renameat2(..., RENAME_EXCHANGE)``; returns False (nothing changed) when the C
    library has no ``renameat2`` or the file system does not support the exchange.
    """
    fn = _load_renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, f"cannot exchange {a} and {b}: {os.strerror(err)}")


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _commit_replace(new: Path, out: Path, container: Path) -> None:
    """Make ``new`` (inside ``container``) become ``out``; the old ``out``, if any, ends up inside ``container``."""
    if not os.path.lexists(out):
        try:
            os.rename(new, out)
            return
        except OSError as exc:  # created meanwhile by someone else: swap with it below
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    if not out.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"{out} exists and is not a directory")
    if exchange_paths(new, out):
        return
    # no atomic exchange here: rename the old directory aside, then the new one into place;
    # a kill between the two leaves `out` missing and `container/.old` present, which the next
    # run's clear_stale_scratch completes (renames `container/OUT` to `out`)
    os.rename(out, container / _OLD)
    try:
        os.rename(new, out)
    except BaseException:
        os.rename(container / _OLD, out)
        raise


def _commit_merge(new: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(new.rglob("*")):
        target = out / path.relative_to(new)
        if path.is_dir() and not path.is_symlink():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)


# ---------------------------------------------------------------------------------------- checks
def _nearest_existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def check_output_path(out: str | os.PathLike, option: str | None = None) -> None:
    """Raise ``NotADirectoryError`` / ``PermissionError`` now if ``out`` cannot become an output directory.

    ``out`` is an existing directory or a new path, and the nearest existing directory above it
    (where the scratch directory goes) is a writable directory, not a regular file. Messages
    start with ``option`` (e.g. ``"--out"``) when given.
    """
    out = Path(out)
    lead = f"{option}: " if option else ""
    if os.path.lexists(out) and not out.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"{lead}{out} exists and is not a directory; "
                                 "expected a directory or a new path")
    base = _nearest_existing(out.parent)
    if not base.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"{lead}{base} is a file, so {out} cannot be created; "
                                 "expected a path under a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, f"{lead}cannot write in {base} (permission denied); "
                              "expected a writable directory")


def _free_bytes(path: Path) -> int | None:
    try:
        st = os.statvfs(_nearest_existing(path))
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def _file_size_limit() -> int | None:
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else soft


def check_free_space(path: str | os.PathLike, nbytes: int, what: str = "output", largest: int | None = None) -> None:
    """Raise ``OSError`` if ``nbytes`` cannot be written at ``path``: ENOSPC when the file system
    has less free space, EFBIG when one file of ``largest`` bytes (default ``nbytes``) is above
    the process's file-size limit (``RLIMIT_FSIZE``). ``path`` may not exist yet (the file
    system of its nearest existing ancestor is checked)."""
    path = Path(path)
    largest = nbytes if largest is None else largest
    limit = _file_size_limit()
    if limit is not None and largest > limit:
        raise OSError(errno.EFBIG, f"{path}: the {what} needs a file of about {_human(largest)}, above the "
                      f"file-size limit of this process ({_human(limit)})")
    free = _free_bytes(path)
    if free is not None and nbytes > free:
        raise OSError(errno.ENOSPC, f"{path}: not enough free space for the {what} (about {_human(nbytes)} "
                      f"needed, {_human(free)} free)")


def _human(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


# ------------------------------------------------------------------------------------- directories
def _make_dirs(path: Path) -> list[Path]:
    """``mkdir -p path`` (umask applies); returns the directories created, deepest last."""
    missing = []
    p = Path(path)
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    created = []
    for p in reversed(missing):
        try:
            os.mkdir(p)
        except FileExistsError:
            if not p.is_dir():
                raise
            continue
        created.append(p)
    return created


def _remove_empty(dirs: list[Path]) -> None:
    for d in reversed(dirs):
        with contextlib.suppress(OSError):
            d.rmdir()


@contextlib.contextmanager
def atomic_output_dir(out: str | os.PathLike, *, replace: bool = False) -> Iterator[Path]:
    """Yield a fresh scratch directory to write into; on success it becomes ``out``, on failure nothing changes.

    With ``replace=True`` the scratch directory replaces ``out`` as a whole, in one atomic
    rename (an exchange on Linux), so no file of an earlier run survives and a kill leaves
    either the old directory or the new one. With ``replace=False`` (the default) its files are
    moved into ``out`` one by one (``os.replace``, atomic per file) and the other files of
    ``out`` are kept: for directories that hold other state, such as a study database.

    The scratch directory ``.OUT.tmp-PID-TOKEN`` lives beside ``out`` (same file system); the
    path yielded is ``<scratch>/OUT`` (same name as ``out``). A body that raises removes it,
    and the parent directories this call created, and re-raises. Scratch directories of dead
    processes beside ``out`` are removed first. ``out`` that exists and is not a directory, or
    whose parent cannot be created, raises ``NotADirectoryError`` before the body runs.
    """
    out = Path(out)
    if out.is_symlink() and out.is_dir():
        out = Path(os.path.realpath(out))  # replace the directory the link points to, not the link
    check_output_path(out)
    created = _make_dirs(out.parent)
    try:
        clear_stale_scratch(out)
        container = _scratch_path(out)
        os.mkdir(container)
    except BaseException:
        _remove_empty(created)
        raise
    try:
        tmp = container / out.name
        os.mkdir(tmp)
        yield tmp
        if replace:
            _commit_replace(tmp, out, container)
        else:
            _commit_merge(tmp, out)
    except BaseException:
        shutil.rmtree(container, ignore_errors=True)
        _remove_empty(created)
        raise
    shutil.rmtree(container, ignore_errors=True)  # the old directory (replace) or what is left of the scratch
    _fsync_dir(out.parent)


# ------------------------------------------------------------------------------------------ files
def _create_scratch_file(path: Path) -> Path:
    """Create an empty file beside ``path`` (same suffix) with the umask's permissions."""
    for _ in range(100):
        tmp = _scratch_path(path, suffix=path.suffix)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for open()
        except FileExistsError:
            continue
        os.close(fd)
        return tmp
    raise FileExistsError(errno.EEXIST, f"cannot create a temporary file beside {path}")


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` to a temporary file beside ``path`` (same suffix, so writers that read the
    format from it still work), then rename it onto ``path``; if ``write`` raises, remove it.

    The file gets the permissions of a newly created file (``0o666 & ~umask``).
    """
    path = Path(path)
    created = _make_dirs(path.parent)
    try:
        tmp = _create_scratch_file(path)
    except BaseException:
        _remove_empty(created)
        raise
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        _remove_empty(created)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes | bytearray | memoryview) -> None:
    """Write ``data`` to ``path`` atomically, after checking the space (``check_free_space``)."""
    size = memoryview(data).nbytes
    check_free_space(Path(path).parent, size, what=Path(path).name)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    atomic_write(path, write)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=float) + "\n")
