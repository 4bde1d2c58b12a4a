"""The ``gpufleet`` command.

Every command declares its flags the same way (:class:`~gpufleet.cli.options.Option`, each
parsing one of the value kinds in ``kinds``; ``resolve`` turns the parsed values into
settings, tokens and logging), one module per family: ``agent`` (agent, nvml-record),
``fleet`` (the ledger and the commands that talk to it), ``kube`` (kube-watch),
``slurm`` (slurm-watch), ``simulate`` (simulate, demo, mixin). Every flag of a long-running
service can also be set from a ``GPUFLEET_*`` environment variable (the Helm chart and
compose file set those); a flag on the command line wins over the environment. What a
command does lives in the package it belongs to; a command here only turns flags into
that package's arguments.

This package imports nothing beyond the standard library at import time: ``pip install
gpufleet`` (the training client alone) must be able to print every command's help.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gpufleet import __version__
from gpufleet.cli.agent import AGENT, AGENT_OPTIONS, NVML_RECORD, ingest_token, node_name
from gpufleet.cli.fleet import EXCLUDE, EXCLUSIONS, FLEET, FLEET_OPTIONS, RELEASE, REPORT
from gpufleet.cli.kube import KUBE_WATCH
from gpufleet.cli.options import Command, ConfigError, Group
from gpufleet.cli.simulate import DEMO, MIXIN, SIMULATE
from gpufleet.cli.slurm import SLURM_WATCH
from gpufleet.fleet.ledger_client import LedgerError

__all__ = [
    "AGENT_OPTIONS",
    "COMMANDS",
    "COMMAND_EXTRAS",
    "FLEET_OPTIONS",
    "MODULE_EXTRAS",
    "ConfigError",
    "build_parser",
    "ingest_token",
    "main",
    "missing_extra_hint",
    "node_name",
    "parse",
]

# In the order `gpufleet --help` lists them.
COMMANDS: tuple[Command | Group, ...] = (
    AGENT,
    NVML_RECORD,
    SIMULATE,
    FLEET,
    EXCLUDE,
    RELEASE,
    REPORT,
    EXCLUSIONS,
    KUBE_WATCH,
    SLURM_WATCH,
    DEMO,
    MIXIN,
)

# `pip install gpufleet` is the training client alone (standard library only); each
# service's dependencies come with an extra (pyproject.toml). The extra a command needs,
# and the extra that brings each third-party module, for the one-line hint when it is missing.
COMMAND_EXTRAS = {
    command.name: command.extra
    for command in COMMANDS
    if isinstance(command, Command) and command.extra
}
MODULE_EXTRAS = {
    **dict.fromkeys(
        ("fastapi", "starlette", "pydantic", "uvicorn", "prometheus_client", "pynvml"), "agent"
    ),
    **dict.fromkeys(("numpy", "yaml"), "sim"),
    **dict.fromkeys(("pandas", "matplotlib"), "report"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpufleet",
        description="Observability for large GPU training clusters.",
    )
    parser.add_argument("--version", action="version", version=f"gpufleet {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_to(commands)
    return parser


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """Every option of the command ``argv`` names, parsed and resolved against the
    environment (the values its run function receives); raises ConfigError."""
    namespace = build_parser().parse_args(argv)
    declared: Command = namespace.declared
    return declared.resolve(namespace)


def missing_extra_hint(command: str, module: str | None) -> str | None:
    """What to install when ``command`` failed to import ``module`` (None: not one of ours)."""
    top = (module or "").split(".")[0]
    if top not in MODULE_EXTRAS:
        return None
    extra = COMMAND_EXTRAS.get(command, MODULE_EXTRAS[top])
    return f"{top} is not installed; this command needs pip install 'gpufleet[{extra}]'"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``gpufleet`` command line; the exit status (2: a bad flag or variable)."""
    parser = build_parser()
    namespace = parser.parse_args(argv)
    declared: Command = namespace.declared
    named = " ".join(filter(None, (namespace.command, getattr(namespace, "view", None))))
    try:
        return declared.run(declared.resolve(namespace))
    except ConfigError as error:
        parser.exit(2, f"gpufleet {namespace.command}: {error}\n")
    except ModuleNotFoundError as error:
        hint = missing_extra_hint(namespace.command, error.name)
        if hint is None:
            raise
        parser.exit(1, f"gpufleet {namespace.command}: {hint}\n")
    except LedgerError as error:  # the ledger refused the command, or cannot be reached
        print(f"gpufleet {named}: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
