"""Wake-ups when the kubelet's device-plugin folder changes: Linux inotify through a small ctypes binding.

Kubelet announces a restart in that folder (it removes every socket there and binds a new
``kubelet.sock``); the plugin manager must register again at once. :func:`inotify_watch` asks the kernel
for an event on every entry created, removed or moved in the folder, and on the folder itself going away;
each batch of events calls ``on_change`` on the event loop. Nothing is parsed beyond that: the manager
looks at the folder itself when woken, so a dropped or merged event (queue overflow) loses nothing.

A folder removed and made again is a new inode that the old watch does not see: :meth:`DirWatch.ensure`
moves the watch to the folder now at the path (the manager calls it every pass). Where inotify is not
available (not Linux, no libc symbol, the per-user instance or watch limit reached, a loop without
``add_reader``), :func:`inotify_watch` raises :class:`WatchUnavailableError` with one line and the
manager polls instead.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

WATCH_MASK = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
"""Entries created, removed or renamed, and the folder itself removed or renamed."""
GONE = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED
"""The watched folder is no longer at the path (the kernel dropped the watch, or will)."""
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name
_READ_SIZE = 64 * 1024


class WatchUnavailableError(RuntimeError):
    """inotify cannot watch the folder here; the message is one line saying why."""


class DirWatch(Protocol):
    """What the plugin manager needs of a folder watch."""

    def ensure(self) -> None:
        """Watch the folder now at the path (after it was removed and made again); raises
        :class:`WatchUnavailableError` when it cannot."""

    def close(self) -> None: ...


DirWatchFactory = Callable[[Path, Callable[[], None]], DirWatch]
"""``(folder, on_change) -> DirWatch``; raises :class:`WatchUnavailableError`."""


class _Libc:
    """``inotify_init1`` and ``inotify_add_watch`` from the C library (``None`` members where absent)."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("c")
        try:
            lib = ctypes.CDLL(name, use_errno=True)
            self.init1 = lib.inotify_init1
            self.add_watch = lib.inotify_add_watch
        except (OSError, AttributeError) as exc:
            raise WatchUnavailableError(f"no inotify in the C library ({exc})") from None
        self.init1.argtypes = [ctypes.c_int]
        self.init1.restype = ctypes.c_int
        self.add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self.add_watch.restype = ctypes.c_int


_libc: _Libc | None = None


def _c_library() -> _Libc:
    global _libc  # noqa: PLW0603 - loaded once per process, on first use
    if _libc is None:
        _libc = _Libc()
    return _libc


def _error(what: str) -> WatchUnavailableError:
    code = ctypes.get_errno()
    hint = ""
    if code == errno.EMFILE:
        hint = " (fs.inotify.max_user_instances reached)"
    elif code == errno.ENOSPC:
        hint = " (fs.inotify.max_user_watches reached)"
    return WatchUnavailableError(f"{what}: {os.strerror(code)}{hint}")


class InotifyWatch:
    """One inotify instance watching one folder, read on the running event loop."""

    def __init__(self, path: Path, on_change: Callable[[], None]) -> None:
        self.path = path
        self._on_change = on_change
        self._libc = _c_library()
        self._loop = asyncio.get_running_loop()
        fd = self._libc.init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            raise _error("inotify_init1")
        self._fd = fd
        self._watching: tuple[int, int] | None = None  # (st_dev, st_ino) of the folder the watch is on
        try:
            self.ensure()
            self._loop.add_reader(fd, self._drain)
        except NotImplementedError:
            os.close(fd)
            raise WatchUnavailableError("this event loop cannot wait on a file descriptor") from None
        except BaseException:
            os.close(fd)
            raise
        self.events = 0  # batches read; for tests and logs

    def ensure(self) -> None:
        try:
            st = self.path.stat()
        except OSError:
            self._watching = None  # nothing to watch until the folder is back
            return
        identity = (st.st_dev, st.st_ino)
        if identity == self._watching:
            return
        if self._libc.add_watch(self._fd, os.fsencode(self.path), WATCH_MASK) < 0:
            raise _error(f"inotify_add_watch {self.path}")
        self._watching = identity

    def _drain(self) -> None:
        gone = False
        while True:
            try:
                data = os.read(self._fd, _READ_SIZE)
            except OSError:  # BlockingIOError: drained
                break
            if not data:
                break
            offset = 0
            while offset + _EVENT.size <= len(data):
                _, mask, _, length = _EVENT.unpack_from(data, offset)
                gone = gone or bool(mask & GONE)
                offset += _EVENT.size + length
        if gone:
            self._watching = None
        self.events += 1
        self._on_change()

    def close(self) -> None:
        if self._fd < 0:
            return
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._fd = -1


def inotify_watch(path: Path, on_change: Callable[[], None]) -> DirWatch:
    """Watch ``path`` (a folder) from the running loop; raises :class:`WatchUnavailableError`."""
    return InotifyWatch(path, on_change)


__all__ = ["DirWatch", "DirWatchFactory", "InotifyWatch", "WatchUnavailableError", "inotify_watch"]
