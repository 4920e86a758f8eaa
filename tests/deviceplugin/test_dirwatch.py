"""The inotify folder watch: what wakes it, a folder made again, and failing calls."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import shutil
import socket
from pathlib import Path

import pytest

from deviceplugin import dirwatch
from deviceplugin.dirwatch import WatchUnavailableError, inotify_watch


async def _woken(wake: asyncio.Event) -> bool:
    """Whether ``wake`` is set once the loop has had the chance to read pending events."""
    try:
        await asyncio.wait_for(wake.wait(), 5)
    except TimeoutError:
        return False
    wake.clear()
    return True


def test_entries_created_removed_and_renamed_wake_it(tmp_path: Path) -> None:
    async def body() -> list[bool]:
        wake = asyncio.Event()
        watch = inotify_watch(tmp_path, wake.set)
        seen = []
        try:
            server = socket.socket(socket.AF_UNIX)
            server.bind(str(tmp_path / "kubelet.sock"))  # binding a unix socket creates its file
            seen.append(await _woken(wake))
            server.close()
            (tmp_path / "kubelet.sock").unlink()
            seen.append(await _woken(wake))
            (tmp_path / "a").write_text("")
            seen.append(await _woken(wake))
            os.rename(tmp_path / "a", tmp_path / "b")
            seen.append(await _woken(wake))
        finally:
            watch.close()
        return seen

    assert asyncio.run(body()) == [True, True, True, True]


def test_a_folder_made_again_is_watched_after_ensure(tmp_path: Path) -> None:
    folder = tmp_path / "device-plugins"
    folder.mkdir()

    async def body() -> bool:
        wake = asyncio.Event()
        watch = inotify_watch(folder, wake.set)
        try:
            shutil.rmtree(folder)
            assert await _woken(wake)  # the folder itself going away wakes it too
            watch.ensure()  # nothing at the path: nothing to watch, no error
            folder.mkdir()
            watch.ensure()
            (folder / "kubelet.sock").write_text("")
            return await _woken(wake)
        finally:
            watch.close()

    assert asyncio.run(body())


class _FailingLibc:
    def __init__(self, *, init_errno: int = 0, watch_errno: int = 0) -> None:
        self.init_errno, self.watch_errno = init_errno, watch_errno
        self.closed: list[int] = []

    def init1(self, flags: int) -> int:
        if self.init_errno:
            ctypes.set_errno(self.init_errno)
            return -1
        return os.open(os.devnull, os.O_RDONLY)

    def add_watch(self, fd: int, path: bytes, mask: int) -> int:
        ctypes.set_errno(self.watch_errno)
        return -1


@pytest.mark.parametrize(
    ("libc", "message"),
    [
        pytest.param(
            _FailingLibc(init_errno=errno.EMFILE), "fs.inotify.max_user_instances reached", id="instances"
        ),
        pytest.param(
            _FailingLibc(watch_errno=errno.ENOSPC), "fs.inotify.max_user_watches reached", id="watches"
        ),
        pytest.param(_FailingLibc(watch_errno=errno.EACCES), "Permission denied", id="access"),
    ],
)
def test_a_failing_call_is_one_line_naming_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, libc: _FailingLibc, message: str
) -> None:
    monkeypatch.setattr(dirwatch, "_libc", libc)
    before = set(os.listdir("/proc/self/fd"))

    async def body() -> None:
        inotify_watch(tmp_path, lambda: None)

    with pytest.raises(WatchUnavailableError) as caught:
        asyncio.run(body())
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)
    assert set(os.listdir("/proc/self/fd")) <= before  # the descriptor is not leaked
