"""Hostile input and faults on the node side: fault lines, NVML errors during rediscovery, the
device-plugin folder vanishing, bad config files and settings, and abusive GetPreferredAllocation
requests. Each test is bounded in time (seconds) and uses loopback and unix sockets only."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.commands.run import RunContext, serve
from agent.config import RunSettings
from agent.fakekubelet import FakeKubelet, running_kubelet
from deviceplugin.config import parse_plugin_config

GPU = "nvidia.com/gpu"
REPO = Path(__file__).resolve().parents[2]
AGENT = (sys.executable, "-m", "agent.cli", "run", "--no-kube")
NO_HTTP = ("--metrics-addr", "", "--health-addr", "")


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A device-plugin directory whose socket paths stay under the 107-byte limit."""
    with tempfile.TemporaryDirectory(prefix="hn", dir="/tmp") as d:
        yield Path(d)


def append(path: Path, *events: object) -> None:
    with path.open("a", encoding="utf-8") as fh:
        for event in events:
            fh.write((event if isinstance(event, str) else json.dumps(event)) + "\n")


@dataclass
class Agent:
    ctx: RunContext
    kubelet: FakeKubelet
    task: asyncio.Task[int]

    def not_ready(self) -> list[str]:
        return [f"{name}: {why}" for name, check in self.ctx.readiness if (why := check()) is not None]


@contextlib.asynccontextmanager
async def running_agent(
    kubelet_dir: Path,
    *,
    profile: str = "pcie-l40s",
    faults: Path | None = None,
    sysfs_root: Path | None = None,
    **plugin: object,
) -> AsyncIterator[Agent]:
    settings = RunSettings(
        node_name="node-h",
        kubelet_dir=kubelet_dir,
        simulate=profile,
        simulate_faults=faults,
        sysfs_root=sysfs_root,
        no_kube=True,
        metrics_addr="",
        rediscover_interval_s=3600.0,
        plugin=parse_plugin_config(plugin),
    )
    seen: list[RunContext] = []

    def capture(ctx: RunContext) -> None:
        seen.append(ctx)

    async with running_kubelet(kubelet_dir) as kubelet:
        stop = asyncio.Event()
        task = asyncio.create_task(serve(settings, stop=stop, factories=(capture,)))
        try:
            async with asyncio.timeout(20):
                while not seen and not task.done():
                    await asyncio.sleep(0.01)
            if not seen:  # the start failed: its error, not a time-out
                raise AssertionError(f"the agent did not start: {task.exception()!r}")
            yield Agent(ctx=seen[0], kubelet=kubelet, task=task)
        finally:
            stop.set()
            if seen:
                assert await asyncio.wait_for(task, 20) == 0


