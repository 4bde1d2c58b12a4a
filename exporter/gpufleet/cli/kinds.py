"""The kinds of value a ``gpufleet`` flag takes: one parser each, from the flag's text.

Each raises ValueError naming the bad text and what would be accepted;
:meth:`gpufleet.cli.options.Option.resolve` adds where the value came from. Command
modules import this module and name a kind as ``kinds.listen``.
"""

from __future__ import annotations

import re
from collections.abc import Callable


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
