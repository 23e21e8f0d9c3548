"""Files a command writes at the user's request (``--out``, ``--plot``): one behaviour for every such option.

Missing folders are created, as ``export`` and ``data prepare`` always did (and ``mkdir -p``, MLflow's and
W&B's output folders do); but whether the path can be written is checked first, before any work, so a command
that cannot write its output says so in one line and has changed nothing.

Outputs are written only to regular files: a new file, or an existing regular one (or a link to one) that is
replaced. A device (``/dev/full``, ``/dev/null``), a named pipe, a socket or a folder in a file's place, or a link to
one, is refused in one line by :func:`check` before any work, and again by :func:`atomic` before it writes, so a
special file is never replaced by a regular one (as root, renaming over ``/dev/full`` would replace the device).

Every file is written whole or not at all (:func:`atomic`): into a temporary file beside it, then renamed over
it. A reader polling the file (a dashboard, ``watch cat``, a notebook) sees the old file or the new one, never
an empty or half-written one, and a command that fails mid-write leaves the old file and no temporary one.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from attnres.errors import AttnresError

_SPECIAL = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
            (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"))


def special(path: Path) -> str | None:
    """What ``path`` is, in words, when it is there but neither a regular file nor a folder: a device, a named pipe,
    a socket, or a link to one ("a link to a character device"). None when nothing is there (a link to nothing
    included: a new file replaces the link), or a regular file or a folder is (through links)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    kind = next((name for test, name in _SPECIAL if test(mode)), "a special file")
    return f"a link to {kind}" if os.path.islink(path) else kind


def _named(given: Path, option: str | None) -> str:
    """How a message names an output: by its option (``--out x.md``), or, given none, by its path (``'x.md'``)."""
    return f"{option} {given}" if option else f"'{given}'"


def _refuse_special(path: Path, given: Path | None = None, option: str | None = None) -> None:
    """One line when ``path``'s place holds a special file (:func:`special`): only regular files are written."""
    what = special(path)
    if what is not None:
        raise AttnresError(f"cannot write {_named(given or path, option)}: it is {what}, not a regular file (outputs "
                           "are written only to a new file or over an existing regular one)")


def _existing(folder: Path) -> Path:
    """The nearest folder of ``folder``'s ancestry (itself included) that exists."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def _probe(base: Path) -> str | None:
    """Why nothing can be created in folder ``base`` (None: it can), found by creating a folder there and removing
    it again. ``os.access`` alone says yes to root everywhere, /proc and /sys included, where creating fails."""
    probe = base / f".attnres-probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        probe.mkdir()
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    try:
        probe.rmdir()
    except OSError:
        pass
    return None


def check(path: Path, folder: bool = False, option: str = "--out", example: str | None = None,
          inside: tuple[str, ...] = ()) -> None:
    """Refuse, in one line, an output ``path`` that cannot be written: a folder or a special file (a device, a named
    pipe, a socket, or a link to one) in its place (anything but a folder, with ``folder``), a file where a folder
    must be created, or a place where nothing can be created (no permission, a read-only or virtual file system).
    ``option`` names the path in the message, and ``example`` is the file name suggested when a folder was given
    where a file is written. ``inside``: the names of the files a ``folder`` output writes into it (export's
    ``runs.csv``, a report's figures), each checked as a file output and named by its path."""
    try:
        _check(Path(path), folder, option, example)
        for name in inside:
            _check(Path(path) / name, False, None, None)
    except OSError as exc:  # a path that cannot even be looked at (a folder on the way that cannot be read)
        raise AttnresError(f"cannot write '{path}': {exc.strerror or exc}") from None


def _check(given: Path, folder: bool, option: str | None, example: str | None) -> None:
    """:func:`check`'s tests, in order: what is in the path's place, what is on the way to it, then whether
    anything can be created where it goes."""
    path = given.absolute()
    if folder and path.exists() and not path.is_dir():
        raise AttnresError(f"cannot write into '{path}': it is {special(path) or 'a file'}, not a folder")
    if not folder:
        _refuse_special(path, given, option)
    if not folder and path.is_dir():
        hint = f", e.g. {given / example}" if example else ""
        raise AttnresError(f"{_named(given, option)} is a folder: give a file name{hint}")
    base = _existing(path if folder else path.parent)
    if not base.is_dir():
        raise AttnresError(f"cannot write '{path}': '{base}' is a file, not a folder")
    if path.exists() and not folder and not os.access(path, os.W_OK):
        raise AttnresError(f"cannot write '{path}': permission denied")
    if not os.access(base, os.W_OK | os.X_OK):
        raise AttnresError(f"cannot write '{path}': permission denied in '{base}'")
    why = _probe(base)
    if why is not None:
        raise AttnresError(f"cannot write '{path}': nothing can be created in '{base}' ({why})")


def prepare(path: Path, folder: bool = False) -> Path:
    """Create the folders ``path`` needs (``folder``: ``path`` itself too); returns ``path``."""
    target = Path(path) if folder else Path(path).parent
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AttnresError(f"cannot create folder '{target}': {exc.strerror or exc}") from None
    return Path(path)


@contextmanager
def atomic(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` for a writer that takes a path (``savefig``, ``to_csv``, ``to_parquet``);
    once the block ends it is flushed to disk and renamed over ``path``, so ``path`` is the old file or the whole
    new one at every moment. On an error the temporary file is removed and ``path`` is left as it was.

    The temporary name is hidden (a leading dot) and ends in ``path``'s suffix, so a writer that picks its format
    from the suffix (matplotlib, pandas' compression) picks the same one. It is created with the permissions a
    new file gets (the umask's), or those of the file it replaces.
    """
    try:
        _refuse_special(Path(path))  # (check() said so before any work; this is the write's own guard)
    except OSError as exc:
        raise AttnresError(f"cannot write '{path}': {exc.strerror or exc}") from None
    path = prepare(path)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}-{secrets.token_hex(4)}.tmp{path.suffix}")
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        if path.exists():
            os.chmod(tmp, stat.S_IMODE(path.stat().st_mode))
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)  # the content is on disk before the name points at it (a power cut leaves one or the other)
        finally:
            os.close(fd)
        _refuse_special(path)  # made while the file was written: left as it is, never replaced
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise AttnresError(f"cannot write '{path}': {exc.strerror or exc}") from None
        raise


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` whole or not at all (:func:`atomic`); returns ``path``."""
    with atomic(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_bytes(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` whole or not at all (:func:`atomic`); returns ``path``."""
    with atomic(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)
