"""Inline recording rules into alert expressions, so that an alert can be evaluated
over data that has no recorded series (a history backfilled with promtool).

A recorded name becomes its defining expression in parentheses, recursively. A
record with static ``labels`` gains them through ``label_replace``; equality
matchers on a recorded name (``job:x:rate1h{op="save"}``) become a filter
``and on (op) label_replace(vector(1), "op", "save", "", "")``, or pick among
records of the same name whose static labels decide it (the XID catalogue).

A name that has been *materialized* (recorded once over the history and imported as
series of its own, ``gpufleet.detect.materialize``) is read, not inlined: an
instant reference reads only the sample of its own evaluation
(``last_over_time(name[interval - 1ms])``, as Prometheus's staleness marker makes a
recorded series vanish at the first evaluation that no longer returns it), and a
range reads the recorded samples themselves.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpufleet.exposition import escape_label_value

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_STRING = re.compile(r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`""")
# an equality matcher, or a regex one whose value is a plain name (a dashboard variable
# set to one value): both select that one value
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=~?\s*"((?:[^"\\]|\\.)*)"\s*,?')
_PLAIN = re.compile(r"[a-zA-Z0-9_:-]*")


class InlineError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class RecordRule:
    name: str
    expr: str
    labels: dict[str, str]


@dataclass(frozen=True, slots=True)
class AlertRule:
    name: str
    expr: str  # with every recorded name inlined
    for_seconds: float
    labels: dict[str, str]
    annotations: dict[str, str]


def duration_seconds(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)", text):
        total += float(number) * units[unit]
    return total


def _parse_matchers(text: str) -> dict[str, str]:
    matchers: dict[str, str] = {}
    position = 0
    while position < len(text):
        match = _MATCHER.match(text, position)
        regex = "=~" in match.group(0) if match else False
        if not match or (regex and not _PLAIN.fullmatch(match.group(2))):
            raise InlineError(f"only equality matchers can be inlined: {{{text}}}")
        matchers[match.group(1)] = match.group(2)
        position = match.end()
    return matchers


