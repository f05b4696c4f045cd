"""Writing a file so that a reader, a crash or a kill never sees half of it.

Every file allocsim writes goes through :func:`atomic_output`: the bytes go to a temporary
file in the target's own folder (``.NAME.XXXXXXXX.tmp``, so the rename never crosses a file
system), which is flushed and fsynced, then renamed over the target, and the folder is fsynced
so the rename itself survives a power cut. Until the rename the previous file is untouched, so
a writer killed by SIGKILL, stopped by ``ulimit -f`` or by a full disk leaves the previous
output exactly as it was — which is also why allocsim never finds its own output truncated.

Never over a file allocsim did not write. An output is claimed before anything runs
(:func:`claim_output`: its path made absolute, so a program that changes the working folder
meanwhile cannot move it, and what was at that path then, by identity); at the moment of the
rename the path must still hold what was claimed — nothing, or the very file that was checked,
unchanged. A file that appeared there or was rewritten since (a recorded script writing its
own ``-o`` path, another program) is left as it is: :class:`OutputChanged`, one line, saying
whether the new output was kept beside it (``NAME.allocsim.EXT``) or not written at all. Where
nothing was claimed the new file is linked into place (``link`` fails rather than replace).

Temporary files of killed writers. A writer that is killed (SIGKILL, a power cut) cannot remove
its temporary file. The next write of the same output removes the ones allocsim provably made:
a temporary file's token is a keyed hash of its own device and inode number (it is created
under a provisional name, then renamed to that token), so a user's file that merely matches
``.NAME.XXXXXXXXXXXXXXXX.tmp`` is not one (its token would have to be the hash of its own
inode). Each writer also holds an exclusive ``flock`` on its temporary file for as long as it
writes; the lock dies with the process, so a writer still running keeps its file.
:func:`remove_stale_temporaries` is that sweep. Where ``fcntl`` is missing (Windows) nothing is
removed.

An error while writing names the target: ``PATH: File too large``, not ``: File too large``
(:class:`OSError` with ``filename`` set to the target, the temporary file removed).

This module imports nothing of allocsim, so every room (traces/ included) may use it; the
output room's helpers (sim/output/files.py: JSON, text, figures) are built on it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from allocsim.errors import UserInputError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["OutputChanged", "OutputClaim", "atomic_output", "claim_output",
           "refuse_overwriting_input", "remove_stale_temporaries", "temporary_pattern",
           "write_bytes", "write_text"]

TEMP_SUFFIX = ".tmp"
_TOKEN_HEX = 16
_TOKEN_KEY = b"allocsim temporary file"
_PROVISIONAL = ".new"       # a temporary file's name until it is renamed to its token
KEPT_INFIX = "allocsim"     # a refused output kept beside the file: NAME.allocsim.EXT

# What identifies the file at a path: device, inode, size, modification and change times (a
# rewrite in place changes the last two, a replacement the inode).
FileIdentity = tuple[int, int, int, int, int]


def _identity(path: Path) -> FileIdentity | None:
    """The identity of what ``path`` names (the link itself, for a symbolic link); None if
    nothing."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


@dataclass(frozen=True)
class OutputClaim:
    """An output path resolved once, before anything runs: ``path`` absolute, ``found`` the
    identity of what was there then (None: nothing), ``keep_refused`` whether a new output
    that may not replace the file is kept beside it (a recording, which cannot simply be made
    again) or dropped. Usable wherever a path is (``os.fspath``). A claim is for one write:
    once written, the path holds a file that was not there when it was claimed."""

    path: Path
    found: FileIdentity | None
    keep_refused: bool = False
    given: str = ""             # the path as the user gave it: what messages name

    @property
    def shown(self) -> str:
        return self.given or os.fspath(self.path)

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __str__(self) -> str:
        return os.fspath(self.path)


