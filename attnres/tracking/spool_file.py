"""The spool's file, as its one writer appends to it: never blocking training, never dropping a line.

Lines go to the OS with one ``os.write`` on an unbuffered descriptor: what reached the OS survives a SIGKILL
of the process, and there is no buffered layer to flush. Progress marks may wait in memory for the next line
that is flushed.

What the file does not take (a full disk, a file-size limit, a read-only folder) stays in memory, whole
lines, in order, and is tried again every interval: nothing written to the spool is ever dropped while
the process lives. A line a failed write cut short is taken off the file's end before its whole copy is
written (or, where the file changed meanwhile, ended by a line break, so that it reads as one unreadable
line). A spool deleted or replaced under the writer is noticed within a second and made again from what
the writer says the database may lack (``recreate``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from attnres.logline import say
from attnres.tracking.spool import held

CHECK_S = 1.0  # how often a write looks whether its spool is still at its path (deleted, replaced)


def ends_with_newline(path: Path) -> bool | None:
    """Whether the file's last byte is a line break (None: the file is empty)."""
    with path.open("rb") as fh:
        if not fh.seek(0, os.SEEK_END):
            return None
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) == b"\n"


class SpoolFile:
    """Appends lines to one spool; the caller serialises calls (the metric writer's lock)."""

    def __init__(self, path: Path, recreate: Callable[[], tuple[bytes, str]], retry_s: float = 2.0) -> None:
        self.path, self.recreate, self.retry_s = Path(path), recreate, retry_s
        self.ok = True  # False while lines wait in memory for a spool that could not take them
        self.error: OSError | None = None  # why it could not (the last failure)
        self.held: list[str] = []  # lines not yet handed to the OS (progress marks, or lines the disk refused)
        self.pruned = False  # lines the disk refused were let go (the database took them): the file lacks them
        self._fd: int | None = None  # opened at the first line
        self._cut: tuple[int, int] | None = None  # (where a cut line starts, the file's size then)
        self._retry_at = 0.0  # (monotonic) when a spool that failed is tried again
        self._next_check = 0.0  # (monotonic) when a write next looks whether the file is still at its path

    def append(self, line: str, flush: bool = True) -> None:
        """Add a line; ``flush`` hands it (and the lines held before it) to the OS now, unless the spool failed
        less than ``retry_s`` ago (then the next try takes it)."""
        self.held.append(line)
        if flush and (self.ok or time.monotonic() >= self._retry_at):
            self.write_held()

    def flush(self, check: bool = False) -> None:
        """Hand the held lines to the OS (a failed spool: once ``retry_s`` has passed, or now with ``check``);
        ``check`` also looks now whether the file is still at its path."""
        if (self.held or self._fd is not None) and (self.ok or check or time.monotonic() >= self._retry_at):
            self.write_held(check)

    def write_held(self, check: bool = False) -> None:
        data, self.held = "".join(self.held).encode(), []
        self._write(data, check)

    def prune(self) -> None:
        """Let go of the lines a failing spool holds, once the database holds all they say: memory is not kept for
        a spool that may never take them (a file-size limit, a read-only folder). The file then lacks them, and is
        never replayed (:attr:`pruned`)."""
        if not self.ok and self.held:
            self.held.clear()
            self.pruned = True

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:  # a delayed write error (NFS): what it held is in memory and in the database
                pass
            self._fd = None

    def _write(self, data: bytes, check: bool = False) -> None:
        """Hand ``data`` to the file; a spool deleted or replaced is made again first. What the file does not
        take goes back to the front of the held lines, whole lines only."""
        written, remade = 0, ""
        try:
            if self._fd is not None and self._moved(check):
                self.close()
                lines, remade = self.recreate()  # (what it holds is said once it is written)
                data = lines + data
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)  # (a logs folder deleted before the first line)
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    cut = bool(os.fstat(fd).st_size) and not ends_with_newline(self.path)  # an earlier attempt's
                except OSError:
                    os.close(fd)
                    raise
                # a cut line there is ended by a break; until one is written, the next try looks again
                self._fd, self._cut = fd, ((-1, -1) if cut else None)
                if cut:
                    data = b"\n" + data
            elif self._cut is not None and data:
                self._mend_cut()
                if self._cut is not None:
                    data = b"\n" + data
            while written < len(data):
                written += os.write(self._fd, data[written:])
        except OSError as exc:  # disk full, file-size limit, read-only folder: keep the lines in memory
            whole = data.rfind(b"\n", 0, written) + 1  # what reached the file in whole lines
            if written:  # (nothing written: the file ends as it did)
                self._cut = self._cut_at(written - whole) if written > whole else None
            rest = data[whole:]
            if rest.startswith(b"\n"):  # the break before a cut line's copy (no line starts with one)
                rest = rest[1:]
            if rest:
                self.held.insert(0, rest.decode())
            self._failed(exc)
            return
        if not data:  # (nothing was written: nothing shows the file takes lines again)
            return
        self._cut = None
        if remade:
            say(f"attnres: spool {self.path} was deleted or replaced; made it again with {remade}", err=True)
        if not self.ok:
            self.ok, self.error = True, None
            say(f"attnres: spool {self.path} is writable again: the lines held in memory are in it now", err=True)

    def _failed(self, exc: OSError) -> None:
        self._retry_at = time.monotonic() + self.retry_s
        if self.ok:
            say(f"attnres: cannot write spool {self.path} ({exc.strerror or exc}); the lines it did not take are "
                "held in memory and written to it once it takes them again", err=True)
        self.ok, self.error = False, exc

    def _cut_at(self, cut_bytes: int) -> tuple[int, int]:
        """(where the cut line starts, the file's size now), for :meth:`_mend_cut` ((-1, -1): cannot be told)."""
        try:
            size = os.fstat(self._fd).st_size
        except OSError:
            return -1, -1
        return size - cut_bytes, size

    def _mend_cut(self) -> None:
        """Take a line a failed write cut short off the file's end, where the file is as the failure left it
        (under the spool's lock, so that no `attnres sync` empties it meanwhile); else (emptied or grown since,
        or the lock held elsewhere) its copy goes after a line break, and the cut line reads as unreadable."""
        start, size = self._cut
        try:
            with held(self.path, wait=False) as mine:
                if mine and start >= 0 and os.fstat(self._fd).st_size == size:
                    os.ftruncate(self._fd, start)
                    self._cut = None
                elif ends_with_newline(self.path) is not False:  # (emptied, or ended by someone since)
                    self._cut = None
        except OSError:
            pass

    def _moved(self, now: bool = False) -> bool:
        """Whether the open spool is no longer the file at its path (deleted, its folder deleted, replaced).

        Looked at once every :data:`CHECK_S` (a ``stat`` and an ``fstat``), or ``now``.
        """
        clock = time.monotonic()
        if not now and clock < self._next_check:
            return False
        self._next_check = clock + CHECK_S
        try:
            there = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return True
        except OSError:  # cannot tell (a folder unreadable for a moment): keep writing where we write
            return False
        mine = os.fstat(self._fd)
        return (there.st_ino, there.st_dev) != (mine.st_ino, mine.st_dev)
