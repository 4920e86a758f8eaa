"""NVIDIA's gpu-feature-discovery beside ours, over the same machine (issue 30).

The peer is NVIDIA's own binary (``gpu-feature-discovery`` from ``github.com/NVIDIA/k8s-device-plugin``,
built by ``counterparts/build.sh``), unmodified, on the C NVML stand-in (``tests/nvmlstub``) serving a
simulator profile. GFD ``--oneshot`` writes its labels to a file; ours are the labels the publisher writes
(``topology.labels.node_labels``) for the inventory ``gpu-node-agent discover`` reads over the same
stand-in. Every label both claim in GFD's families (``nvidia.com/gpu.*``, ``nvidia.com/mig.*``,
``nvidia.com/mig-<profile>.*``, ``nvidia.com/cuda.*``; ``gpu.clique`` and the sharing labels are under
``gpu.``) must be equal, except the differences named in :data:`DIFFERENCES`; labels only one side writes
must be the ones :data:`GFD_ONLY` and :data:`OURS_ONLY` name. README.md ("Side by side with NVIDIA's GFD")
says which side is right where they differ, and why.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent import localcluster as cluster
from tests.e2e.conftest import REPO_ROOT, _require, _unavailable
from tests.nvmlstub.build import LIBRARY, UNIMPLEMENTED_ENV, StubUnavailableError, build, unimplemented_calls
from tests.nvmlstub.conftest import Runner
from topology.labels import node_labels
from topology.model import NodeInventory

pytestmark = pytest.mark.e2e

GFD = "gpu-feature-discovery"
DEVICE_PLUGIN = "nvidia-device-plugin"
RUN_TIMEOUT_S = 120
NODE = "peer-node"

COMPARED = re.compile(r"^nvidia\.com/(gpu\.|mig\.|mig-|cuda\.)")
"""GFD's label families that both programs write (the issue's list)."""


@dataclass(frozen=True)
class Case:
    profile: str
    mig_strategy: str = "none"
    sharing: str = "none"  # none | time-slicing | mps
    replicas: int = 1
    renamed: bool = False

    def gfd_config(self) -> str:
        """GFD's config file (``version: v1``), the same keys our device plugin reads."""
        config: dict[str, object] = {"version": "v1", "flags": {"migStrategy": self.mig_strategy}}
        if self.sharing != "none":
            key = "timeSlicing" if self.sharing == "time-slicing" else "mps"
            config["sharing"] = {
                key: {
                    "renameByDefault": self.renamed,
                    "resources": [{"name": "nvidia.com/gpu", "replicas": self.replicas}],
                }
            }
        return json.dumps(config)


CASES: dict[str, Case] = {
    "dgx-h100": Case("dgx-h100"),
    "hgx-h200": Case("hgx-h200"),
    "gb200-nvl72": Case("gb200-nvl72:rack=2,tray=5"),
    "dgx-a100-mig-none": Case("dgx-a100-mig"),
    "dgx-a100-mig-mixed": Case("dgx-a100-mig", mig_strategy="mixed"),
    "dgx-a100-mig-single": Case("dgx-a100-mig", mig_strategy="single"),
    "dgx1-v100": Case("dgx1-v100"),
    "pcie-l40s": Case("pcie-l40s"),
    "time-slicing": Case("dgx-h100", sharing="time-slicing", replicas=4),
    "time-slicing-renamed": Case("dgx-h100", sharing="time-slicing", replicas=4, renamed=True),
    "mps": Case("pcie-l40s", sharing="mps", replicas=2),
}

MUST_MATCH: dict[str, dict[str, str]] = {
    "gb200-nvl72": {"nvidia.com/gpu.clique": "702b1e69-8f57-5fbb-8061-00973c9cd06e.32766"},
    "dgx-a100-mig-mixed": {"nvidia.com/mig-1g.10gb.count": "9", "nvidia.com/mig.strategy": "mixed"},
    "dgx-a100-mig-single": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-INVALID"},
    "pcie-l40s": {"nvidia.com/gpu.family": "ada-lovelace"},
    "time-slicing": {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-SHARED",
        "nvidia.com/gpu.replicas": "4",
    },
    "time-slicing-renamed": {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.replicas": "4",
    },
    "mps": {"nvidia.com/gpu.sharing-strategy": "mps", "nvidia.com/gpu.replicas": "2"},
}
"""Case → labels both must write with these values (the comparison reaches clique, MIG and sharing)."""

DIFFERENCES: dict[str, dict[str, tuple[str | None, str | None]]] = {}
"""Case → label → (GFD's value, ours): the differences README.md explains. Anything else must be equal."""

GFD_ONLY = re.compile(
    r"^nvidia\.com/("
    r"gpu\.machine"  # the DMI product name (a host fact, not a GPU fact)
    r"|gpu\.mode"  # compute/graphics from the PCI class in /sys/bus/pci (not NVML)
    r"|mig-[0-9a-z.+]+\.(engines\.[a-z]+|multiprocessors|product|replicas|sharing-strategy)"
    r")$"
)
"""Labels in the compared families that only GFD writes (README.md lists them)."""

OURS_ONLY = re.compile(r"^nvidia\.com/(gpu\.present|mig\.strategy)$")
"""Labels in the compared families that only we write (GFD leaves ``gpu.present`` to NFD's PCI rule)."""