async def until(predicate: object, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(0.02)


# --------------------------------------------------------------------------- D2: NVML errors


@pytest.mark.parametrize(
    "error",
    [
        pytest.param({"event": "nvml_error", "code": "LIB_RM_VERSION_MISMATCH"}, id="every-call"),
        pytest.param({"event": "nvml_error", "code": "UNKNOWN", "call": "device_get_count"}, id="count"),
    ],
)
def test_d2_nvml_error_during_rediscovery_withdraws_nothing(
    short_dir: Path, error: dict[str, object]
) -> None:
    """D2: an NVML error while rediscovering keeps every device advertised, fails readiness with the
    reason until NVML answers, and an XID 79 during the outage still marks its GPU."""
    faults = short_dir / "faults.jsonl"
    faults.write_text("")

    async def body() -> None:
        async with running_agent(short_dir, faults=faults) as agent:
            kubelet, ctx = agent.kubelet, agent.ctx
            await kubelet.wait_for(lambda: len(kubelet.devices.get(GPU, {})) == 4, timeout=20)
            uuids = sorted(kubelet.devices[GPU])
            gpu2 = ctx.store.inventory.gpu(2).uuid
            assert agent.not_ready() == []

            append(faults, error)
            await asyncio.sleep(0.1)  # the follower applies it
            ctx.rediscovery.request("test")
            await until(lambda: ctx.rediscovery.problem() is not None)
            [line] = agent.not_ready()
            assert line.startswith("discovery: discovery failed")
            assert "NVML did not answer" in line
            assert "VERSION" in line or "Unknown" in line
            assert len(ctx.store.inventory.gpus) == 4
            await asyncio.sleep(0.3)
            assert sorted(kubelet.devices[GPU]) == uuids  # nothing withdrawn

            append(faults, {"event": "xid", "gpu": 2, "xid": 79})
            await asyncio.sleep(0.2)
            append(faults, {"event": "nvml_error", "code": None})
            await kubelet.wait_for(lambda: kubelet.devices[GPU].get(gpu2) == "Unhealthy", timeout=10)
            await until(lambda: ctx.rediscovery.problem() is None, timeout=15)
            assert agent.not_ready() == []
            assert sorted(kubelet.devices[GPU]) == uuids  # the lost GPU stays listed, Unhealthy
            assert ctx.store.health_of(gpu2).reason is not None

    asyncio.run(body())


def test_d2_a_successful_answer_without_a_gpu_withdraws_it(short_dir: Path) -> None:
    """D2: withdrawal happens only when NVML answers that a device is gone (here a MIG device after a
    MIG reconfiguration)."""
    faults = short_dir / "faults.jsonl"
    faults.write_text("")

    async def body() -> None:
        async with running_agent(
            short_dir, profile="dgx-a100-mig", faults=faults, flags={"migStrategy": "mixed"}
        ) as agent:
            kubelet, ctx = agent.kubelet, agent.ctx
            mig_on = [s.gpu_index for s in ctx.store.inventory.mig if s.current_enabled and s.devices]
            before = len(ctx.store.inventory.gpus) - len(mig_on)
            await kubelet.wait_for(lambda: len(kubelet.devices.get(GPU, {})) == before, timeout=20)
            gpu = mig_on[0]
            append(faults, {"event": "mig_reconfig", "gpu": gpu, "profiles": None})
            await kubelet.wait_for(
                lambda: len(kubelet.devices.get("nvidia.com/gpu", {})) == before + 1, timeout=15
            )
            assert ctx.rediscovery.problem() is None

    asyncio.run(body())


# --------------------------------------------------------------------------- D1: fault lines


def _follower(tmp_path: Path, *lines: bytes) -> tuple[object, Path]:
    from agent.nvml.faults import FaultFollower
    from agent.nvml.simulate import build_simulator, parse_spec

    path = tmp_path / "faults.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    sim = build_simulator(parse_spec("pcie-l40s"))
    sim.init()
    return FaultFollower(sim, path), path


def test_d1_deeply_nested_fault_line_is_skipped_and_the_rest_applies(tmp_path: Path) -> None:
    """D1: a line of JSON nested 100,000 deep is one logged error, not a RecursionError; the lines
    around it still apply, and opening the node on the same file works (no crash loop)."""
    from agent.nvml.faults import MAX_DEPTH, MAX_LINE_BYTES, FaultFollower
    from agent.simnode import open_simulated_node

    deep = b"[" * 100_000 + b"]" * 100_000
    within = b"[" * 30_000 + b"]" * 30_000  # under the line limit, still far too deep
    nested_obj = b'{"event":"xid","gpu":0,"xid":' + b'{"a":' * 5_000 + b"1" + b"}" * 5_000 + b"}"
    follower, path = _follower(
        tmp_path,
        b'{"event":"xid","gpu":1,"xid":48}',
        deep,
        within,
        nested_obj,
        b'{"event":"gpu_lost","gpu":2}',
    )
    assert isinstance(follower, FaultFollower)
    assert follower.poll() == 2
    assert [e.split(": ", 1)[1] for e in follower.errors] == [
        f"line longer than {MAX_LINE_BYTES} bytes",
        f"JSON nested deeper than {MAX_DEPTH} levels",
        f"JSON nested deeper than {MAX_DEPTH} levels",
    ]
    with open_simulated_node("pcie-l40s", faults_path=path) as node:
        assert node.faults is not None
        assert node.faults.applied == 2


def test_d1_a_line_too_long_is_dropped_without_being_kept(tmp_path: Path) -> None:
    """A line of several MiB without a newline is reported once and never held whole in memory; the
    next line applies."""
    from agent.nvml.faults import MAX_LINE_BYTES, FaultFollower

    follower, path = _follower(tmp_path)
    assert isinstance(follower, FaultFollower)
    with path.open("ab") as fh:
        fh.write(b'{"event":"xid","gpu":0,"xid":48,"pad":"' + b"x" * (3 * 1024 * 1024))
    assert follower.poll() == 0
    assert len(follower._partial) <= MAX_LINE_BYTES  # the memory bound itself
    append(path, '"}', {"event": "ecc_dbe", "gpu": 1})
    assert follower.poll() == 1
    assert follower.errors == [f"{path}:1: line longer than {MAX_LINE_BYTES} bytes"]


def test_d1_strange_numbers_and_types_in_fault_lines_are_errors(tmp_path: Path) -> None:
    from agent.nvml.faults import FaultFollower

    follower, _ = _follower(
        tmp_path,
        b'{"event":"xid","gpu":' + b"9" * 5000 + b',"xid":79}',
        b'{"event":"xid","gpu":1e400,"xid":79}',
        b'{"event":"xid","gpu":0,"xid":NaN}',
        b"\xff\xfe{}",
        b'"just a string"',
    )
    assert isinstance(follower, FaultFollower)
    assert follower.poll() == 0
    assert len(follower.errors) == 5


# --------------------------------------------------------------------------- D3: the folder vanishes


def test_d3_device_plugin_folder_deleted_while_running(short_dir: Path) -> None:
    """D3: removing the whole device-plugin folder (kubelet's socket with it) does not stop the agent:
    the plugins keep retrying and register again once a kubelet serves the folder again."""
    import shutil

    from agent.runtime import InventoryStore
    from deviceplugin.manager import PluginManager
    from tests.deviceplugin.helpers import inventory

    async def body() -> None:
        store = InventoryStore(inventory("pcie-l40s"))
        kubelet = FakeKubelet(short_dir)
        await kubelet.start()
        manager = PluginManager(
            store=store, config=parse_plugin_config({}), kubelet_dir=short_dir, grace_s=0.1
        )
        stop = asyncio.Event()
        task = asyncio.create_task(manager.run(stop))
        try:
            await kubelet.wait_for(lambda: len(kubelet.registrations) == 1, timeout=10)
            await kubelet.stop()
            shutil.rmtree(short_dir)
            await asyncio.sleep(1.5)  # several ticks and one start retry with the folder gone
            assert not task.done()
            assert not manager.ready()
            short_dir.mkdir(exist_ok=True)  # the agent may have made it again already
            kubelet = FakeKubelet(short_dir)
            await kubelet.start()
            await kubelet.wait_for(lambda: len(kubelet.registrations) == 1, timeout=10)
            await kubelet.wait_for(lambda: len(kubelet.devices.get(GPU, {})) == 4, timeout=10)
            assert manager.ready()
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
            await kubelet.stop()

    asyncio.run(body())


# --------------------------------------------------------------------------- D6, D7, D9: sharing


def _problems(data: dict[str, object]) -> list[str]:
    from deviceplugin.config import ConfigError, parse_plugin_config

    with pytest.raises(ConfigError) as err:
        parse_plugin_config(data, source="c.yaml")
    return err.value.problems


def _time_slicing(**resource: object) -> dict[str, object]:
    return {"sharing": {"timeSlicing": {"resources": [{"name": GPU, "replicas": 4, **resource}]}}}


def test_d6_a_billion_replicas_is_refused_naming_the_limit() -> None:
    """D6: ``replicas: 1000000000`` is one error naming the field and the limit, before anything is
    built (it used to grow memory without end)."""
    from deviceplugin.config import MAX_REPLICAS

    assert _problems(_time_slicing(replicas=1_000_000_000)) == [
        "c.yaml: sharing.timeSlicing.resources[0].replicas: expected an integer from 2 to "
        f"{MAX_REPLICAS}, got 1000000000"
    ]
    parse_plugin_config(_time_slicing(replicas=MAX_REPLICAS))


def test_d6_too_many_devices_for_one_resource_is_a_plan_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replicas within the limit still cannot make one resource list more devices than kubelet's
    messages carry: the plan says how many and the limit."""
    from deviceplugin import resources
    from deviceplugin.config import MAX_REPLICAS
    from deviceplugin.resources import MAX_DEVICES_PER_RESOURCE, ResourceError, build_plan
    from tests.deviceplugin.helpers import inventory

    inv = inventory("dgx-h100")
    assert len(inv.gpus) * MAX_REPLICAS <= MAX_DEVICES_PER_RESOURCE  # 8 GPUs x the most replicas fits
    build_plan(inv, parse_plugin_config(_time_slicing(replicas=MAX_REPLICAS)))
    monkeypatch.setattr(resources, "MAX_DEVICES_PER_RESOURCE", 1000)
    with pytest.raises(ResourceError) as err:
        build_plan(inv, parse_plugin_config(_time_slicing(replicas=200)))
    assert str(err.value) == (
        "nvidia.com/gpu: 1600 devices (8 x 200 replicas) is more than 1000 for one resource; "
        "lower sharing replicas"
    )


@pytest.mark.parametrize(
    ("flags", "resources", "expected"),
    [
        pytest.param(
            {"migStrategy": "mixed"},
            [{"name": GPU, "replicas": 2, "rename": "nvidia.com/mig-1g.10gb"}],
            "sharing.timeSlicing.resources[0].rename: nvidia.com/mig-1g.10gb clashes with the MIG "
            "resources of flags.migStrategy mixed (nvidia.com/mig-<profile>); choose another name",
            id="mig-name-under-mixed",
        ),
        pytest.param(
            {},
            [{"name": "nvidia.com/mig-1g.10gb", "replicas": 2, "rename": GPU}],
            "sharing.timeSlicing.resources[0].rename: nvidia.com/gpu clashes with the whole GPUs' "
            "resource nvidia.com/gpu; choose another name",
            id="whole-gpu-name",
        ),
        pytest.param(
            {},
            [{"name": GPU, "replicas": 2, "rename": GPU}],
            "sharing.timeSlicing.resources[0].rename: the same as name; leave rename out to share "
            "under nvidia.com/gpu",
            id="same-as-name",
        ),
        pytest.param(
            {"migStrategy": "mixed"},
            [
                {"name": "nvidia.com/mig-1g.10gb", "replicas": 2},
                {"name": GPU, "replicas": 2, "rename": "nvidia.com/mig-1g.10gb"},
            ],
            "sharing.timeSlicing.resources[1].rename: nvidia.com/mig-1g.10gb clashes with the MIG "
            "resources of flags.migStrategy mixed (nvidia.com/mig-<profile>); choose another name",
            id="mig-name-listed",
        ),
        pytest.param(
            {"migStrategy": "single"},
            [
                {"name": GPU, "replicas": 2, "rename": "nvidia.com/shared"},
                {"name": "nvidia.com/mig-1g.10gb", "replicas": 2, "rename": "nvidia.com/shared"},
            ],
            "sharing.timeSlicing.resources[1].rename: nvidia.com/shared is also the rename of "
            "resources[0]; each shared resource needs a name of its own",
            id="two-renames",
        ),
    ],
)
def test_d7_a_rename_that_clashes_is_a_config_error(
    flags: dict[str, object], resources: list[object], expected: str
) -> None:
    """D7: a rename onto a name the node already advertises (a MIG resource under mixed, the whole
    GPUs, another shared resource) is refused, naming the clash; it used to make the real MIG devices
    vanish behind replicas of whole GPUs."""
    problems = _problems({"flags": flags, "sharing": {"timeSlicing": {"resources": resources}}})
    assert problems == [f"c.yaml: {expected}"]


def test_d7_the_plan_never_lets_a_rename_replace_a_resource() -> None:
    """Defence in depth: even a config that slipped past validation cannot hide another resource."""
    from deviceplugin.config import MigStrategy, PluginConfig, SharedResource, Sharing, SharingStrategy
    from deviceplugin.resources import ResourceError, build_plan
    from tests.deviceplugin.helpers import inventory

    config = PluginConfig(
        mig_strategy=MigStrategy.MIXED,
        sharing=Sharing(
            strategy=SharingStrategy.TIME_SLICING,
            resources=(SharedResource(name=GPU, replicas=2, rename="nvidia.com/mig-1g.10gb"),),
        ),
    )
    with pytest.raises(ResourceError, match=r"clashes with nvidia\.com/mig-1g\.10gb"):
        build_plan(inventory("dgx-a100-mig"), config)


def test_d9_device_entries_of_the_wrong_shape_are_config_errors() -> None:
    """D9: entries that cannot name a device are refused one by one with their position."""
    assert _problems(_time_slicing(devices=[99, "GPU-nope", "0:9", -1, "x:y", 1.5])) == [
        "c.yaml: sharing.timeSlicing.resources[0].devices[1]: 'GPU-nope' is not a GPU index, "
        "'<gpu>:<mig>' or a GPU-/MIG- UUID",
        "c.yaml: sharing.timeSlicing.resources[0].devices[3]: -1 is not a GPU index, "
        "'<gpu>:<mig>' or a GPU-/MIG- UUID",
        "c.yaml: sharing.timeSlicing.resources[0].devices[4]: 'x:y' is not a GPU index, "
        "'<gpu>:<mig>' or a GPU-/MIG- UUID",
        "c.yaml: sharing.timeSlicing.resources[0].devices[5]: 1.5 is not a GPU index, "
        "'<gpu>:<mig>' or a GPU-/MIG- UUID",
    ]


def test_d9_device_entries_that_name_nothing_here_stop_the_start(short_dir: Path) -> None:
    """D9: ``devices: [99, "GPU-<unknown>", "0:9"]`` on an 8-GPU node is an error naming each entry
    (exit 1 before anything is served); it used to be silently ignored."""
    from deviceplugin.resources import build_plan
    from tests.deviceplugin.helpers import inventory

    unknown = "GPU-00000000-0000-0000-0000-000000000000"
    config = parse_plugin_config(_time_slicing(devices=[99, unknown, "0:9", 1]))
    plan = build_plan(inventory("dgx-h100"), config)
    assert plan.unmatched == (
        f"sharing.timeSlicing.resources[0].devices: 99, {unknown!r}, '0:9' name no device of "
        "nvidia.com/gpu on this node",
    )
    cfg = short_dir / "c.yaml"
    cfg.write_text(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        f"      - {{name: nvidia.com/gpu, replicas: 2, devices: [99, {unknown}, '0:9']}}\n"
    )
    proc = subprocess.run(
        [*AGENT, "--simulate", "dgx-h100", "--kubelet-dir", str(short_dir), "--config", str(cfg), *NO_HTTP],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    err = proc.stderr.strip()
    assert proc.returncode == 1, err
    assert err.count("\n") == 0
    assert "99" in err
    assert unknown in err
    assert "'0:9'" in err
    assert list(short_dir.glob("nvidia-*.sock")) == []


# --------------------------------------------------------------------------- D8, D10, D11: settings


def _run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from agent.commands import run as run_command

    code = run_command.main(argv)
    return code, capsys.readouterr().err.strip()


def _settings_problems(argv: list[str], env: dict[str, str] | None = None) -> list[str]:
    import argparse

    from agent.config import add_arguments, load_settings
    from deviceplugin.config import ConfigError

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ConfigError) as err:
        load_settings(parser.parse_args(argv), env or {})
    return err.value.problems


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(
            b"version: v1\nnodeName: caf\xe9\n", "not UTF-8 text (byte 0xe9 at offset 25)", id="latin1"
        ),
        pytest.param(b"\xff\xfev\x00e\x00r\x00", "not UTF-8 text (byte 0xff at offset 0)", id="utf16"),
        pytest.param(b"version: v1\nflags: " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested deeper", id="deep"),
        pytest.param(
            b"version: v1\na: &a [x, x, x, x, x, x, x, x, x, x]\n"
            b"b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
            b"c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
            b"d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
            b"nodeName: [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n",
            "aliases repeat more than",
            id="laughs",
        ),
        pytest.param(b"version: v1\nreplicas: " + b"9" * 5000 + b"\n", "digits", id="long-int"),
    ],
)
def test_d8_a_config_file_that_cannot_be_read_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, expected: str
) -> None:
    """D8: a config file that is not UTF-8 (or nested too deep, or a billion laughs) is one line naming
    the file and what is wrong, exit 2, before anything starts; it used to be a traceback and exit 1."""
    path = tmp_path / "agent.yaml"
    path.write_bytes(content)
    code, err = _run_main(["--config", str(path), "--simulate", "pcie-l40s", "--no-kube"], capsys)
    assert code == 2
    assert err.count("\n") == 0, err
    assert str(path) in err
    assert expected in err


@pytest.mark.parametrize(
    ("argv", "env", "file", "expected"),
    [
        pytest.param(
            [],
            {},
            "metricsIntervalSeconds: 1e-300",
            "metricsIntervalSeconds: expected seconds from 0.1 to 3600, got 1e-300",
            id="file-tiny",
        ),
        pytest.param(
            ["--metrics-interval", "1e-300"],
            {},
            "",
            "--metrics-interval: expected seconds from 0.1 to 3600, got 1e-300",
            id="cli-tiny",
        ),
        pytest.param(
            [],
            {"GPU_NODE_AGENT_REDISCOVER_INTERVAL": "inf"},
            "",
            "env GPU_NODE_AGENT_REDISCOVER_INTERVAL: expected seconds from 1 to 86400, got inf",
            id="env-inf",
        ),
        pytest.param(
            ["--pod-resources-interval", "nan"],
            {},
            "",
            "--pod-resources-interval: expected seconds from 0.1 to 3600, got nan",
            id="nan",
        ),
        pytest.param(
            [],
            {},
            "shutdownGraceSeconds: 1e9",
            "shutdownGraceSeconds: expected seconds from 0.1 to 300, got 1e9",
            id="grace",
        ),
        pytest.param(
            [],
            {},
            "registrationCheckSeconds: 0.001",
            "registrationCheckSeconds: expected seconds from 1 to 3600, got 0.001",
            id="check",
        ),
        pytest.param(
            [],
            {},
            "health: {probeIntervalSeconds: 1.0e+300}",
            "health.probeIntervalSeconds: expected a number from 0.01 to 3600, got 1e+300",
            id="probe",
        ),
        pytest.param(
            [],
            {},
            "health: {recoveryQuietSeconds: .inf}",
            "health.recoveryQuietSeconds: expected a number from 0 to 86400, got inf",
            id="quiet",
        ),
    ],
)
def test_d10_every_interval_is_bounded(
    tmp_path: Path, argv: list[str], env: dict[str, str], file: str, expected: str
) -> None:
    """D10: a tiny (or infinite, or NaN) interval is refused naming the setting and its range; it used
    to keep a core busy forever."""
    path = tmp_path / "agent.yaml"
    path.write_text(f"version: v1\n{file}\n")
    [problem] = _settings_problems([*argv, "--config", str(path)], env)
    assert problem.endswith(expected), problem


@pytest.mark.parametrize(
    ("addr", "why"),
    [
        pytest.param("999.1.1.1:80", "999.1.1.1 is not an IPv4 address", id="octet"),
        pytest.param("1.2.3:80", "1.2.3 is not an IPv4 address", id="short"),
        pytest.param("my_host:80", "'my_host' is not an IP address or host name", id="underscore"),
        pytest.param("::1:80", "an IPv6 address needs brackets: [::1]:80", id="v6-bare"),
        pytest.param("[fe80::zz]:80", "'fe80::zz' is not an IPv6 address", id="v6-bad"),
        pytest.param("127.0.0.1:99999", "expected HOST:PORT", id="port"),
        pytest.param("127.0.0.1:\u00b2", "expected HOST:PORT", id="superscript-port"),
        pytest.param("192.0.2.1:9400", "cannot listen on 192.0.2.1", id="not-local"),
    ],
)
def test_d11_listen_addresses_are_checked_at_settings_time(tmp_path: Path, addr: str, why: str) -> None:
    """D11: a listen address that cannot work is a settings problem naming the key and why."""
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"version: v1\nmetricsAddr: '{addr}'\nhealthAddr: ''\n")
    [problem] = _settings_problems(["--config", str(cfg)])
    assert problem.startswith(f"{cfg}: metricsAddr: "), problem
    assert why in problem


def test_d11_a_bad_address_exits_2_before_any_plugin_registers(short_dir: Path) -> None:
    """D11: ``metricsAddr: 999.1.1.1:80`` is exit 2 with one line and no socket ever made; it used to
    exit 1 only after the plugins had registered."""
    cfg = short_dir / "agent.yaml"
    cfg.write_text("version: v1\nmetricsAddr: 999.1.1.1:80\n")
    proc = subprocess.run(
        [*AGENT, "--simulate", "pcie-l40s", "--kubelet-dir", str(short_dir), "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    err = proc.stderr.strip()
    assert proc.returncode == 2, err
    assert err == f"gpu-node-agent run: {cfg}: metricsAddr: 999.1.1.1 is not an IPv4 address"
    assert list(short_dir.glob("*.sock")) == []


@pytest.mark.parametrize("addr", ["127.0.0.1:0", "[::]:9400", "localhost:9400", ":9400", "0.0.0.0:9400", ""])
def test_d11_good_listen_addresses_pass(addr: str) -> None:
    import argparse

    from agent.config import add_arguments, load_settings

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--metrics-addr", addr, "--health-addr", ""])
    assert load_settings(args, {}).metrics_addr == addr


# --------------------------------------------------------------------------- D4, D5: preferred allocation


@contextlib.asynccontextmanager
async def serving(short_dir: Path, config: dict[str, object], resource: str = GPU) -> AsyncIterator[object]:
    """One resource's plugin server on a unix socket, and a stub to call it."""
    import grpc.aio

    from deviceplugin.api import deviceplugin_pb2_grpc as pb_grpc
    from deviceplugin.preferred import topology_from_inventory
    from deviceplugin.resources import build_plan
    from deviceplugin.server import PluginServer, PluginState
    from tests.deviceplugin.helpers import inventory
    from tests.deviceplugin.test_node import Node

    node = Node(inventory("dgx-h100"))
    plugin = parse_plugin_config(config)
    state = PluginState(
        resource=build_plan(node.inventory, plugin).by_name()[resource],
        topology=topology_from_inventory(node.inventory),
        config=plugin,
        health=node,
    )
    server = PluginServer(state=state, socket_path=short_dir / "p.sock", grace_s=0.1)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{short_dir / 'p.sock'}") as channel:
            yield pb_grpc.DevicePluginStub(channel)
    finally:
        await server.stop()


def _preferred(available: list[str], must: list[str], size: int) -> object:
    from deviceplugin.api import deviceplugin_pb2 as pb

    return pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
            )
        ]
    )


