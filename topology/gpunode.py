"""The ``GPUNode`` custom resource: one per node, named after it, facts in ``status``. Pure.

- :func:`gpunode_object` builds the object the agent applies (inventory, per-device health, per-GPU
  fabric conditions under the fabric policy, the IMEX daemon's status, a summary for
  ``kubectl get gpunodes``) from a :class:`~topology.model.NodeInventory`.
- :func:`inventory_from_gpunode` reads one back (the controller's input), with one-line errors.
- :func:`gpunode_crd` is the CustomResourceDefinition; its ``status.inventory`` schema is generated from
  the model's dataclasses, so the API server checks every field's type, the enums and the required
  fields. ``daemonset/crds/gpunode.yaml`` is this function's output (a test keeps them equal).

``None`` values are left out of the object (absent = not supported): the API server's enum check does
not accept ``null``, and a field that is absent reads back as ``None``.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from topology.fabrichealth import (
    DEFAULT_FABRIC_POLICY,
    FabricCondition,
    FabricLevel,
    FabricPolicy,
    GpuFabricVerdict,
    fabric_verdicts,
    node_fabric_level,
)
from topology.model import SCHEMA_VERSION, Health, NodeInventory
from topology.nvlink import CLIQUE_LABEL, member_clique, nvlink_facts

GROUP = "topology.gpuagent.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "GPUNode"
PLURAL = "gpunodes"
SINGULAR = "gpunode"


class NodeHealth(enum.StrEnum):
    """Summary of the node's device health in ``status.summary.health``."""

    HEALTHY = "Healthy"  # every device healthy
    DEGRADED = "Degraded"  # some devices unhealthy
    UNHEALTHY = "Unhealthy"  # every device unhealthy
    UNKNOWN = "Unknown"  # no health reported (offline discovery)


class GpuNodeError(ValueError):
    """A GPUNode object that cannot be read; the message names the object and the field."""


# --------------------------------------------------------------------------- object


def gpunode_object(
    inventory: NodeInventory,
    *,
    node_name: str,
    node_uid: str | None = None,
    health: Mapping[str, Health] | None = None,
    fabric_policy: FabricPolicy = DEFAULT_FABRIC_POLICY,
    imex: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``GPUNode`` for one node. ``health`` maps device ids (GPU / MIG UUIDs) to kubelet health;
    ``node_uid`` adds an owner reference to the Node so the object goes when the Node goes;
    ``imex`` is the IMEX daemon's status (``agent.imex.ImexStatus.to_status``), left out when ``None``."""
    if not node_name:
        raise ValueError("gpunode: node_name is empty")
    metadata: dict[str, Any] = {"name": node_name}
    clique = member_clique(inventory)
    if clique is not None:
        metadata["labels"] = {CLIQUE_LABEL: str(clique)}
    if node_uid:
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}
        ]
    status: dict[str, Any] = {
        "summary": _summary(inventory, health, fabric_policy),
        "inventory": _drop_none(inventory.to_dict()),
    }
    verdicts = fabric_verdicts(inventory, fabric_policy)
    if verdicts:
        status["fabric"] = [
            {"gpu": v.gpu_index, "level": v.level.value, "conditions": [c.value for c in v.conditions]}
            for v in verdicts
        ]
    if imex is not None:
        status["imex"] = dict(imex)
    if health is not None:
        status["health"] = [{"id": dev, "health": h.value} for dev, h in sorted(health.items())]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {"nodeName": node_name},
        "status": status,
    }


def _summary(
    inventory: NodeInventory, health: Mapping[str, Health] | None, policy: FabricPolicy
) -> dict[str, Any]:
    products = sorted({g.name for g in inventory.gpus})
    facts = nvlink_facts(inventory, policy)
    out: dict[str, Any] = {
        "gpus": len(inventory.gpus),
        "product": products[0] if len(products) == 1 else ("mixed" if products else "none"),
        "fabric": facts.status.value,
        "health": node_health(health).value,
    }
    if inventory.gpus:
        out["memoryMiB"] = min(g.memory_total_mib for g in inventory.gpus)
    if facts.clique is not None:  # the clique the node belongs to, also while it is out of it
        out["clique"] = str(facts.clique)
    level = node_fabric_level(inventory, policy)
    if level is not None:
        out["fabricHealth"] = level.value
    if facts.reason is not None:
        out["fabricReason"] = facts.reason
    if health is not None:
        out["unhealthyDevices"] = sum(1 for h in health.values() if h is Health.UNHEALTHY)
    return out


