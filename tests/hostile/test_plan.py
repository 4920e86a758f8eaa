"""Hostile plan files: gangs too large to plan, files that are not UTF-8, nested too deep, alias bombs
and integers too long. Each is one line naming the file or field and the limit, exit 2, in well under
a second and without a large allocation."""

from __future__ import annotations

import json
import logging
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.commands.plan import main
from scheduler_plugin.snapshot import MAX_GANG_PODS

CLUSTER = {
    "tiers": ["nvlink", "leaf"],
    "nodes": [
        {"name": f"n{i}", "gpus": 4, "free": 4, "domains": {"nvlink": f"nvl{i // 2}", "leaf": "leaf-0"}}
        for i in range(4)
    ],
}


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


def run_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cluster: bytes, gang: bytes
) -> tuple[int, str]:
    (tmp_path / "c.yaml").write_bytes(cluster)
    (tmp_path / "g.yaml").write_bytes(gang)
    code = main(["--cluster", str(tmp_path / "c.yaml"), "--gang", str(tmp_path / "g.yaml")])
    out = capsys.readouterr()
    return code, out.err.strip() if code else out.out


def role(**fields: object) -> bytes:
    return json.dumps({"name": "g", "roles": [{"name": "w", "gpus_per_pod": 1, **fields}]}).encode()


@pytest.fixture
def bounded_memory() -> Iterator[None]:
    """A runaway allocation fails fast instead of filling the machine (2 GiB more than now)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as fh:
        now = int(fh.read().split()[0]) * resource.getpagesize()
    limit = now + 2 * 1024**3
    resource.setrlimit(
        resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard)
    )
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_p1_a_billion_pods_is_one_line_naming_the_field_and_the_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bounded_memory: None
) -> None:
    """P1: ``pods: 1000000000, subgroup_size: 1`` used to end in a MemoryError traceback."""
    code, err = run_plan(
        tmp_path,
        capsys,
        json.dumps(CLUSTER).encode(),
        role(pods=1_000_000_000, subgroup_size=1, subgroup_tier=1),
    )
    assert code == 2
    assert err == (
        f"plan: gang.roles[0].pods: 1000000000 is more than {MAX_GANG_PODS}, the most pods one gang may have"
    )


def test_p1_the_limit_counts_every_role_of_the_gang(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    half = MAX_GANG_PODS // 2 + 1
    gang = {
        "name": "g",
        "roles": [
            {"name": "a", "pods": half, "gpus_per_pod": 0},
            {"name": "b", "pods": half, "gpus_per_pod": 0},
        ],
    }
    code, err = run_plan(tmp_path, capsys, json.dumps(CLUSTER).encode(), json.dumps(gang).encode())
    assert code == 2
    assert err == (
        f"plan: gang.roles[1].pods: the gang's roles have {2 * half} pods together, more than "
        f"{MAX_GANG_PODS}, the most pods one gang may have"
    )


def test_p1_a_gang_at_the_limit_is_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_plan(tmp_path, capsys, json.dumps(CLUSTER).encode(), role(pods=MAX_GANG_PODS))
    assert code == 0
    assert json.loads(out)["feasible"] is False  # 16 GPUs cannot hold it, and that is an answer


@pytest.mark.parametrize(
    ("which", "content", "expected"),
    [
        pytest.param(
            "cluster", b"tiers: [nvlink]\nnodes: []\n# caf\xe9\n", "not UTF-8 text (byte 0xe9", id="latin1"
        ),
        pytest.param("gang", b"\xff\xfename: g\n", "not UTF-8 text (byte 0xff at offset 0)", id="utf16-bom"),
        pytest.param("gang", b"name: " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested deeper than", id="deep"),
        pytest.param(
            "gang",
            b"a: &a [x, x, x, x, x, x, x, x, x, x]\n"
            b"b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
            b"c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
            b"d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
            b"name: [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n",
            "aliases repeat more than",
            id="laughs",
        ),
        pytest.param("gang", b"name: g\nroles: [{pods: " + b"9" * 5000 + b"}]\n", "digits", id="long-int"),
    ],
)
def test_d8_plan_files_that_cannot_be_read_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], which: str, content: bytes, expected: str
) -> None:
    """D8 (plan): a cluster or gang file that is not UTF-8, too deep, an alias bomb or with a huge
    integer is one line naming the file, exit 2; it used to be a traceback and exit 1."""
    cluster = content if which == "cluster" else json.dumps(CLUSTER).encode()
    gang = content if which == "gang" else role(pods=2)
    code, err = run_plan(tmp_path, capsys, cluster, gang)
    assert code == 2
    assert err.count("\n") == 0, err
    assert err.startswith(f"plan: {which}: {tmp_path / ('c.yaml' if which == 'cluster' else 'g.yaml')}")
    assert expected in err


@pytest.mark.timeout(30)
@pytest.mark.parametrize("which", ["cluster", "gang"])
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "too-large"])
def test_a_plan_file_that_is_not_a_regular_file_or_too_large_is_one_line_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], which: str, kind: str
) -> None:
    """A cluster or gang file that is a FIFO (``open`` used to wait for a writer for ever), a link to
    ``/dev/zero`` or larger than ``MAX_FILE_BYTES`` is one line naming it, exit 2."""
    import os

    from agent.commands.plan import MAX_FILE_BYTES

    files = {"cluster": tmp_path / "c.yaml", "gang": tmp_path / "g.yaml"}
    files["cluster"].write_bytes(json.dumps(CLUSTER).encode())
    files["gang"].write_bytes(role(pods=2))
    bad = files[which]
    bad.unlink()
    if kind == "fifo":
        os.mkfifo(bad)
        why = "not a regular file (a FIFO)"
    elif kind == "dev-zero":
        bad.symlink_to("/dev/zero")
        why = "not a regular file (a character device)"
    else:
        with open(bad, "wb") as fh:
            fh.truncate(MAX_FILE_BYTES + 1)  # sparse
        why = f"larger than {MAX_FILE_BYTES} bytes (the limit)"
    code = main(["--cluster", str(files["cluster"]), "--gang", str(files["gang"])])
    out = capsys.readouterr()
    assert code == 2
    assert out.out == ""
    assert out.err == f"plan: {which}: {bad}: {why}\n"


def test_the_file_limit_admits_a_100000_node_cluster_file() -> None:
    """The plan's file limit is explicit and leaves room for 100,000 GB200 trays written as indented
    JSON, the largest of the usual ways to write the file."""
    from agent.commands.plan import MAX_FILE_BYTES

    nodes = [
        {
            "name": f"rack{i // 18:04d}-tray{i % 18:02d}",
            "gpus": 4,
            "free": 4,
            "domains": {"nvlink": f"nvl-{i // 18:04d}", "leaf": f"leaf-{i // 144:03d}", "spine": "spine-00"},
        }
        for i in range(100_000)
    ]
    text = json.dumps({"tiers": ["nvlink", "leaf", "spine"], "nodes": nodes}, indent=2)
    assert len(text.encode()) < MAX_FILE_BYTES