def test_d4_preferred_allocation_with_an_unknown_must_include_is_invalid_argument(short_dir: Path) -> None:
    """D4: ``must_include: ["GPU-bogus"]`` is refused with INVALID_ARGUMENT naming the ID; it used to
    come back as if it were a device of the resource."""
    import grpc

    async def body() -> None:
        async with serving(short_dir, {}) as stub:
            ids = sorted(d for d in [g.uuid for g in (await _inventory_gpus())])
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GetPreferredAllocation(  # type: ignore[attr-defined]
                    _preferred([*ids, "GPU-bogus"], ["GPU-bogus", ids[0]], 2), timeout=5
                )
            assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert err.value.details() == "must_include names devices nvidia.com/gpu does not have: GPU-bogus"
            ok = await stub.GetPreferredAllocation(_preferred([*ids, "GPU-bogus"], [ids[0]], 2), timeout=5)  # type: ignore[attr-defined]
            [answer] = ok.container_responses
            assert len(answer.deviceIDs) == 2
            assert answer.deviceIDs[0] == ids[0]
            assert "GPU-bogus" not in answer.deviceIDs  # unknown available IDs are still just skipped

    asyncio.run(body())


async def _inventory_gpus() -> tuple[object, ...]:
    from tests.deviceplugin.helpers import inventory

    return inventory("dgx-h100").gpus  # type: ignore[return-value]


