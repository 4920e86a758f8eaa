"""The ``gpu-node-agent`` console script: picks a subcommand and hands it the rest of argv.

This is the composition root's front door. Each subcommand lives in its own module exposing
``main(argv: list[str]) -> int``; only the chosen one is imported, so ``plan`` never loads gRPC and
``discover`` never loads the Kubernetes client.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "discover": ("agent.commands.discover", "discover this node's GPUs, MIG, NVLink, fabric and IB"),
    "run": ("agent.commands.run", "run the node agent: device plugins, health, metrics, publishing"),
    "controller": ("agent.commands.controller", "build and apply the HyperNode tree (+ exports)"),
    "extender": ("agent.commands.extender", "serve the kube-scheduler extender"),
    "plan": ("agent.commands.plan", "plan one gang on a cluster snapshot (offline)"),
    "bench": ("agent.commands.bench", "run a benchmark and print its figures"),
    "demo": ("agent.commands.demo", "start a simulated cluster end to end"),
}


def usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: gpu-node-agent COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run 'gpu-node-agent COMMAND --help' for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    if args[0] == "--version":
        from importlib.metadata import version  # noqa: PLC0415 - only on request

        print(version("gpu-node-agent"))
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(
            f"gpu-node-agent: unknown command {name!r}; valid: {', '.join(COMMANDS)}",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    code: int = module.main(rest)
    return code


if __name__ == "__main__":
    sys.exit(main())
