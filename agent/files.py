"""Bounded reads of the small files the node side takes from outside the program: sysfs attributes
(``--sysfs-root``), procfs entries (``--proc-root``), the MPS daemon's pid file and the config file.

The reader is :mod:`topology.files` (one reader for the node side, the controller and ``plan``); this
module is the node side's name for it, with the node side's default limit
(:data:`MAX_ATTRIBUTE_BYTES`, sixteen 4 KiB pages). Regular files only, never blocking on a FIFO, at
most ``limit`` bytes; every refusal is a :class:`RefusedFileError` (an ``OSError``).
"""

from __future__ import annotations

from topology.files import MAX_ATTRIBUTE_BYTES, RefusedFileError, read_bytes, read_text

__all__ = ["MAX_ATTRIBUTE_BYTES", "RefusedFileError", "read_bytes", "read_text"]
