"""Prometheus text exposition (format 0.0.4) rendered from plain families, and the
OpenMetrics stream the simulator's history is written as: one place escapes label
values and writes NaN and infinities.

The GPU families are rendered once per NVML snapshot and the bytes are served to
every scrape until the next snapshot, so this renderer is independent of
prometheus-client's registry. It also keeps dcgm-exporter's habit of exposing
counters under their bare DCGM names (no ``_total`` suffix), which
prometheus-client's counter families cannot do.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TextIO

MetricKind = Literal["gauge", "counter", "histogram", "summary", "untyped"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_labels(labels: Sequence[tuple[str, str]]) -> str:
    """Render ``k="v",...`` (without braces) for a label set."""
    return ",".join(f'{name}="{escape_label_value(value)}"' for name, value in labels)


def format_value(value: float) -> str:
    # int() first: most samples are whole counts, and only NaN and infinities refuse it
    # (the history writes millions of values through here).
    try:
        whole = int(value)
    except (ValueError, OverflowError):
        return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
    if whole == value and -1e15 < value < 1e15:
        return str(whole)
    return repr(float(value))


@dataclass(slots=True)
class Family:
    """One metric family: its samples carry pre-rendered label strings."""

    name: str
    kind: MetricKind
    help: str
    samples: list[tuple[str, float]] = field(default_factory=list)

    def add(self, labels: str, value: float) -> None:
        self.samples.append((labels, value))


def render(families: Iterable[Family]) -> bytes:
    """Render families with at least one sample; empty families are omitted."""
    lines: list[str] = []
    for family in families:
        if not family.samples:
            continue
        lines.append(f"# HELP {family.name} {escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        name = family.name
        for labels, value in family.samples:
            if labels:
                lines.append(f"{name}{{{labels}}} {format_value(value)}")
            else:
                lines.append(f"{name} {format_value(value)}")
    if not lines:
        return b""
    lines.append("")
    return "\n".join(lines).encode("utf-8")


class OpenMetricsWriter:
    """Streams OpenMetrics with a timestamp on every sample, as
    ``promtool tsdb create-blocks-from openmetrics`` reads it.

    A family is declared once, then its series follow; OpenMetrics wants a counter's
    family name without ``_total`` and its samples with it (``MetricDef.openmetrics``).
    """

    def __init__(self, handle: TextIO) -> None:
        self.handle = handle
        self.samples = 0

    def family(self, name: str, kind: str, help_text: str) -> None:
        # OpenMetrics escapes a HELP text as it does a label value (quotes too).
        self.handle.write(f"# HELP {name} {escape_label_value(help_text)}\n# TYPE {name} {kind}\n")

    def series(
        self,
        sample: str,
        labels: Sequence[tuple[str, str]],
        values: Sequence[float],
        stamps: Sequence[str],
    ) -> None:
        """One series: ``values[i]`` at Unix time ``stamps[i]`` (already formatted)."""
        prefix = f"{sample}{{{format_labels(labels)}}} " if labels else f"{sample} "
        self.handle.write(
            "".join(
                f"{prefix}{format_value(value)} {stamp}\n"
                for value, stamp in zip(values, stamps, strict=True)
            )
        )
        self.samples += len(values)

    def close(self) -> None:
        self.handle.write("# EOF\n")


_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


@dataclass(frozen=True, slots=True)
class PrecompressedPart:
    """A body prefix kept both raw and as a sync-flushed deflate stream.

    A scrape appends freshly rendered bytes to it. Because the prefix ends on a
    sync flush (a byte boundary, no final block), a second raw-deflate stream
    can follow it, and the pair is one valid gzip member: the scrape compresses
    only its own few kilobytes, never the cached GPU exposition.
    """

    raw: bytes
    deflated: bytes
    crc: int

    @classmethod
    def of(cls, raw: bytes, level: int = 6) -> PrecompressedPart:
        compressor = zlib.compressobj(level, zlib.DEFLATED, -15)
        deflated = compressor.compress(raw) + compressor.flush(zlib.Z_SYNC_FLUSH)
        return cls(raw=raw, deflated=deflated, crc=zlib.crc32(raw))

    def gzip_with(self, tail: bytes, level: int = 1) -> bytes:
        compressor = zlib.compressobj(level, zlib.DEFLATED, -15)
        deflated_tail = compressor.compress(tail) + compressor.flush(zlib.Z_FINISH)
        crc = zlib.crc32(tail, self.crc) & 0xFFFFFFFF
        size = (len(self.raw) + len(tail)) & 0xFFFFFFFF
        return b"".join((_GZIP_HEADER, self.deflated, deflated_tail, struct.pack("<II", crc, size)))


EMPTY_PART = PrecompressedPart.of(b"")
