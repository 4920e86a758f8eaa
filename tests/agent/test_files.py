from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from agent.files import MAX_ATTRIBUTE_BYTES, RefusedFileError, read_bytes, read_text


def test_reads_a_regular_file_and_follows_a_symlink_to_one(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"4: ACTIVE\n")
    (tmp_path / "link").symlink_to(tmp_path / "a")
    assert read_bytes(tmp_path / "a") == b"4: ACTIVE\n"
    assert read_text(str(tmp_path / "link")) == "4: ACTIVE\n"


def test_a_file_of_exactly_the_limit_is_read_one_byte_more_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 100)
    assert read_bytes(tmp_path / "a", limit=100) == b"x" * 100
    with pytest.raises(RefusedFileError, match=r"larger than 99 bytes \(the limit\)") as err:
        read_bytes(tmp_path / "a", limit=99)
    assert err.value.filename == str(tmp_path / "a")
    (tmp_path / "big").write_bytes(b"0" * (MAX_ATTRIBUTE_BYTES + 1))
    with pytest.raises(RefusedFileError, match="larger than"):
        read_text(tmp_path / "big")


def test_a_character_device_is_refused_without_reading_it(tmp_path: Path) -> None:
    (tmp_path / "uuid").symlink_to("/dev/zero")
    with pytest.raises(RefusedFileError) as err:
        read_bytes(tmp_path / "uuid")
    assert err.value.strerror == "not a regular file (a character device)"
    assert isinstance(err.value, OSError)


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RefusedFileError, match=r"not a regular file \(a directory\)"):
        read_text(tmp_path)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "fw_ver"
    os.mkfifo(fifo)
    outcome: list[BaseException | bytes] = []

    def read() -> None:
        try:
            outcome.append(read_bytes(fifo))
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(30)
    if reader.is_alive():  # the read waits for a writer: give it one (and EOF) so the thread ends
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(30)
    [result] = outcome
    assert isinstance(result, RefusedFileError), result
    assert result.strerror == "not a regular file (a FIFO)"


def test_text_that_is_not_utf8_names_the_byte(tmp_path: Path) -> None:
    (tmp_path / "hca_type").write_bytes(b"MT\xe94129\n")
    with pytest.raises(RefusedFileError) as err:
        read_text(tmp_path / "hca_type")
    assert err.value.strerror == "not UTF-8 text (byte 0xe9 at offset 2)"
    assert read_bytes(tmp_path / "hca_type") == b"MT\xe94129\n"


def test_a_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_bytes(tmp_path / "none")
