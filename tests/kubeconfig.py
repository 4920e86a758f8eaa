"""A kubeconfig for the fake API servers the tests start: plain HTTP, a bearer token, one context."""

from __future__ import annotations

from pathlib import Path

import yaml


def token_kubeconfig(server: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "fake", "user": "u"}}],
        "current-context": "c",
    }


def write_token_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump(token_kubeconfig(server)), encoding="utf-8")
    return path
