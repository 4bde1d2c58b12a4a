"""How every ``gpufleet`` command declares its flags.

One :class:`Option` per flag: its parser, default, help and, for a long-running service,
the ``GPUFLEET_*`` environment variable that sets it when the flag is absent. argparse
only collects the raw text; :meth:`Option.resolve` parses it, so every bad value, from a
flag or from the environment, fails the same way: a :class:`ConfigError` naming where the
value came from and what is accepted.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from gpufleet.secrets import SecretFileError, read_secret_file

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
T = TypeVar("T")


class ConfigError(Exception):
    """A flag or environment value is unusable; the message names it and what is accepted."""


def env(name: str) -> str | None:
    """The variable's value; unset and empty are the same (compose and Helm write empties)."""
    value = os.environ.get(name)
    return value if value not in (None, "") else None


# Value parsers: each raises ValueError with the bad text and what would be accepted.


def listen(text: str) -> tuple[str, int]:
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT (for example 0.0.0.0:9405)")
    return host.strip("[]") or "0.0.0.0", int(port_text)  # noqa: S104 - a node agent serves the node


def positive_seconds(value: str) -> float:
    seconds = number(value, "a number of seconds")
    if not 0 < seconds <= 3600:
        raise ValueError(f"{value!r} must be between 0 and 3600 seconds")
    return seconds


def ttl_seconds(value: str) -> float:
    seconds = number(value, "a number of seconds")
    if not 60 <= seconds <= 7 * 86400:
        raise ValueError(f"{value!r} must be between 60 seconds and 7 days")
    return seconds


def number(text: str, what: str = "a number") -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not {what}") from None


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None


def text(value: str) -> str:
    return value


def positive_int(value: str) -> int:
    if not value.isdigit() or int(value) <= 0:
        raise ValueError(f"{value!r} is not a positive whole number")
    return int(value)


def boolean(value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{value!r} is not true or false")


def window(value: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    amount, unit = (value[:-1], value[-1]) if value[-1:] in units else (value, "s")
    try:
        seconds = float(amount) * units[unit]
    except ValueError:
        raise ValueError(f"{value!r} is not a duration such as 7d, 48h or 3600") from None
    if not 3600 <= seconds <= 365 * 86400:
        raise ValueError(f"{value!r} must be between 1 hour and 365 days")
    return seconds


def label_name(value: str) -> str:
    if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", value):
        raise ValueError(f"{value!r} is not a Prometheus label name")
    return value


def choice(*choices: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value not in choices:
            raise ValueError(f"{value!r} is not one of: {', '.join(choices)}")
        return value

    return parse


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
        choice("debug", "info", "warning", "error"),
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


def secret(values: argparse.Namespace, name: str) -> str | None:
    """A token from its flag / variable or from its file, never both; errors name the source."""
    flag = name.replace("_", "-")
    direct, path = getattr(values, name), getattr(values, f"{name}_file")
    if direct and path:
        raise ConfigError(f"set --{flag} or --{flag}-file, not both")
    if not path:
        return str(direct) if direct else None
    return read_secret(f"--{flag}-file", path)


def read_secret(flag: str, path: str) -> str:
    """The token in the file, or a ConfigError naming the flag that pointed at it."""
    try:
        return read_secret_file(path)
    except SecretFileError as error:
        raise ConfigError(f"{flag}: {error}") from None


def settings(cls: type[T], values: argparse.Namespace, **renamed: Any) -> T:
    """The dataclass ``cls`` filled from the resolved options named like its fields, plus
    ``renamed`` for those whose flag says it differently (``--job-ttl`` -> ``job_ttl_s``):
    a new setting is its field and one Option line, nothing in between."""
    names = {field.name for field in dataclasses.fields(cls)}  # type: ignore[arg-type]
    matching = {name: value for name, value in vars(values).items() if name in names}
    return cls(**{**matching, **renamed})


def variables(prefix: str, options: tuple[Option, ...]) -> tuple[Option, ...]:
    """A service's options, each settable from ``<prefix><FLAG>`` (``--max-jobs`` under
    ``GPUFLEET_`` is ``GPUFLEET_MAX_JOBS``) unless it names its own variable."""
    return tuple(
        option
        if option.env or option.positional
        else dataclasses.replace(option, env=prefix + option.dest.upper())
        for option in options
    )
