"""CDI (Container Device Interface) spec for the devices this node advertises.

:func:`cdi_spec` is pure: one CDI device per GPU and MIG device, named by its UUID, with the GPU's device
node; the control nodes every CUDA process needs go in the spec-wide ``containerEdits``. The version is
the lowest that covers the fields used (``0.3.0``: device-node paths only). :func:`write_spec` writes it
atomically into the spec directory the container runtime reads (``/var/run/cdi`` by default).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from deviceplugin.resources import Device

CDI_VERSION = "0.3.0"
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def cdi_spec(devices: Iterable[Device], *, kind: str) -> dict[str, Any]:
    """The spec for every distinct GPU/MIG device among ``devices`` (replicas collapse to their device)."""
    seen: dict[str, Device] = {}
    for d in devices:
        seen.setdefault(d.base_uuid, d)
    entries = []
    for uuid in sorted(seen):
        d = seen[uuid]
        nodes = [{"path": f"/dev/nvidia{d.minor_number}"}] if d.minor_number is not None else []
        entries.append({"name": uuid, "containerEdits": {"deviceNodes": nodes}})
    return {
        "cdiVersion": CDI_VERSION,
        "kind": kind,
        "devices": entries,
        "containerEdits": {"deviceNodes": [{"path": p} for p in CONTROL_NODES]},
    }


def spec_file_name(kind: str) -> str:
    return kind.replace("/", "-") + ".json"


def write_spec(spec_dir: Path, spec: dict[str, Any]) -> Path:
    """Write ``spec`` to ``spec_dir/<vendor>-<class>.json`` atomically; returns the path."""
    spec_dir.mkdir(parents=True, exist_ok=True)
    target = spec_dir / spec_file_name(str(spec["kind"]))
    fd, tmp = tempfile.mkstemp(dir=spec_dir, prefix=".cdi-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(spec, fh, indent=2, sort_keys=True)
            fh.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
