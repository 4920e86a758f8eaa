"""Pod-resources answers as plain frozen data (no gRPC types past the client)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


@dataclass(frozen=True, slots=True, order=True)
class Assignment:
    """One device ID held by one container (a row of ``List``)."""

    namespace: str
    pod: str
    container: str
    resource: str  # "nvidia.com/gpu", "nvidia.com/mig-1g.10gb", …
    device_id: str  # "GPU-…", "MIG-…", "<uuid>::<n>", or another plugin's ID


@dataclass(frozen=True, slots=True, order=True)
class AllocatableDevice:
    """One device ID the kubelet can allocate (a row of ``GetAllocatableResources``)."""

    resource: str
    device_id: str


@dataclass(frozen=True, slots=True)
class PodResourcesSnapshot:
    """What the kubelet said at one refresh.

    ``assignments`` is sorted; ``allocatable`` is ``None`` where the kubelet does not serve
    ``GetAllocatableResources`` (older than 1.23 or the call failed while ``List`` worked).
    """

    assignments: tuple[Assignment, ...] = ()
    allocatable: tuple[AllocatableDevice, ...] | None = None
    pods_listed: int = 0

    def for_resources(self, prefixes: tuple[str, ...]) -> tuple[Assignment, ...]:
        """Assignments whose resource name starts with one of ``prefixes``."""
        return tuple(a for a in self.assignments if a.resource.startswith(prefixes))


EMPTY = PodResourcesSnapshot()