def node_health(health: Mapping[str, Health] | None) -> NodeHealth:
    if health is None or not health:
        return NodeHealth.UNKNOWN
    bad = sum(1 for h in health.values() if h is Health.UNHEALTHY)
    if bad == 0:
        return NodeHealth.HEALTHY
    return NodeHealth.UNHEALTHY if bad == len(health) else NodeHealth.DEGRADED


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


# --------------------------------------------------------------------------- parser


def inventory_from_gpunode(obj: Any) -> tuple[str, NodeInventory, dict[str, Health] | None]:
    """``(node name, inventory, health or None)`` of a GPUNode object; raises :class:`GpuNodeError`
    with one line naming the object and the field that is wrong."""
    if not isinstance(obj, Mapping):
        raise GpuNodeError(f"GPUNode: expected an object, got {type(obj).__name__}")
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    where = f"GPUNode {name!r}" if isinstance(name, str) and name else "GPUNode (no metadata.name)"
    if not isinstance(name, str) or not name:
        raise GpuNodeError(f"{where}: metadata.name is missing")
    if obj.get("apiVersion") != API_VERSION or obj.get("kind") != KIND:
        raise GpuNodeError(
            f"{where}: apiVersion/kind are {obj.get('apiVersion')!r}/{obj.get('kind')!r}, "
            f"expected {API_VERSION}/{KIND}"
        )
    status = obj.get("status")
    if not isinstance(status, Mapping) or not isinstance(status.get("inventory"), Mapping):
        raise GpuNodeError(f"{where}: status.inventory is missing (the agent has not published yet)")
    raw = status["inventory"]
    schema = raw.get("schema", SCHEMA_VERSION)
    if schema != SCHEMA_VERSION:
        raise GpuNodeError(
            f"{where}: status.inventory.schema is {schema!r}, this build reads {SCHEMA_VERSION!r}"
        )
    try:
        body = {k: v for k, v in raw.items() if k != "schema"}
        inventory = _decoder(NodeInventory)(body, "NodeInventory")
    except ValueError as exc:
        raise GpuNodeError(f"{where}: status.inventory: {exc}") from None
    health: dict[str, Health] | None = None
    if "health" in status:
        health = {}
        entries = status["health"]
        if not isinstance(entries, list):
            raise GpuNodeError(f"{where}: status.health: expected a list")
        for i, entry in enumerate(entries):
            try:
                health[str(entry["id"])] = Health(entry["health"])
            except (KeyError, TypeError, ValueError):
                raise GpuNodeError(
                    f"{where}: status.health[{i}]: expected {{id, health: Healthy|Unhealthy}}, got {entry!r}"
                ) from None
    return name, inventory, health


def published_verdicts(obj: Mapping[str, Any]) -> tuple[GpuFabricVerdict, ...] | None:
    """The fabric verdict per GPU the node's agent published under its own fabric policy
    (``status.fabric``), or ``None`` when the object has none (an older agent: the reader then judges with
    the default policy). A malformed list raises :class:`GpuNodeError` naming the entry."""
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    status = obj.get("status")
    entries = status.get("fabric") if isinstance(status, Mapping) else None
    if entries is None:
        return None
    if not isinstance(entries, list):
        raise GpuNodeError(f"GPUNode {name!r}: status.fabric: expected a list")
    out: list[GpuFabricVerdict] = []
    for i, entry in enumerate(entries[:MAX_FABRIC_ENTRIES]):
        try:
            gpu = entry["gpu"]
            if not isinstance(gpu, int) or isinstance(gpu, bool) or not 0 <= gpu < MAX_FABRIC_ENTRIES:
                raise ValueError
            conditions = tuple(FabricCondition(c) for c in entry.get("conditions") or ())
            out.append(GpuFabricVerdict(gpu, FabricLevel(entry["level"]), conditions))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise GpuNodeError(
                f"GPUNode {name!r}: status.fabric[{i}]: expected {{gpu, level: healthy|degraded|unhealthy, "
                f"conditions}}, got {str(entry)[:120]}"
            ) from None
    return tuple(out)