def claim_output(path: str | os.PathLike[str], *, keep_refused: bool = False) -> OutputClaim:
    """Claim ``path`` now (a claim given is returned as it is): see :class:`OutputClaim`."""
    if isinstance(path, OutputClaim):
        return path
    absolute = Path(path).absolute()
    return OutputClaim(absolute, _identity(absolute), keep_refused, os.fspath(path))


def refuse_overwriting_input(output: str | os.PathLike[str],
                             inputs: Iterable[str | os.PathLike[str] | None]) -> None:
    """Refuse, in one :class:`UserInputError` line naming ``output``, an output that is one
    of the command's ``inputs`` (``None`` and names that are no file, such as ``default``, are
    skipped): the one rule of every command that writes a file it may also have read. The same
    file however it is spelt: ``./s.pickle``, an absolute path, a symbolic link or a hard link
    to it (``os.path.samefile``: the same device and inode). An input that is missing is left
    to its reader to refuse. Call it before anything is read or written."""
    from allocsim.printable import printable
    given = os.fspath(output.shown if isinstance(output, OutputClaim) else output)
    target = Path(output)
    for source in inputs:
        if source is None:
            continue
        try:
            same = os.path.samefile(source, target)
        except (OSError, ValueError):   # either missing: nothing to overwrite, or to read
            same = False
        if same:
            shown = os.fspath(source)
            also = "" if shown == given else f" ({printable(shown)})"
            raise UserInputError(f"{printable(given)}: refusing to overwrite the input file"
                                 f"{also}")


class OutputChanged(UserInputError):
    """The output's path no longer holds what was claimed: it is left as it is."""


# The part of the target's name kept in the temporary file's name: room for the dot, the token
# and the suffix within a file system's 255-byte names.
_NAME_KEPT = 255 - len(".") - len(".") - _TOKEN_HEX - len(TEMP_SUFFIX) - 16


def _kept_name(path: Path) -> str:
    name = path.name
    while len(name.encode()) > _NAME_KEPT:
        name = name[:-1]
    return name


def temporary_pattern(path: str | os.PathLike[str]) -> re.Pattern[str]:
    """The names of the temporary files a write of ``path`` makes (``.NAME.TOKEN.tmp``, the
    token 16 hex digits)."""
    return re.compile(rf"\.{re.escape(_kept_name(Path(path)))}\.[0-9a-f]{{{_TOKEN_HEX}}}"
                      rf"{re.escape(TEMP_SUFFIX)}")


