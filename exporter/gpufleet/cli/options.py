"""How every ``gpufleet`` command declares its flags.

One :class:`Option` per flag: its parser (a kind from :mod:`gpufleet.cli.kinds`), default,
help and, for a long-running service, the ``GPUFLEET_*`` environment variable that sets it
when the flag is absent. argparse only collects the raw text; :meth:`Option.resolve` parses
it, so every bad value, from a flag or from the environment, fails the same way: a
:class:`ConfigError` naming where the value came from and what is accepted.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpufleet.cli import kinds


class ConfigError(Exception):
    """A flag or environment value is unusable; the message names it and what is accepted."""


def env(name: str) -> str | None:
    """The variable's value; unset and empty are the same (compose and Helm write empties)."""
    value = os.environ.get(name)
    return value if value not in (None, "") else None


@dataclass(frozen=True)
class Option:
    """One flag (or positional argument, when ``flag`` has no leading dash).

    ``env`` is the variable that sets it when the flag is absent (every flag of a
    long-running service has one); ``switch`` is a flag without a value whose variable
    says true or false; ``required`` is for one-shot commands' flags without a variable.
    """

    flag: str
    parse: Callable[[str], Any]
    default: str | None
    help: str
    env: str | None = None
    switch: bool = False
    required: bool = False
    metavar: str | None = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def positional(self) -> bool:
        return not self.flag.startswith("-")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        if self.positional:
            parser.add_argument(self.flag, help=self.help or None)
            return
        from_env = f" [env {self.env}{'=true' if self.switch else ''}]" if self.env else ""
        if self.switch:
            parser.add_argument(
                self.flag, dest=self.dest, action="store_const", const="true",
                help=f"{self.help}{from_env}",
            )  # fmt: skip
            return
        shown = f" (default: {self.default})" if self.default not in (None, "") else ""
        parser.add_argument(
            self.flag, dest=self.dest, required=self.required, metavar=self.metavar,
            help=f"{self.help}{shown}{from_env}",
        )  # fmt: skip

    def resolve(self, namespace: argparse.Namespace) -> Any:
        """The parsed value: the flag, else the variable, else the default (None: unset)."""
        raw: str | None = getattr(namespace, self.dest)
        origin = self.flag
        if raw is None and self.env:
            raw, origin = env(self.env), self.env
        if raw is None:
            raw, origin = self.default, f"default of {self.flag}"
        if raw is None:
            return False if self.switch else None
        try:
            return self.parse(raw)
        except ValueError as error:
            raise ConfigError(f"{origin}: {error}") from None


def log_level_option(env_name: str, default: str = "info") -> Option:
    """Every server logs the same way; only the variable and the default differ."""
    return Option(
        "--log-level",
        kinds.choice("debug", "info", "warning", "error"),
        default,
        "log level",
        env=env_name,
    )


@dataclass(frozen=True)
class Command:
    """A subcommand: its flags, the function that runs it and the extra it needs."""

    name: str
    run: Callable[[argparse.Namespace], int]
    options: tuple[Option, ...]
    help: str
    description: str | None = None
    extra: str | None = None  # the pip extra whose modules it imports (None: stdlib only)
    service: bool = False  # long-running: every flag has a GPUFLEET_* variable

    def __post_init__(self) -> None:
        if self.service:
            missing = [o.flag for o in self.options if o.env is None and not o.positional]
            if missing:
                raise TypeError(f"{self.name}: service flags without a variable: {missing}")

    def add_to(self, commands: Any) -> None:
        parser = commands.add_parser(
            self.name,
            help=self.help,
            description=self.description or None,
            # No abbreviations: "--ingest-token SECRET" must fail, not read a file named SECRET.
            allow_abbrev=False,
        )
        for option in self.options:
            option.add_to(parser)
        parser.set_defaults(declared=self)

    def resolve(self, namespace: argparse.Namespace) -> argparse.Namespace:
        """Every option parsed, by its ``dest``; raises ConfigError naming the bad one."""
        return argparse.Namespace(**{o.dest: o.resolve(namespace) for o in self.options})


@dataclass(frozen=True)
class Group:
    """A command with subcommands of its own (``gpufleet exclusions top``)."""

    name: str
    help: str
    commands: tuple[Command, ...]

    def add_to(self, commands: Any) -> None:
        parser = commands.add_parser(self.name, help=self.help)
        views = parser.add_subparsers(dest="view", metavar="VIEW", required=True)
        for command in self.commands:
            command.add_to(views)


def variables(prefix: str, options: tuple[Option, ...]) -> tuple[Option, ...]:
    """A service's options, each settable from ``<prefix><FLAG>`` (``--max-jobs`` under
    ``GPUFLEET_`` is ``GPUFLEET_MAX_JOBS``) unless it names its own variable."""
    return tuple(
        option
        if option.env or option.positional
        else dataclasses.replace(option, env=prefix + option.dest.upper())
        for option in options
    )