def test_d5_a_huge_preferred_allocation_never_stalls_the_event_loop(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """D5: size 2,000 over 8,000 replicas is answered, spread evenly, and the choice runs in a worker
    thread, never on the event loop (it used to spend 4.9 s on the loop); Allocate of the 2,000 follows."""
    import threading

    from deviceplugin import server as server_module

    threads: list[int] = []
    choose = server_module.preferred_allocation

    def recorded(**kwargs: object) -> tuple[str, ...]:
        threads.append(threading.get_ident())
        return choose(**kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(server_module, "preferred_allocation", recorded)

    async def body() -> None:
        config = _time_slicing(replicas=1000)
        async with serving(short_dir, config) as stub:
            gpus = [g.uuid for g in await _inventory_gpus()]  # type: ignore[attr-defined]
            ids = [f"{g}::{n}" for g in gpus for n in range(1000)]
            reply = await stub.GetPreferredAllocation(_preferred(ids, ids[:5], 2000), timeout=30)  # type: ignore[attr-defined]
            [answer] = reply.container_responses
            assert len(answer.deviceIDs) == 2000
            assert list(answer.deviceIDs[:5]) == ids[:5]
            per_gpu = {g: sum(1 for d in answer.deviceIDs if d.startswith(g)) for g in gpus}
            assert max(per_gpu.values()) - min(per_gpu.values()) <= 5  # spread evenly
            assert threads, "the preferred allocation was not computed"
            assert threading.get_ident() not in threads  # off the event loop's thread

            allocated = await stub.Allocate(  # type: ignore[attr-defined]
                pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids[:2000])]),
                timeout=30,
            )
            assert allocated.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"].count("GPU-") == 2

    from deviceplugin.api import deviceplugin_pb2 as pb

    asyncio.run(body())


