"""The e2e machinery itself: where the binaries are looked for, and what happens when they are missing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from agent import localcluster as cluster
from tests.e2e import conftest

pytestmark = pytest.mark.e2e

BUILD = cluster.COUNTERPARTS_SRC / "build.sh"


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({"HOME": "/home/someone"}, id="home"),
        pytest.param({"HOME": "/home/someone", "XDG_CACHE_HOME": "/var/cache/x"}, id="xdg-cache-home"),
    ],
)
def test_python_looks_where_build_sh_builds(env: dict[str, str]) -> None:
    printed = subprocess.run(
        ["bash", str(BUILD), "--print-dir"],
        env={"PATH": "/usr/bin:/bin", **env},
        check=True,
        capture_output=True,
    ).stdout.decode()
    assert Path(printed.strip()) == cluster.default_counterparts_dir(env)


def test_directory_override() -> None:
    assert cluster.default_counterparts_dir({cluster.DIR_ENV: "/opt/prebuilt"}) == Path("/opt/prebuilt")


def test_versions_file_names_every_pin() -> None:
    pins = cluster.versions()
    assert set(pins) == {
        "K8S_VERSION",
        "ETCD_VERSION",
        "VOLCANO_VERSION",
        "VOLCANO_APIS_VERSION",
        "KUBERAY_VERSION",
        "KUEUE_VERSION",
        "NVIDIA_DEVICE_PLUGIN_VERSION",
    }
    assert all(v.startswith("v") for v in pins.values())


def test_missing_binary_names_the_build_script(tmp_path: Path) -> None:
    with pytest.raises(
        cluster.MissingCounterpartError, match=r"kube-apiserver: no executable at .*build\.sh"
    ):
        cluster.Counterparts(tmp_path).check(["kube-apiserver"])
    with pytest.raises(cluster.MissingCounterpartError, match="Volcano CRDs"):
        cluster.Counterparts(tmp_path).volcano_crds()


def test_missing_counterpart_fails_unless_e2e_is_optional(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(conftest.OPTIONAL_ENV, raising=False)
    with pytest.raises(pytest.fail.Exception, match=f"etcd missing .*{conftest.OPTIONAL_ENV}=1"):
        conftest._unavailable("etcd missing")
    monkeypatch.setenv(conftest.OPTIONAL_ENV, "1")
    with pytest.raises(pytest.skip.Exception, match="etcd missing"):
        conftest._unavailable("etcd missing")


def _keys(counterparts_dir: Path) -> dict[str, str]:
    """``build.sh --print-keys`` of a copy of the counterparts folder: component -> cache folder name."""
    out = subprocess.run(
        ["bash", str(counterparts_dir / "build.sh"), "--print-keys"],
        env={"PATH": "/usr/bin:/bin", "HOME": str(counterparts_dir)},
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {line.split("-", 1)[0]: line for line in out.split()}


def test_each_component_is_cached_under_its_own_pins(tmp_path: Path) -> None:
    src = tmp_path / "counterparts"
    shutil.copytree(cluster.COUNTERPARTS_SRC, src)
    before = _keys(src)
    assert set(before) == {
        "kubernetes",
        "kube_controller_manager",
        "volcano",
        "kuberay",
        "kueue",
        "nvidia_device_plugin",
    }
    versions = src / "versions.env"
    text = versions.read_text()
    versions.write_text(text + "# a new counterpart\nSOMETHING_VERSION=v1.0.0\n")
    assert _keys(src) == before  # adding a pin rebuilds nothing that does not use it
    pins = cluster.versions()
    versions.write_text(text.replace(f"KUEUE_VERSION={pins['KUEUE_VERSION']}", "KUEUE_VERSION=v9.9.9"))
    after = _keys(src)
    assert {k for k in before if before[k] != after[k]} == {"kueue"}
    (src / "hollownode" / "main.go").write_text("package main // changed\n")
    assert {k for k in before if before[k] != _keys(src)[k]} == {"kueue", "kubernetes"}
    nvidia = f"NVIDIA_DEVICE_PLUGIN_VERSION={pins['NVIDIA_DEVICE_PLUGIN_VERSION']}"
    versions.write_text(versions.read_text().replace(nvidia, "NVIDIA_DEVICE_PLUGIN_VERSION=v9.9.9"))
    assert {k for k in before if before[k] != _keys(src)[k]} == {
        "kueue",
        "kubernetes",
        "nvidia_device_plugin",
    }
