"""gRPC channels to the kubelet's unix sockets (pod-resources, device-plugin registration, a plugin's
own socket)."""

from __future__ import annotations

import os

import grpc


def unix_channel(path: str | os.PathLike[str]) -> grpc.aio.Channel:
    """An insecure channel to the unix socket ``path`` that keeps its own connection state (a local
    subchannel pool): another channel's failed connect to the same socket, with its reconnect
    back-off (a kubelet that was restarting), does not hold this one up."""
    return grpc.aio.insecure_channel(f"unix://{path}", options=[("grpc.use_local_subchannel_pool", 1)])