def remove_stale_temporaries(path: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary files that killed writers of ``path`` left beside it; return them.

    A temporary file whose writer still runs is locked and is kept. Only plain files whose
    token proves allocsim made them are removed (the keyed hash of their own device and inode:
    see the module's docstring); a user's file that merely has such a name, a copy of one, a
    symbolic link or a folder is left alone."""
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
            if _same_file(candidate, fd) and _made_here(name, fd):
                os.unlink(candidate)
                removed.append(candidate)
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed


def _is_plain_file(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)


def _token(fd: int) -> str:
    """The token of the temporary file open as ``fd``: a keyed hash of its device and inode."""
    held = os.fstat(fd)
    digest = hashlib.blake2b(f"{held.st_dev}:{held.st_ino}".encode(), key=_TOKEN_KEY,
                             digest_size=_TOKEN_HEX // 2)
    return digest.hexdigest()


def _made_here(name: str, fd: int) -> bool:
    """Whether ``name`` (a temporary file's, open as ``fd``) carries the token of that file."""
    stem = name[:-len(TEMP_SUFFIX)]
    return stem.rsplit(".", 1)[-1] == _token(fd)


def _same_file(path: Path, fd: int) -> bool:
    """``path`` still names the file open as ``fd`` (not unlinked or replaced meanwhile)."""
    try:
        named = os.lstat(path)
    except OSError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _open_temporary(target: Path) -> tuple[int, Path]:
    """Create and lock a new temporary file beside ``target``: ``(fd, path)``. It is made
    under a provisional name that no sweep removes, locked, then renamed to its token."""
    name = _kept_name(target)
    while True:
        provisional = target.parent / f".{name}.{secrets.token_hex(_TOKEN_HEX // 2)}" \
                                      f"{_PROVISIONAL}"
        # 0o666 lets the umask decide the permissions, as for a plain open().
        fd = os.open(provisional, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            temp = target.parent / f".{name}.{_token(fd)}{TEMP_SUFFIX}"
            if os.path.lexists(temp):
                raise FileExistsError(errno.EEXIST, "a temporary file of this name exists",
                                      os.fspath(temp))
            os.rename(provisional, temp)
        except BaseException:
            _remove(provisional)
            os.close(fd)
            raise
        return fd, temp


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


def _kept_beside(temp: Path, target: Path) -> Path | None:
    """Link ``temp`` to a free name beside ``target`` (``run.allocsim.npz``, then
    ``run.allocsim-2.npz``, ...); the name it got, or None where none could be made."""
    base, dot, rest = target.name.partition(".")
    for number in range(1, 100):
        infix = KEPT_INFIX if number == 1 else f"{KEPT_INFIX}-{number}"
        kept = target.with_name(f"{base}.{infix}{dot}{rest}")
        try:
            os.link(temp, kept)
        except FileExistsError:
            continue
        except OSError:
            return None
        return kept
    return None


def _refuse_replacing(temp: Path, claim: OutputClaim) -> OutputChanged:
    from allocsim.printable import printable
    kept = _kept_beside(temp, claim.path) if claim.keep_refused else None
    outcome = "nothing was written" if kept is None else \
        f"the new output was written to {printable(Path(claim.shown).with_name(kept.name))} " \
        "instead"
    return OutputChanged(f"{printable(claim.shown)}: another program wrote this file after "
                         f"allocsim checked it; it is left as it is and {outcome}")


def _put_in_place(temp: Path, claim: OutputClaim) -> None:
    """Rename ``temp`` over the claimed path, which must still hold what was claimed."""
    target = claim.path
    if _identity(target) != claim.found:
        raise _refuse_replacing(temp, claim)
    if claim.found is not None:
        os.replace(temp, target)
        return
    try:
        os.link(temp, target)       # fails, rather than replaces, if a file appeared meanwhile
    except FileExistsError:
        raise _refuse_replacing(temp, claim) from None
    except OSError:                 # a file system without hard links: the check above holds
        os.replace(temp, target)
        return
    _remove(temp)


@contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary file object whose content replaces ``path`` when the ``with`` block ends
    normally. On any exception — KeyboardInterrupt and SIGTERM's Terminated included — the
    temporary file is removed and ``path`` is untouched; an :class:`OSError` comes out with
    ``filename`` set to ``path``. The folder must exist. ``path`` is claimed now unless it is
    an :class:`OutputClaim` already; a path that no longer holds what was claimed is left as
    it is (:class:`OutputChanged`)."""
    claim = claim_output(path)
    target = claim.path
    try:
        remove_stale_temporaries(target)
        fd, temp = _open_temporary(target)
    except OSError as err:
        raise _naming(err, claim.shown) from None
    try:
        with os.fdopen(fd, "wb") as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
            # Renamed while still open and locked: a sweep never sees it unlocked.
            _put_in_place(temp, claim)
    except OSError as err:
        _remove(temp)
        raise _naming(err, claim.shown) from None
    except BaseException:
        _remove(temp)
        raise
    _fsync_folder(target.parent)


def _naming(err: OSError, target: str) -> OSError:
    """The same error, naming the file the user asked for (not the temporary one)."""
    if err.errno is None:
        return OSError(f"{target}: {err}")
    named = OSError(err.errno, err.strerror or os.strerror(err.errno), target)
    return named


def write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Replace ``path`` with ``data``, atomically."""
    with atomic_output(path) as stream:
        stream.write(data)
    return Path(path)


def write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> Path:
    """Replace ``path`` with ``text``, atomically."""
    return write_bytes(path, text.encode(encoding))