@pytest.fixture(scope="module")
def peer(counterparts: cluster.Counterparts) -> cluster.Counterparts:
    _require(counterparts, GFD, DEVICE_PLUGIN)
    return counterparts


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Runner:
    """The stand-in (variant ``current``) and the environment that serves a profile through it."""
    out = tmp_path_factory.mktemp("peer-nvmlstub")
    try:
        library = build(out)
    except StubUnavailableError as exc:
        _unavailable(f"the C NVML stand-in cannot be built here: {exc}")
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"the C NVML stand-in does not compile against nvml.h:\n{exc.stderr}")
    return Runner({"current": library.parent}, tmp_path_factory.mktemp("peer-runs"))


def _undefined_nvml_symbols(binary: Path) -> set[str]:
    nm = shutil.which("nm")
    if nm is None:
        pytest.fail("nm (binutils) is needed to read the NVML symbols a peer binary imports")
    out = subprocess.run(
        [nm, "-D", "--undefined-only", str(binary)], check=True, capture_output=True, text=True
    )
    return {line.split()[-1] for line in out.stdout.splitlines() if line.split()[-1].startswith("nvml")}


def _exported_symbols(library: Path) -> set[str]:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(library)], check=True, capture_output=True, text=True
    )
    return {line.split()[-1] for line in out.stdout.splitlines()}


@pytest.mark.parametrize("binary", [GFD, DEVICE_PLUGIN])
def test_the_stand_in_exports_every_nvml_symbol_the_peer_imports(
    peer: cluster.Counterparts, runner: Runner, binary: str
) -> None:
    """go-nvml leaves every NVML call unresolved until it dlopens libnvidia-ml.so.1; a symbol the stand-in
    lacks would kill the peer at its first call. Each one it imports is there (most answer
    FUNCTION_NOT_FOUND and are recorded; the next test proves the ones called are implemented)."""
    imported = _undefined_nvml_symbols(peer.binary(binary))
    assert len(imported) > 100  # the whole of go-nvml: the check reads the right table
    missing = imported - _exported_symbols(runner.libraries["current"] / LIBRARY)
    assert not missing, f"{binary} imports NVML functions the stand-in does not export: {sorted(missing)}"


def _gfd_labels(peer: cluster.Counterparts, case: Case, env: dict[str, str], work: Path) -> dict[str, str]:
    config = work / "gfd-config.json"
    config.write_text(case.gfd_config(), encoding="utf-8")
    output = work / "gfd-labels"
    done = subprocess.run(
        [
            str(peer.binary(GFD)),
            "--oneshot",
            "--no-timestamp",
            "--use-node-feature-api=false",
            f"--config-file={config}",
            f"--output-file={output}",
            f"--machine-type-file={work / 'no-product-name'}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    lacking = unimplemented_calls(Path(env[UNIMPLEMENTED_ENV]))
    assert done.returncode == 0, (
        f"{GFD} exited {done.returncode}; NVML functions it called that the stand-in lacks: {lacking}; "
        f"its log:\n{done.stderr[-4000:]}"
    )
    labels: dict[str, str] = {}
    for line in output.read_text(encoding="utf-8").splitlines():
        key, sep, value = line.partition("=")
        assert sep, f"{GFD} wrote a line that is no label: {line!r}"
        labels[key] = value
    return labels


def _our_labels(case: Case, env: dict[str, str], sysfs: Path) -> dict[str, str]:
    argv = ["-m", "agent.cli", "discover", "--output", "json", "--mps-pipe-directory", "/nonexistent-mps"]
    argv += ["--sysfs-root", str(sysfs), "--node-name", NODE]
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"discover exited {done.returncode}:\n{done.stderr[-3000:]}"
    inventory = NodeInventory.from_dict(json.loads(done.stdout))
    return node_labels(
        inventory,
        node_name=NODE,
        mig_strategy=case.mig_strategy,
        sharing_strategy=case.sharing,
        replicas=case.replicas,
        shared_renamed=case.renamed,
    )


@pytest.mark.parametrize("name", list(CASES))
def test_gfd_labels_equal_ours(peer: cluster.Counterparts, runner: Runner, tmp_path: Path, name: str) -> None:
    case = CASES[name]
    env, sysfs = runner.stub_env(case.profile)
    unimplemented = tmp_path / "unimplemented"
    env[UNIMPLEMENTED_ENV] = str(unimplemented)

    theirs = {k: v for k, v in _gfd_labels(peer, case, env, tmp_path).items() if COMPARED.match(k)}
    ours = {k: v for k, v in _our_labels(case, env, sysfs).items() if COMPARED.match(k)}

    called = unimplemented_calls(unimplemented)
    assert not called, f"the stand-in lacks NVML functions the programs called: {called}"
    differences = {
        k: (theirs[k], ours[k]) for k in sorted(theirs.keys() & ours.keys()) if theirs[k] != ours[k]
    }
    assert differences == DIFFERENCES.get(name, {}), "labels both write differ (GFD's value, ours)"
    gfd_only = sorted(k for k in theirs.keys() - ours.keys() if not GFD_ONLY.match(k))
    assert not gfd_only, f"GFD writes labels we do not and README.md does not name: {gfd_only}"
    ours_only = sorted(k for k in ours.keys() - theirs.keys() if not OURS_ONLY.match(k))
    assert not ours_only, f"we write labels GFD does not and README.md does not name: {ours_only}"
    # the comparison compared something: the families both write are there on both sides
    for key, value in MUST_MATCH.get(name, {}).items():
        assert (theirs.get(key), ours.get(key)) == (value, value), key
    for key in ("nvidia.com/gpu.product", "nvidia.com/gpu.count", "nvidia.com/cuda.driver-version.full"):
        assert key in theirs.keys() & ours.keys()