MAX_FABRIC_ENTRIES = 64  # GPUs per node, far above any machine's


Decoder = Callable[[Any, str], Any]
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # the CRD's integer format; the API server's bound too


def _digits(value: int) -> int:
    """Decimal digits of ``value`` without converting it to text (Python refuses > 4,300 digits)."""
    return max(1, math.ceil(abs(value).bit_length() * math.log10(2)))


_DECODERS: dict[Any, Decoder] = {}


def _decoder(tp: Any) -> Decoder:
    """A converter from plain data to ``tp`` (a model dataclass, enum, tuple or scalar), built once per
    type: the GPUNodes of a large cluster are read on every controller start, and resolving type hints
    per object costs milliseconds. Absent optional fields become ``None``; errors name the field path
    the way :func:`topology.model.from_plain` does."""
    cached = _DECODERS.get(tp)
    if cached is not None:
        return cached
    inner, optional = _strip_optional(tp)
    base = _build_decoder(inner)
    if optional:

        def decode_optional(data: Any, path: str) -> Any:
            return None if data is None else base(data, path)

        out: Decoder = decode_optional
    else:
        out = base
    _DECODERS[tp] = out
    return out


def _decode_float(data: Any, path: str) -> Any:
    if isinstance(data, int | float) and not isinstance(data, bool):
        if isinstance(data, int) and not INT64_MIN <= data <= INT64_MAX:
            raise ValueError(f"{path}: {_digits(data)}-digit number outside int64 (the limit)")
        if not math.isfinite(data):
            raise ValueError(f"{path}: {data} is not a finite number")
        return float(data)
    raise ValueError(f"{path}: expected a number, got {type(data).__name__}")


def _decode_int(data: Any, path: str) -> Any:
    if not isinstance(data, int) or isinstance(data, bool):
        raise ValueError(f"{path}: expected int, got {type(data).__name__}")
    if not INT64_MIN <= data <= INT64_MAX:
        raise ValueError(f"{path}: {_digits(data)}-digit integer outside int64 (the limit)")
    return data


def _scalar_decoder(scalar: type) -> Decoder:
    def decode_scalar(data: Any, path: str) -> Any:
        if isinstance(data, scalar):
            return data
        raise ValueError(f"{path}: expected {scalar.__name__}, got {type(data).__name__}")

    return decode_scalar


# the leaf types of the model, each with its decoder; everything else is built from them
_SCALAR_DECODERS: dict[Any, Decoder] = {
    float: _decode_float,
    int: _decode_int,
    str: _scalar_decoder(str),
    bool: _scalar_decoder(bool),
}


def _list_of(data: Any, path: str) -> list[Any] | tuple[Any, ...]:
    if not isinstance(data, list | tuple):
        raise ValueError(f"{path}: expected a list, got {type(data).__name__}")
    return data


def _tuple_decoder(args: tuple[Any, ...]) -> Decoder:
    """``tuple[X, ...]`` (any length) or ``tuple[X, Y, ...]`` (that many items, each its type)."""
    if len(args) == 2 and args[1] is Ellipsis:
        item = _decoder(args[0])

        def decode_seq(data: Any, path: str) -> Any:
            return tuple(item(v, f"{path}[{i}]") for i, v in enumerate(_list_of(data, path)))

        return decode_seq
    items = [_decoder(a) for a in args]

    def decode_fixed(data: Any, path: str) -> Any:
        data = _list_of(data, path)
        if len(data) != len(items):
            raise ValueError(f"{path}: expected {len(items)} items, got {len(data)}")
        return tuple(d(v, f"{path}[{i}]") for i, (d, v) in enumerate(zip(items, data, strict=True)))

    return decode_fixed