class Inliner:
    def __init__(
        self, records: list[RecordRule], materialized: Mapping[str, float] | None = None
    ) -> None:
        """``materialized``: recorded names stored as series, each with the interval (in
        seconds) its rule was evaluated at."""
        self._records: dict[str, list[RecordRule]] = {}
        for record in records:
            self._records.setdefault(record.name, []).append(record)
        self._materialized = dict(materialized or {})
        self._done: dict[tuple[str, str], str] = {}

    @classmethod
    def from_files(
        cls, paths: list[Path], materialized: Mapping[str, float] | None = None
    ) -> Inliner:
        return cls(read_records(paths), materialized)

    @property
    def records(self) -> dict[str, list[RecordRule]]:
        return self._records

    def references(self, expr: str) -> set[str]:
        """The recorded names ``expr`` reads, directly."""
        return {name for name in _NAME.findall(_STRING.sub('""', expr)) if name in self._records}

    def inline(self, expr: str) -> str:
        """``expr`` with every recorded name replaced by what defines it."""
        out: list[str] = []
        position = 0
        length = len(expr)
        while position < length:
            char = expr[position]
            if char in "\"'`":
                end = position + 1
                while end < length and expr[end] != char:
                    end += 2 if expr[end] == "\\" else 1
                out.append(expr[position : end + 1])
                position = end + 1
                continue
            match = _NAME.match(expr, position)
            if match and (
                position == 0 or not (expr[position - 1].isalnum() or expr[position - 1] == "_")
            ):
                name = match.group(0)
                end = match.end()
                if name in self._materialized:
                    text, position = self._read(name, expr, end)
                    out.append(text)
                    continue
                if name in self._records:
                    matchers = ""
                    if end < length and expr[end] == "{":
                        close = expr.index("}", end)
                        matchers, end = expr[end + 1 : close], close + 1
                    before = "".join(out).rstrip()
                    if before.endswith(("group_left", "group_right")):
                        out.append("() ")  # else "(" would read as group_left's label list
                    out.append(self._expand(name, matchers))
                    if end < length and expr[end] == "[":
                        # a range over a recorded series becomes a subquery over its definition
                        close = expr.index("]", end)
                        span = expr[end + 1 : close]
                        if ":" not in span:
                            out.append(f"[{span}:{subquery_step(span)}]")
                            end = close + 1
                else:
                    out.append(name)
                position = end
                continue
            out.append(char)
            position += 1
        return "".join(out)

    def _read(self, name: str, expr: str, end: int) -> tuple[str, int]:
        """A materialized name read as a series, and where its selector ends:
        ``name{...}[range]`` stays a range over the recorded samples; any other
        reference sees only the sample recorded at its own evaluation."""
        selector_end = self._read_end(expr, end)
        selector = expr[end - len(name) : selector_end]
        if not selector.endswith("]"):
            return self._instant(selector), selector_end
        bracket = selector.rindex("[")
        if ":" not in selector[bracket:]:
            return selector, selector_end
        # a subquery: read each of its points as an instant
        return self._instant(selector[:bracket]) + selector[bracket:], selector_end

    def _instant(self, selector: str) -> str:
        name = _NAME.match(selector)
        assert name is not None
        interval_ms = round(self._materialized[name.group(0)] * 1000)
        return f"last_over_time({selector}[{interval_ms - 1}ms])"

    @staticmethod
    def _read_end(expr: str, end: int) -> int:
        """Where the selector of the name ending at ``end`` ends (matchers, range)."""
        if end < len(expr) and expr[end] == "{":
            end = expr.index("}", end) + 1
        if end < len(expr) and expr[end] == "[":
            end = expr.index("]", end) + 1
        return end

    def _expand(self, name: str, matcher_text: str) -> str:
        key = (name, matcher_text)
        if key in self._done:
            return self._done[key]
        matchers = _parse_matchers(matcher_text) if matcher_text.strip() else {}
        branches = []
        for record in self._records[name]:
            static = record.labels
            if any(label in static and static[label] != value for label, value in matchers.items()):
                continue
            branch = f"({self.inline(record.expr)})"
            for label, value in static.items():
                branch = (
                    f'label_replace({branch}, "{label}", "{escape_label_value(value)}", "", "")'
                )
            for label, value in matchers.items():
                if label not in static:
                    branch = (
                        f"({branch} and on ({label}) "
                        f'label_replace(vector(1), "{label}", "{escape_label_value(value)}", "", ""))'
                    )
            branches.append(branch)
        if not branches:
            raise InlineError(f"no record {name} matches {{{matcher_text}}}")
        expanded = branches[0] if len(branches) == 1 else "(" + " or ".join(branches) + ")"
        self._done[key] = expanded
        return expanded


# Points a subquery that stands in for a range over a recorded series looks at: the
# recording rules behind such ranges (most GPUs seen within a day, targets seen within
# a day) are evaluated once a minute in Prometheus; over a backfilled history a coarser
# look is enough for them and keeps a range query over days affordable.
SUBQUERY_POINTS = 48


def subquery_step(span: str) -> str:
    """The resolution of the subquery standing in for ``record[span]``: at least 1m."""
    return f"{max(60, int(duration_seconds(span) // SUBQUERY_POINTS))}s"


def read_records(paths: list[Path]) -> list[RecordRule]:
    records = []
    for path in paths:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "record" in rule:
                    records.append(
                        RecordRule(rule["record"], rule["expr"], dict(rule.get("labels", {})))
                    )
    return records


def inlined_alerts(
    paths: list[Path], materialized: Mapping[str, float] | None = None
) -> list[AlertRule]:
    """Every alert of ``paths``, recorded names inlined except those ``materialized``."""
    inliner = Inliner.from_files(paths, materialized)
    alerts = []
    for path in paths:
        document: dict[str, Any] = yaml.safe_load(path.read_text())
        for group in document["groups"]:
            for rule in group["rules"]:
                if "alert" not in rule:
                    continue
                alerts.append(
                    AlertRule(
                        rule["alert"],
                        inliner.inline(rule["expr"]),
                        duration_seconds(str(rule.get("for", "0s"))),
                        dict(rule.get("labels", {})),
                        dict(rule.get("annotations", {})),
                    )
                )
    return alerts
