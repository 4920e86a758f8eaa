"""``--simulate PROFILE[:k=v,...]``: spec parsing and building a simulator.

- :func:`parse_spec` turns ``"gb200-nvl72:rack=3,tray=5"`` into a :class:`SimSpec`; an unknown profile
  or option, or a bad value, raises :class:`SimSpecError` whose message is one line naming the valid
  choices.
- :func:`build_simulator` builds the ``SimulatedNvml`` of a spec.

Faults (``--simulate-faults PATH``) are :mod:`agent.nvml.faults`; the simulated node
(:mod:`agent.simnode`) owns the follower of its fault file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agent.nvml.fake import SimulatedNvml
from agent.nvml.profiles import PROFILES as _PROFILES
from agent.nvml.profiles import MachineSpec, build_machine

PROFILES: dict[str, str] = {name: p.description for name, p in _PROFILES.items()}
"""Simulator profile names with one-line descriptions."""


class SimSpecError(ValueError):
    """A ``--simulate`` value that names no profile or carries a bad option (one-line message)."""


@dataclass(frozen=True, slots=True)
class SimSpec:
    profile: str
    options: tuple[tuple[str, int | str], ...] = ()

    def option(self, name: str, default: int | str | None = None) -> int | str | None:
        for key, value in self.options:
            if key == name:
                return value
        return default

    def options_dict(self) -> dict[str, int | str]:
        return dict(self.options)

    def machine(self) -> MachineSpec:
        return build_machine(self.profile, self.options_dict())

    def __str__(self) -> str:
        if not self.options:
            return self.profile
        return self.profile + ":" + ",".join(f"{k}={v}" for k, v in self.options)


def parse_spec(text: str) -> SimSpec:
    """``PROFILE[:key=value,...]`` → ``SimSpec`` with typed, range-checked options."""
    name, _, rest = text.strip().partition(":")
    if name not in _PROFILES:
        raise SimSpecError(f"unknown simulator profile {name!r}; valid: {', '.join(_PROFILES)}")
    profile = _PROFILES[name]
    known = {o.name: o for o in profile.options}
    valid = ", ".join(known)
    options: dict[str, int | str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not eq or not key or not raw:
            raise SimSpecError(
                f"simulator profile {name}: option {item!r} is not key=value; valid keys: {valid}"
            )
        if key not in known:
            raise SimSpecError(f"simulator profile {name}: unknown option {key!r}; valid: {valid}")
        if key in options:
            raise SimSpecError(f"simulator profile {name}: option {key!r} given twice")
        spec = known[key]
        if spec.low is None or spec.high is None:
            options[key] = raw
            continue
        try:
            value = int(raw, 0)
        except ValueError:
            raise SimSpecError(f"simulator profile {name}: option {key}={raw!r} is not an integer") from None
        if not spec.low <= value <= spec.high:
            raise SimSpecError(
                f"simulator profile {name}: option {key}={value} out of range {spec.low}-{spec.high}"
            )
        options[key] = value
    if "tray" in options and "node" in options and options["tray"] != options["node"]:
        raise SimSpecError(
            f"simulator profile {name}: node={options['node']} contradicts tray={options['tray']}"
        )
    order = list(known)
    return SimSpec(name, tuple(sorted(options.items(), key=lambda kv: order.index(kv[0]))))


def build_simulator(spec: SimSpec | str, *, clock: Callable[[], float] | None = None) -> SimulatedNvml:
    """The simulator of a spec (not initialised: the caller owns ``init()``/``shutdown()``)."""
    if isinstance(spec, str):
        spec = parse_spec(spec)
    return SimulatedNvml(spec.machine(), clock=clock)
