"""From a command's resolved options to what it runs with: settings dataclasses, tokens
read from their files, and the servers' one log format. Command modules import this module
and call ``resolve.settings(...)``; :mod:`gpufleet.cli.options` declares the flags."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from typing import Any, TypeVar

from gpufleet.cli.options import ConfigError
from gpufleet.secrets import SecretFileError, read_secret_file

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
T = TypeVar("T")


def configure_logging(level: str) -> None:
    """A server's log lines, in the one format every ``gpufleet`` server writes."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)


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
