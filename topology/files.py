"""Bounded reads of files that come from outside the program: the node side's sysfs attributes
(``--sysfs-root``), procfs entries (``--proc-root``), the MPS daemon's pid file and the agent's config
file (through :mod:`agent.files`), and the controller's and ``plan``'s input files (through
:func:`topology.safeyaml.read_text`, with their own larger limits). The one reader of such files.

Whatever sits under those paths is read as untrusted. A tree given with ``--sysfs-root`` (or a host
mount, or a path on a command line) may hold a FIFO where a file belongs (an ``open`` would wait for a
writer for ever), a symlink to ``/dev/zero`` (a read would never end), a directory, or a file of
gigabytes. So :func:`read_bytes`:

- follows symlinks, but reads only what is then a **regular file**: sysfs and procfs attributes are
  regular files (``S_ISREG``; their ``st_size`` is 4096 or 0 whatever they hold, so the size is checked
  while reading, never taken from ``stat``); a FIFO, socket, character or block device or directory is
  refused without being opened;
- opens with ``O_NONBLOCK`` and checks the opened file again, so a path swapped for a FIFO between the
  check and the open cannot block either;
- reads at most ``limit`` bytes (default :data:`MAX_ATTRIBUTE_BYTES`, sixteen 4 KiB pages, so a
  ``cpulist`` of a 64 KiB-page kernel still fits) and refuses a longer file.

Every refusal is a :class:`RefusedFileError`: an ``OSError`` whose ``strerror`` says what was wrong, so a
caller's ``except OSError`` reports it as one line naming the path and skips only that value.
"""

from __future__ import annotations

import errno
import os
import stat

MAX_ATTRIBUTE_BYTES = 64 * 1024
_CHUNK = 64 * 1024

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class RefusedFileError(OSError):
    """A file that is not read: not a regular file, longer than the limit, or (text) not UTF-8."""

    def __init__(self, code: int, why: str, path: str | os.PathLike[str]) -> None:
        super().__init__(code, why, os.fspath(path))


def _kind(mode: int) -> str | None:
    """What a non-regular file is, or ``None`` for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_bytes(path: str | os.PathLike[str], *, limit: int = MAX_ATTRIBUTE_BYTES) -> bytes:
    """At most ``limit`` bytes of the regular file at ``path`` (symlinks followed).

    Raises ``FileNotFoundError`` and the other ``OSError`` of ``open``/``read`` as they come, and
    :class:`RefusedFileError` for a path that is not a regular file or holds more than ``limit`` bytes.
    """
    kind = _kind(os.stat(path).st_mode)
    if kind is not None:
        raise RefusedFileError(errno.EINVAL, f"not a regular file ({kind})", path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        kind = _kind(os.fstat(fd).st_mode)
        if kind is not None:  # replaced between the stat and the open
            raise RefusedFileError(errno.EINVAL, f"not a regular file ({kind})", path)
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise RefusedFileError(errno.EFBIG, f"larger than {limit} bytes (the limit)", path)
    return b"".join(chunks)


def read_text(path: str | os.PathLike[str], *, limit: int = MAX_ATTRIBUTE_BYTES) -> str:
    """:func:`read_bytes` decoded as UTF-8; :class:`RefusedFileError` naming the first byte that is not."""
    raw = read_bytes(path, limit=limit)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = raw[exc.start : exc.start + 1].hex()
        raise RefusedFileError(
            errno.EILSEQ, f"not UTF-8 text (byte 0x{bad} at offset {exc.start})", path
        ) from None