def _dataclass_decoder(cls: Any) -> Decoder:
    """A model dataclass from an object: unknown fields refused, each field by its type's decoder."""
    hints = typing.get_type_hints(cls)
    fields: list[tuple[str, Decoder, str]] = []
    for f in dataclasses.fields(cls):
        no_default = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        optional = _strip_optional(hints[f.name])[1]
        # when absent: "missing" is an error, "none" reads as None, "default" takes the default
        absent = ("none" if optional else "missing") if no_default else "default"
        fields.append((f.name, _decoder(hints[f.name]), absent))
    names = {name for name, _, _ in fields}

    def decode_dataclass(data: Any, path: str) -> Any:
        if not isinstance(data, Mapping):
            raise ValueError(f"{path}: expected an object, got {type(data).__name__}")
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"{path}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        kwargs = {}
        for name, decode, absent in fields:
            if name in data:
                kwargs[name] = decode(data[name], f"{path}.{name}")
            elif absent == "none":
                kwargs[name] = None
            elif absent == "missing":
                raise ValueError(f"{path}.{name}: missing")
        return cls(**kwargs)

    return decode_dataclass


def _enum_decoder(enum_type: type[enum.Enum]) -> Decoder:
    def decode_enum(data: Any, path: str) -> Any:
        try:
            return enum_type(data)
        except ValueError:
            valid = ", ".join(str(m.value) for m in enum_type)
            raise ValueError(f"{path}: {data!r} is not one of {valid}") from None

    return decode_enum


def _build_decoder(tp: Any) -> Decoder:
    if typing.get_origin(tp) is tuple:
        return _tuple_decoder(typing.get_args(tp))
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _dataclass_decoder(tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum_decoder(tp)
    scalar = _SCALAR_DECODERS.get(tp)
    if scalar is None:
        raise TypeError(f"no decoder for {tp!r}")
    return scalar


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], len(args) != len(typing.get_args(tp))
    return tp, False


# --------------------------------------------------------------------------- CRD


def openapi_schema(tp: Any) -> dict[str, Any]:
    """OpenAPI v3 (structural) schema of a model type: required = fields without a default that are
    not optional; optional fields may be absent; enums list their values; no unknown fields kept."""
    tp = _strip_optional(tp)[0]
    origin = typing.get_origin(tp)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": openapi_schema(args[0])}
        first = openapi_schema(args[0])
        if any(openapi_schema(a) != first for a in args[1:]):
            raise TypeError(f"heterogeneous tuple {tp!r} has no structural schema")
        return {"type": "array", "items": first, "minItems": len(args), "maxItems": len(args)}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        props: dict[str, Any] = {}
        required: list[str] = []
        for f in dataclasses.fields(tp):
            props[f.name] = openapi_schema(hints[f.name])
            no_default = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if no_default and not _strip_optional(hints[f.name])[1]:
                required.append(f.name)
        out: dict[str, Any] = {"type": "object", "properties": props}
        if required:
            out["required"] = required
        return out
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"type": "string", "enum": [str(m.value) for m in tp]}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer", "format": "int64"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    raise TypeError(f"no OpenAPI schema for {tp!r}")


def inventory_schema() -> dict[str, Any]:
    schema = openapi_schema(NodeInventory)
    schema["properties"] = {"schema": {"type": "string", "enum": [SCHEMA_VERSION]}, **schema["properties"]}
    schema["required"] = ["schema", *schema.get("required", [])]
    return schema


def printer_column(name: str, path: str, type_: str = "string", priority: int = 0) -> dict[str, Any]:
    """One ``additionalPrinterColumns`` entry of a CRD (what ``kubectl get`` shows)."""
    col: dict[str, Any] = {"name": name, "type": type_, "jsonPath": path}
    if priority:
        col["priority"] = priority
    return col


