"""Writing a file so that a reader, a crash or a kill never sees half of it.

Every file allocsim writes goes through :func:`atomic_output`: the bytes go to a temporary
file in the target's own folder (``.NAME.XXXXXXXX.tmp``, so the rename never crosses a file
system), which is flushed and fsynced, then renamed over the target, and the folder is fsynced
so the rename itself survives a power cut. Until the rename the previous file is untouched, so
a writer killed by SIGKILL, stopped by ``ulimit -f`` or by a full disk leaves the previous
output exactly as it was — which is also why allocsim never finds its own output truncated.

Temporary files of killed writers. A writer that is killed (SIGKILL, a power cut) cannot remove
its temporary file. Each writer holds an exclusive ``flock`` on its temporary file for as long as
it writes; the lock dies with the process. The next write of the same output removes every
``.NAME.XXXXXXXX.tmp`` beside it whose lock it can take (a writer still running holds its lock,
so its file is left alone); :func:`remove_stale_temporaries` is that sweep. Where ``fcntl`` is
missing (Windows) nothing is removed.

An error while writing names the target: ``PATH: File too large``, not ``: File too large``
(:class:`OSError` with ``filename`` set to the target, the temporary file removed).

This module imports nothing of allocsim, so every room (traces/ included) may use it; the
output room's helpers (sim/output/files.py: JSON, text, figures) are built on it.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["atomic_output", "remove_stale_temporaries", "temporary_pattern", "write_bytes",
           "write_text"]

TEMP_SUFFIX = ".tmp"
_TOKEN_HEX = 8
# The part of the target's name kept in the temporary file's name: room for the dot, the token
# and the suffix within a file system's 255-byte names.
_NAME_KEPT = 255 - len(".") - len(".") - _TOKEN_HEX - len(TEMP_SUFFIX) - 16


def _kept_name(path: Path) -> str:
    name = path.name
    while len(name.encode()) > _NAME_KEPT:
        name = name[:-1]
    return name


def temporary_pattern(path: str | os.PathLike[str]) -> re.Pattern[str]:
    """The names of the temporary files a write of ``path`` makes (``.NAME.XXXXXXXX.tmp``)."""
    return re.compile(rf"\.{re.escape(_kept_name(Path(path)))}\.[0-9a-f]{{{_TOKEN_HEX}}}"
                      rf"{re.escape(TEMP_SUFFIX)}")


def remove_stale_temporaries(path: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary files that killed writers of ``path`` left beside it; return them.

    A temporary file whose writer still runs is locked and is kept. Only plain files named as
    allocsim names its temporary files are considered; a symbolic link or a folder of that
    name is left alone."""
    if fcntl is None:  # pragma: no cover - Windows: no way to tell a live writer's file
        return []
    target = Path(path)
    folder = target.parent
    pattern = temporary_pattern(target)
    removed: list[Path] = []
    try:
        names = [entry.name for entry in os.scandir(folder) if pattern.fullmatch(entry.name)]
    except OSError:
        return removed
    for name in names:
        candidate = folder / name
        try:
            fd = os.open(candidate, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) |
                         getattr(os, "O_NONBLOCK", 0))
        except OSError:
            continue
        try:
            if not _is_plain_file(fd):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue        # its writer is alive
            if _same_file(candidate, fd):
                os.unlink(candidate)
                removed.append(candidate)
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed


def _is_plain_file(fd: int) -> bool:
    import stat
    return stat.S_ISREG(os.fstat(fd).st_mode)


def _same_file(path: Path, fd: int) -> bool:
    """``path`` still names the file open as ``fd`` (not unlinked or replaced meanwhile)."""
    try:
        named = os.lstat(path)
    except OSError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _open_temporary(target: Path) -> tuple[int, Path]:
    """Create and lock a new temporary file beside ``target``: ``(fd, path)``."""
    while True:
        temp = target.parent / f".{_kept_name(target)}.{secrets.token_hex(_TOKEN_HEX // 2)}" \
                               f"{TEMP_SUFFIX}"
        # 0o666 lets the umask decide the permissions, as for a plain open().
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        if fcntl is None:  # pragma: no cover - Windows
            return fd, temp
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = _same_file(temp, fd)
        except OSError:
            locked = False
        if locked:
            return fd, temp
        # A sweep of stale files took it in the instant between creating and locking it.
        os.close(fd)


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass    # some file systems cannot sync a folder; the file itself was synced
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


@contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary file object whose content replaces ``path`` when the ``with`` block ends
    normally. On any exception — KeyboardInterrupt and SIGTERM's Terminated included — the
    temporary file is removed and ``path`` is untouched; an :class:`OSError` comes out with
    ``filename`` set to ``path``. The folder must exist."""
    target = Path(path)
    try:
        remove_stale_temporaries(target)
        fd, temp = _open_temporary(target)
    except OSError as err:
        raise _naming(err, target) from None
    try:
        with os.fdopen(fd, "wb") as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
            # Renamed while still open and locked: a sweep never sees it unlocked.
            os.replace(temp, target)
    except OSError as err:
        _remove(temp)
        raise _naming(err, target) from None
    except BaseException:
        _remove(temp)
        raise
    _fsync_folder(target.parent)


def _naming(err: OSError, target: Path) -> OSError:
    """The same error, naming the file the user asked for (not the temporary one)."""
    if err.errno is None:
        return OSError(f"{target}: {err}")
    named = OSError(err.errno, err.strerror or os.strerror(err.errno), os.fspath(target))
    return named


def write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Replace ``path`` with ``data``, atomically."""
    with atomic_output(path) as stream:
        stream.write(data)
    return Path(path)


def write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> Path:
    """Replace ``path`` with ``text``, atomically."""
    return write_bytes(path, text.encode(encoding))