def test_d12_stream_after_stream_never_takes_the_threads_allocate_needs(short_dir: Path) -> None:
    """D12: the plugin's server answers from a pool of threads, one per call in progress. A client with
    the socket (or a kubelet that reconnects without closing) opening ListAndWatch after ListAndWatch
    would hold them all; the server keeps the newest streams only (kubelet's current one is the newest),
    ending the older ones, and Allocate is still answered."""
    import grpc.aio

    from deviceplugin.api import deviceplugin_pb2 as pb
    from deviceplugin.server import MAX_STREAMS, SERVER_THREADS

    async def body() -> None:
        async with serving(short_dir, {}) as stub:
            streams = []
            for _ in range(SERVER_THREADS + 4):
                stream = stub.ListAndWatch(pb.Empty())  # type: ignore[attr-defined]
                first = await stream.read()
                streams.append(stream)
            ids = sorted(d.ID for d in first.devices)
            allocated = await stub.Allocate(  # type: ignore[attr-defined]
                pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids[:1])]),
                timeout=10,
            )
            assert allocated.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == ids[0]
            for stream in streams[:-MAX_STREAMS]:
                assert await asyncio.wait_for(stream.read(), 10) is grpc.aio.EOF  # ended by the server
            for stream in streams:
                stream.cancel()

    asyncio.run(body())


