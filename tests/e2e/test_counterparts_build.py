"""The e2e machinery itself: where the binaries are looked for, and what happens when they are missing."""

from __future__ import annotations

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
    assert set(pins) == {"K8S_VERSION", "ETCD_VERSION", "VOLCANO_VERSION", "VOLCANO_APIS_VERSION"}
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
