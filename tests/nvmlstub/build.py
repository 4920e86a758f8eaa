"""Build the C-level NVML stand-in (``nvmlstub.c``) into ``<dir>/<variant>/libnvidia-ml.so.1``.

``cc -Wall -Werror -Wmissing-prototypes`` against NVIDIA's ``nvml.h`` from the ``nvidia-nvml-dev`` wheel:
every exported function needs NVIDIA's prototype, and its definition must match it. Each variant is its own
library (its own ``-D`` flags), loaded in its own process with ``LD_LIBRARY_PATH`` pointing at its folder.

Run by hand: ``python -m tests.nvmlstub.build OUT_DIR [VARIANT ...]`` prints the library paths.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).with_name("nvmlstub.c")
LIBRARY = "libnvidia-ml.so.1"

VARIANTS: dict[str, tuple[str, ...]] = {
    "current": (),
    "no-processes-v3": ("-DNVMLSTUB_NO_PROCESSES_V3",),
    "no-fabric-v": ("-DNVMLSTUB_NO_FABRIC_V",),
    "old-driver": ("-DNVMLSTUB_OLD_DRIVER",),
}
"""Variant name → compiler flags (see the comment at the top of ``nvmlstub.c``)."""

CFLAGS = ("-Wall", "-Werror", "-Wmissing-prototypes", "-Wstrict-prototypes", "-O1", "-shared", "-fPIC")


class StubUnavailableError(RuntimeError):
    """No C compiler or no ``nvml.h`` here: the stand-in cannot be built (the message says which)."""


def compiler() -> str:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise StubUnavailableError("no C compiler (cc, gcc or clang) on PATH")
    return cc


def nvml_include_dir() -> Path:
    """The folder holding ``nvml.h`` from the installed ``nvidia-nvml-dev`` wheel."""
    try:
        files = importlib.metadata.files("nvidia-nvml-dev") or []
    except importlib.metadata.PackageNotFoundError:
        raise StubUnavailableError("nvidia-nvml-dev is not installed (pip install nvidia-nvml-dev)") from None
    for entry in files:
        if entry.name == "nvml.h":
            header = Path(str(entry.locate()))
            if header.is_file():
                return header.parent
    raise StubUnavailableError("nvidia-nvml-dev is installed but its nvml.h is missing")


def build(out_dir: Path, variant: str = "current", *, source: Path = SOURCE) -> Path:
    """Compile one variant (of ``source``, default ``nvmlstub.c``); returns the library's path. Raises
    :class:`StubUnavailableError` or ``subprocess.CalledProcessError`` (compiler output in ``stderr``)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown nvmlstub variant {variant!r}; valid: {', '.join(VARIANTS)}")
    target = out_dir / variant / LIBRARY
    target.parent.mkdir(parents=True, exist_ok=True)
    command = [
        compiler(),
        *CFLAGS,
        f"-I{nvml_include_dir()}",
        *VARIANTS[variant],
        f"-Wl,-soname,{LIBRARY}",
        "-o",
        str(target),
        str(source),
        "-lpthread",
    ]
    subprocess.run(command, check=True, capture_output=True, text=True)
    return target


def main(argv: list[str]) -> int:
    if not argv:
        print(f"usage: python -m tests.nvmlstub.build OUT_DIR [{'|'.join(VARIANTS)} ...]", file=sys.stderr)
        return 2
    out = Path(argv[0])
    for variant in argv[1:] or list(VARIANTS):
        print(build(out, variant))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