def _old_replica_pick(
    candidates: dict[str, object],
    *,
    avail: list[str],
    must: list[str],
    need: int,
    used: dict[str, int],
    policy: object,
    topology: object,
) -> list[str]:
    """The replica choice as it was before D5 (quadratic), the reference the faster one must match."""
    from deviceplugin.preferred import Policy, _links_to

    free: dict[str, list[str]] = {}
    for d in sorted(avail):
        free.setdefault(candidates[d].gpu, []).append(d)  # type: ignore[attr-defined]
    picked = [candidates[d].gpu for d in must if d in candidates]  # type: ignore[attr-defined]
    load = dict(used)
    for g in picked:
        load[g] = load.get(g, 0) + 1
    out: list[str] = []
    while len(out) < need and any(free.values()):
        options = [g for g, ds in free.items() if ds]
        if policy is Policy.SPREAD:
            gpu = min(options, key=lambda g: (load.get(g, 0), -_links_to(topology, g, picked), g))  # type: ignore[arg-type]
        else:
            gpu = min(options, key=lambda g: (-load.get(g, 0), g))
        out.append(free[gpu].pop(0))
        picked.append(gpu)
        load[gpu] = load.get(gpu, 0) + 1
    return out


@pytest.mark.parametrize("profile", ["dgx1-v100", "pcie-l40s", "dgx-h100"])
def test_d5_replica_choices_are_those_of_before_for_normal_sizes(profile: str) -> None:
    """D5: the faster replica choice answers exactly as before on every request of a seeded sample."""
    import random

    from deviceplugin.preferred import Candidate, DeviceKind, Policy, _replica_pick, topology_from_inventory
    from tests.deviceplugin.helpers import inventory

    inv = inventory(profile)
    topo = topology_from_inventory(inv)
    rng = random.Random(16)
    for _ in range(150):
        replicas = rng.randint(2, 6)
        cands = {
            f"{g.uuid}::{n}": Candidate(id=f"{g.uuid}::{n}", gpu=g.uuid, kind=DeviceKind.REPLICA)
            for g in inv.gpus
            for n in range(replicas)
        }
        ids = sorted(cands)
        avail = rng.sample(ids, rng.randint(1, len(ids)))
        must = rng.sample(avail, rng.randint(0, min(2, len(avail))))
        rest = [d for d in avail if d not in must]
        need = rng.randint(1, len(ids))
        used = {g.uuid: rng.randint(0, 3) for g in inv.gpus}
        policy = rng.choice([Policy.SPREAD, Policy.PACK])
        assert _replica_pick(
            cands, avail=rest, must=must, need=need, used=dict(used), policy=policy, topology=topo
        ) == _old_replica_pick(
            cands,  # type: ignore[arg-type]
            avail=rest,
            must=must,
            need=need,
            used=used,
            policy=policy,
            topology=topo,
        )


# ---------------------------------------------------------------- issue 26: sysfs, pod-resources, config


