"""``gpu-node-agent bench metrics`` runs end to end on a tiny setting (figures are not asserted)."""

from __future__ import annotations

import contextlib
import http.client
import re
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from agent.benchmarks import metrics as bench


def test_bench_prints_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    code = bench.main(
        [
            "--pods",
            "2",
            "--other-pods",
            "0,5",
            "--detail-pods",
            "2",
            "--scrapes",
            "3",
            "--idle-seconds",
            "0.2",
            "--leak-scrapes",
            "5",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("machine: ")
    rows = [line.split() for line in out.splitlines() if re.match(r"^\s+\d+\s+\d+\s+\d+\s", line)]
    assert [r[0] for r in rows] == ["2", "2", "7"]  # pods listed: 2; then 2 + 0 and 2 + 5 without GPUs
    assert all(r[1] == "2" for r in rows)  # attributed pods
    assert len({r[2] for r in rows}) == 1  # pods without GPUs add no series
    assert "idle 0.2 s, 2 pods" in out
    assert "memory over 5 back-to-back scrapes" in out
    assert "targets: render p99" in out


def test_bench_rejects_bad_counts(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--pods", "ten"]) == 2
    assert "--pods" in capsys.readouterr().err


def test_plan_places_mig_pods_first_then_replicas(tmp_path) -> None:  # type: ignore[no-untyped-def]
    plan = bench.plan_node("dgx-a100-mig", 20, tmp_path, others=3)
    resources = [p["resource"] for p in plan["pods"]]
    assert all(r.startswith("nvidia.com/mig-") for r in resources[:15])  # the 15 MIG devices
    assert resources[15:] == ["nvidia.com/gpu"] * 5
    assert [p["device"].split("::")[1] for p in plan["pods"][15:]] == ["0", "0", "0", "0", "1"]
    assert len(plan["processes"]) == 5
    assert len(bench.fake_pods(plan)) == 23
    pid = plan["processes"][0]["pid"]
    assert (tmp_path / "proc" / str(pid) / "cgroup").read_text().startswith("0::/kubepods/burstable/pod")


def _until_the_exporter_closed_the_connection(run: bench.Run) -> Callable[[float], None]:
    """The idle phase's pause: instead of the pace, wait until the exporter has closed the scraper's
    idle kept-alive connection (no established connection left on its port)."""

    def pause(_seconds: float) -> None:
        for _ in range(3000):
            established = [
                c
                for c in run.process.net_connections(kind="tcp")
                if c.laddr and c.laddr.port == run.port and c.status == psutil.CONN_ESTABLISHED
            ]
            if not established:
                return
            time.sleep(0.01)
        raise AssertionError("the exporter kept an idle connection open past its idle timeout")

    return pause


def test_idle_phase_scrapes_again_after_the_exporter_closed_the_idle_connection(tmp_path: Path) -> None:
    """Issue 26 item 23: the listener closes a connection idle for its timeout (15 s, here 0.3 s); the
    idle phase's next scrape found it closed and died (RemoteDisconnected). It opens a new one."""
    with bench.Run(
        profile="dgx-a100-mig", pods=2, fmt="native", interval_s=10.0, workdir=tmp_path, idle_timeout_s=0.3
    ) as run:
        idle = bench._idle(run, 1.0, every_s=0.3, pause=_until_the_exporter_closed_the_connection(run))
    assert idle.scrapes >= 2
    assert idle.scrapes - 1 <= idle.reconnects <= idle.scrapes  # every scrape after a close: a new one
    assert idle.rss_mib > 0


def test_scraper_raises_when_a_new_connection_fails() -> None:
    """Only a connection that served before is opened again: an exporter that drops every connection
    unanswered is an error, not a retry loop."""
    accepted: list[int] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def drop() -> None:
            with contextlib.suppress(OSError):  # the listener closed: done
                while True:
                    conn, _ = listener.accept()
                    accepted.append(1)
                    conn.recv(65536)
                    conn.close()

        dropper = threading.Thread(target=drop, daemon=True)
        dropper.start()
        scraper = bench.Scraper(port)
        try:
            with pytest.raises(http.client.RemoteDisconnected):
                scraper.get()
        finally:
            scraper.close()
        listener.shutdown(socket.SHUT_RDWR)
    dropper.join(timeout=30)
    assert scraper.reconnects == 0
    assert accepted == [1]