def gpunode_crd() -> dict[str, Any]:
    """The ``gpunodes.topology.gpuagent.dev`` CustomResourceDefinition."""
    health_values = [h.value for h in Health]
    summary = {
        "type": "object",
        "required": ["gpus", "product", "fabric", "health"],
        "properties": {
            "gpus": {"type": "integer", "minimum": 0},
            "product": {"type": "string"},
            "memoryMiB": {"type": "integer", "minimum": 0},
            "clique": {"type": "string", "pattern": r"^[0-9a-f-]{36}\.[0-9]+$"},
            "fabric": {"type": "string", "enum": ["none", "ok", "incomplete", "unhealthy", "inconsistent"]},
            "fabricReason": {"type": "string"},
            "fabricHealth": {"type": "string", "enum": [v.value for v in FabricLevel]},
            "health": {"type": "string", "enum": [h.value for h in NodeHealth]},
            "unhealthyDevices": {"type": "integer", "minimum": 0},
        },
    }
    status = {
        "type": "object",
        "required": ["summary", "inventory"],
        "properties": {
            "summary": summary,
            "inventory": inventory_schema(),
            "fabric": {
                "type": "array",
                "description": "Per GPU with fabric info: its level under the agent's fabric policy and the "
                "conditions NVML reports (state, status, health summary and health mask).",
                "items": {
                    "type": "object",
                    "required": ["gpu", "level", "conditions"],
                    "properties": {
                        "gpu": {"type": "integer", "minimum": 0},
                        "level": {"type": "string", "enum": [v.value for v in FabricLevel]},
                        "conditions": {
                            "type": "array",
                            "items": {"type": "string", "enum": [c.value for c in FabricCondition]},
                        },
                    },
                },
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["gpu"],
            },
            "imex": {
                "type": "object",
                "description": "The node's IMEX daemon, as nvidia-imex-ctl -q reports it.",
                "required": ["state", "status"],
                "properties": {
                    "state": {"type": "string", "enum": ["ready", "not-ready", "absent"]},
                    "status": {"type": "string"},
                    "peers": {"type": "integer", "minimum": 0},
                    "reason": {"type": "string"},
                    "managed": {"type": "boolean", "description": "the agent keeps the peer list"},
                    "address": {"type": "string", "maxLength": 45, "description": "this node's IMEX address"},
                },
            },
            "health": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["id", "health"],
                    "properties": {
                        "id": {"type": "string", "minLength": 1},
                        "health": {"type": "string", "enum": health_values},
                    },
                },
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["id"],
            },
        },
    }
    spec = {
        "type": "object",
        "required": ["nodeName"],
        "properties": {"nodeName": {"type": "string", "minLength": 1, "maxLength": 253}},
        "x-kubernetes-validations": [
            {"rule": "self.nodeName == oldSelf.nodeName", "message": "spec.nodeName is immutable"}
        ],
    }
    root = {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "x-kubernetes-validations": [
            {
                "rule": "self.metadata.name == self.spec.nodeName",
                "message": "metadata.name must equal spec.nodeName",
            }
        ],
    }

    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": ["gpun"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        printer_column("GPUs", ".status.summary.gpus", "integer"),
                        printer_column("Model", ".status.summary.product"),
                        printer_column("Clique", ".status.summary.clique"),
                        printer_column("Fabric", ".status.summary.fabric"),
                        printer_column("Fabric-Health", ".status.summary.fabricHealth", priority=1),
                        printer_column("Health", ".status.summary.health"),
                        printer_column("Memory-MiB", ".status.summary.memoryMiB", "integer", priority=1),
                        printer_column("Age", ".metadata.creationTimestamp", "date"),
                    ],
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def crd_yaml() -> str:
    import yaml  # noqa: PLC0415 - only the CRD writer needs it

    header = (
        "# Generated by `python -m topology.gpunode` from topology/model.py; do not edit by hand.\n"
        "# The status.inventory schema mirrors NodeInventory.to_dict() (None values left out).\n"
    )
    return header + yaml.safe_dump(gpunode_crd(), sort_keys=False, width=100)


if __name__ == "__main__":
    import pathlib
    import sys

    target = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "daemonset/crds/gpunode.yaml")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(crd_yaml(), encoding="utf-8")
    print(f"wrote {target}")