def _ib_tree(root: Path) -> tuple[Path, list[tuple[str, int]]]:
    """The dgx-h100 simulator's sysfs under ``root``: its ``class/infiniband`` folder and every port."""
    from agent.nvml.sim_sysfs import write_sysfs
    from agent.nvml.simulate import parse_spec

    machine = write_sysfs(root, parse_spec("dgx-h100"))
    return root / "class" / "infiniband", sorted((h.device, p.port) for h in machine.hcas for p in h.ports)


def _fw_ver_a_directory(hca: Path) -> str:
    (hca / "fw_ver").unlink()
    (hca / "fw_ver").mkdir()
    return f"{hca / 'fw_ver'}: not a regular file (a directory); attribute skipped"


def _hca_type_latin1(hca: Path) -> str:
    (hca / "hca_type").write_bytes(b"MT\xe94129\n")
    return f"{hca / 'hca_type'}: not UTF-8 text (byte 0xe9 at offset 2); attribute skipped"


def _dev_port_superscript(hca: Path) -> str:
    [netdev] = (hca / "device" / "net").iterdir()
    (netdev / "dev_port").write_text("\u00b2\n", encoding="utf-8")
    return f"{hca / 'device' / 'net' / netdev.name / 'dev_port'}: not a port number: '\u00b2'; netdev "


def _port_dir_superscript(hca: Path) -> str:
    (hca / "ports" / "\u00b2").mkdir()
    return f"{hca / 'ports' / chr(0xB2)}: port directory name is not a number; skipped"


def _port_dir_arabic_digit(hca: Path) -> str:
    (hca / "ports" / "\u0661").mkdir()  # ARABIC-INDIC DIGIT ONE: int() reads it as 1
    return f"{hca / 'ports' / chr(0x661)}: port directory name is not a number; skipped"


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(_fw_ver_a_directory, id="fw-ver-directory"),
        pytest.param(_hca_type_latin1, id="hca-type-not-utf8"),
        pytest.param(_dev_port_superscript, id="dev-port-superscript"),
        pytest.param(_port_dir_superscript, id="port-dir-superscript"),
        pytest.param(_port_dir_arabic_digit, id="port-dir-arabic-digit"),
    ],
)
def test_i18_a_strange_infiniband_attribute_is_one_error_line_and_run_starts(
    short_dir: Path, damage: object
) -> None:
    """Issue 26 item 18: an optional IB attribute that is a directory or not UTF-8, a ``dev_port`` or a
    port directory named with a non-ASCII digit is one error line; ``run`` starts and keeps every port
    (it used to exit 1 with a traceback)."""
    sysfs = short_dir / "sys"
    ib, ports = _ib_tree(sysfs)
    expected = damage(ib / "mlx5_0")  # type: ignore[operator]

    async def body() -> None:
        async with running_agent(short_dir, profile="dgx-h100", sysfs_root=sysfs) as agent:
            kubelet, inventory = agent.kubelet, agent.ctx.store.inventory
            await kubelet.wait_for(lambda: len(kubelet.devices.get(GPU, {})) == 8, timeout=20)
            assert sorted((p.device, p.port) for p in inventory.ib) == ports
            [line] = [e for e in inventory.errors if "infiniband" in e]
            assert line.startswith(expected), line
            assert "\n" not in line
            assert agent.not_ready() == []

    asyncio.run(body())


_BOUNDED = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from pathlib import Path
from agent.host import read_host
from agent.ib import read_ib
root = Path(sys.argv[1])
host = read_host(sysfs_root=root / "sys", proc_root=root / "proc", hostname="n")
scan = read_ib(root / "sys")
print(json.dumps({"cpus": host.cpu_count, "uuid": host.system_uuid, "numa": [n.cpus for n in host.numa_nodes],
                  "ports": len(scan.ports), "firmware": sorted({str(p.firmware) for p in scan.ports}),
                  "errors": list(scan.errors)}))
