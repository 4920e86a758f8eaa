"""Host PIDs to pods: ``/proc/<pid>/cgroup`` for the pod UID, ``/var/log/pods`` for its name (adapter).

The kubelet keeps one directory per pod under ``/var/log/pods`` named ``<namespace>_<pod>_<uid>``; the
DaemonSet mounts it read-only. Both roots are arguments so tests point them at a temporary tree.
A PID that vanished, a cgroup that is not a pod's (or cannot be read within :mod:`agent.files`' bounds),
or a UID without a directory simply maps to nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from agent.files import read_text
from agent.metrics.attribution import PodOfProcess, parse_cgroup, parse_pod_log_dir


class ProcessPodMapper:
    def __init__(self, *, proc_root: str = "/proc", pod_logs_root: str = "/var/log/pods") -> None:
        self.proc_root = proc_root
        self.pod_logs_root = pod_logs_root
        self._pods: dict[str, tuple[str, str]] = {}
        self._pods_mtime: float | None = None

    def _pod_index(self) -> dict[str, tuple[str, str]]:
        """uid -> (namespace, pod), re-read only when the directory changed."""
        try:
            mtime = os.stat(self.pod_logs_root).st_mtime
        except OSError:
            self._pods, self._pods_mtime = {}, None
            return self._pods
        if mtime != self._pods_mtime:
            index: dict[str, tuple[str, str]] = {}
            try:
                names = os.listdir(self.pod_logs_root)
            except OSError:
                names = []
            for name in names:
                parsed = parse_pod_log_dir(name)
                if parsed is not None:
                    index[parsed[2]] = (parsed[0], parsed[1])
            self._pods, self._pods_mtime = index, mtime
        return self._pods

    def map(self, pids: Iterable[int]) -> dict[int, PodOfProcess]:
        wanted = sorted(set(pids))
        if not wanted:
            return {}
        index = self._pod_index()
        out: dict[int, PodOfProcess] = {}
        for pid in wanted:
            try:
                text = read_text(os.path.join(self.proc_root, str(pid), "cgroup"))
            except OSError:  # gone, not a regular file, too long or not UTF-8: maps to nothing
                continue
            parsed = parse_cgroup(text)
            if parsed is None:
                continue
            uid, container_id = parsed
            pod = index.get(uid)
            if pod is None:
                continue
            out[pid] = PodOfProcess(namespace=pod[0], pod=pod[1], pod_uid=uid, container_id=container_id)
        return out