"""


def _read_bounded(root: Path) -> dict[str, object]:
    """:func:`read_host` and :func:`read_ib` over ``root`` in a child with 1 GiB of address space and a
    time limit, so a read without end fails this test instead of the machine."""
    proc = subprocess.run(
        [sys.executable, "-c", _BOUNDED, str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out: dict[str, object] = json.loads(proc.stdout)
    return out


def test_i20_cpu_ranges_are_bounded(tmp_path: Path) -> None:
    """Issue 26 item 20: ``cpu/online`` of ``0-4294967295`` (and a NUMA node's ``cpulist`` alike) is
    refused, not built as four billion ints; the CPU count falls back to the kernel's."""
    import os

    sysfs = tmp_path / "sys"
    (sysfs / "devices" / "system" / "cpu").mkdir(parents=True)
    (sysfs / "devices" / "system" / "cpu" / "online").write_text("0-4294967295\n")
    (sysfs / "devices" / "system" / "node" / "node0").mkdir(parents=True)
    (sysfs / "devices" / "system" / "node" / "node0" / "cpulist").write_text("0-3,8-4294967295\n")
    (sysfs / "devices" / "system" / "node" / "node1").mkdir(parents=True)
    (sysfs / "devices" / "system" / "node" / "node1" / "cpulist").write_text("4-7\n")
    out = _read_bounded(tmp_path)
    assert out["cpus"] == os.cpu_count()
    assert out["numa"] == ["", "4-7"]


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_i20_a_file_without_end_is_refused_and_the_rest_read(tmp_path: Path, kind: str) -> None:
    """Issue 26 item 20: ``product_uuid`` (and an IB ``fw_ver``) linked to ``/dev/zero`` or made a FIFO
    is skipped: no read for ever, no open that waits for a writer; everything else is read."""
    import os

    ib, ports = _ib_tree(tmp_path / "sys")
    dmi = tmp_path / "sys" / "class" / "dmi" / "id"
    dmi.mkdir(parents=True, exist_ok=True)
    for path in (dmi / "product_uuid", ib / "mlx5_3" / "fw_ver"):
        path.unlink(missing_ok=True)
        if kind == "fifo":
            os.mkfifo(path)
        else:
            path.symlink_to("/dev/zero")
    what = "a FIFO" if kind == "fifo" else "a character device"
    out = _read_bounded(tmp_path)
    assert out["uuid"] is None
    assert out["ports"] == len(ports)
    assert out["errors"] == [f"{ib / 'mlx5_3' / 'fw_ver'}: not a regular file ({what}); attribute skipped"]
    assert out["firmware"] == ["28.39.2048", "None"]


def test_i19_a_strange_replica_id_from_pod_resources_is_an_unknown_device(short_dir: Path) -> None:
    """Issue 26 item 19: pod-resources naming ``GPU-<uuid>::²`` or a 5,000-digit replica is an unknown
    device ID: the agent keeps serving (plugins, metrics), and the good pods are still attributed. It
    used to stop the whole agent at the exporter's first refresh, withdrawing every GPU."""
    from agent.metrics.wiring import Listeners, listeners_for_run
    from agent.podresources.fake import FakeContainer, FakePod, FakePodResourcesServer

    sock = short_dir / "pr.sock"
    listeners: list[Listeners] = []

    def metrics(ctx: RunContext) -> Listeners | None:
        made = listeners_for_run(ctx)
        if made is not None:
            listeners.append(made)
        return made

    async def body() -> None:
        from tests.deviceplugin.helpers import inventory

        uuid = inventory("pcie-l40s").gpus[0].uuid
        pods = (
            FakePod("ml", "good", (FakeContainer("main", {GPU: [f"{uuid}::1"]}),)),
            FakePod("ml", "sup", (FakeContainer("main", {GPU: [f"{uuid}::\u00b2"]}),)),
            FakePod("ml", "long", (FakeContainer("main", {GPU: [f"{uuid}::{'9' * 5000}"]}),)),
        )
        settings = RunSettings(
            node_name="node-h",
            kubelet_dir=short_dir,
            simulate="pcie-l40s",
            no_kube=True,
            metrics_addr="127.0.0.1:0",
            pod_resources_socket=sock,
            rediscover_interval_s=3600.0,
        )
        async with (
            FakePodResourcesServer(str(sock), pods=pods, allocatable=None),
            running_kubelet(short_dir) as kubelet,
        ):
            stop = asyncio.Event()
            task = asyncio.create_task(serve(settings, stop=stop, factories=(metrics,)))
            try:
                async with asyncio.timeout(20):
                    while not listeners:
                        await asyncio.sleep(0.01)
                    exporter = listeners[0].exporter
                    assert exporter is not None
                    serving = asyncio.ensure_future(exporter.serving.wait())
                    await asyncio.wait({serving, task}, return_when=asyncio.FIRST_COMPLETED)
                    serving.cancel()
                    assert not task.done(), task.exception()
                await kubelet.wait_for(lambda: len(kubelet.devices.get(GPU, {})) == 4, timeout=20)
                held = [(a.owner.pod, a.device_id) for a in exporter.cache.snapshot().allocations]
                assert held == [("good", f"{uuid}::1")]
                assert await exporter.cache.refresh_guarded()
                assert not task.done()
            finally:
                stop.set()
            assert await asyncio.wait_for(task, 20) == 0

    asyncio.run(body())


@pytest.mark.parametrize(
    ("keys", "shown"),
    [
        pytest.param("5: x\nfoo: y\n", ["5", "foo"], id="int"),
        pytest.param("~: x\nfoo: y\n", ["None", "foo"], id="null"),
        pytest.param("1.5: x\ntrue: y\nfoo: z\n", ["1.5", "True", "foo"], id="float-and-bool"),
        pytest.param(f"{'k' * 1000}: x\n7: y\n", ["k" * 61 + "...", "7"], id="long"),
    ],
)
def test_i21_a_top_level_key_that_is_not_text_is_one_line_and_exit_2(
    short_dir: Path, keys: str, shown: list[str]
) -> None:
    """Issue 26 item 21: an int, null or other non-text top-level key beside an unknown one is one line
    per key naming it, exit 2, before anything starts (sorting the keys used to end in a traceback)."""
    cfg = short_dir / "agent.yaml"
    cfg.write_text(f"version: v1\n{keys}")
    proc = subprocess.run(
        [*AGENT, "--simulate", "pcie-l40s", "--kubelet-dir", str(short_dir), "--config", str(cfg), *NO_HTTP],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert [line.split(": ")[2] for line in lines] == sorted(shown)
    assert all(line.startswith(f"gpu-node-agent run: {cfg}: ") and "unknown key" in line for line in lines)
    assert list(short_dir.glob("*.sock")) == []


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_i21_a_config_path_that_is_not_a_regular_file_is_refused(short_dir: Path, kind: str) -> None:
    """Issue 26 item 21: ``--config`` naming a FIFO (whose open waits for a writer), ``/dev/zero`` or a
    folder is one line naming the path, exit 2, at once; the FIFO used to block ``run`` at start."""
    import os

    cfg = short_dir / "agent.yaml"
    if kind == "fifo":
        os.mkfifo(cfg)
        what = "a FIFO"
    elif kind == "dev-zero":
        cfg.symlink_to("/dev/zero")
        what = "a character device"
    else:
        cfg.mkdir()
        what = "a directory"
    proc = subprocess.run(
        [*AGENT, "--simulate", "pcie-l40s", "--kubelet-dir", str(short_dir), "--config", str(cfg), *NO_HTTP],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip() == f"gpu-node-agent run: {cfg}: not a regular file ({what})"
