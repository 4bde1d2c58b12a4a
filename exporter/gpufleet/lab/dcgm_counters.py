"""gpufleet's recommended counters file for dcgm-exporter, written from the schema:
``python -m gpufleet.lab.dcgm_counters --out deploy/dcgm-exporter/gpufleet-counters.csv``
(``make generate``; ``make check-generated`` fails when the committed file differs).

Each line's field name and type come from the schema's family (:mod:`gpufleet.schema.gpu`,
:mod:`gpufleet.schema.external`), so the file cannot name a family or type the agent and
the rules do not. Its help text is what dcgm-exporter serves as ``# HELP``: dcgm-exporter's
own wording, from its stock counters file (``gpu/fixtures/``) for the fields there, else
the wording given below where gpufleet's schema help is longer (it carries gpufleet's notes).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from gpufleet.lab.dcgm_shape import LABEL_KIND, Counter, parse_counters
from gpufleet.schema import gpu as cat
from gpufleet.schema.external import XID_ERRORS_COUNT
from gpufleet.schema.family import MetricDef

HEADER = """\
# gpufleet's recommended counters file for dcgm-exporter (its CSV format:
# FIELD, type, help). It is dcgm-exporter's stock set plus the opt-in fields that
# gpufleet's alerts read (see docs/alerts.md, "On a dcgm-exporter fleet"). Install it as
# the counters ConfigMap of the dcgm-exporter chart or the GPU Operator.
#
# dcgm-exporter before 4.0 (DCGM 3.x): replace DCGM_FI_DEV_CLOCKS_EVENT_REASONS with
# its older name DCGM_FI_DEV_CLOCK_THROTTLE_REASONS; the rules read either.
"""


@dataclass(frozen=True, slots=True)
class Field:
    """One line: a schema family, with dcgm-exporter's help where the schema's differs."""

    family: MetricDef
    help: str | None = None


@dataclass(frozen=True, slots=True)
class Section:
    comment: str  # the lines above the fields, without "# "
    fields: tuple[Field | str, ...]  # a str: a comment line between fields


NVLINK5_NOTE = (
    "Hopper and later: data ECC errors; Blackwell (NVLink5) and later: the link recovery,\n"
    "symbol and effective error counters, each the total over all links"
)
SECTIONS = (
    Section("Clocks, temperature, power", (
        Field(cat.SM_CLOCK), Field(cat.MEM_CLOCK), Field(cat.MEMORY_TEMP), Field(cat.GPU_TEMP),
        Field(cat.POWER_USAGE), Field(cat.TOTAL_ENERGY),
    )),
    Section("PCIe: GpuFleetPcieReplays", (Field(cat.PCIE_REPLAY),)),
    Section("Utilisation", (
        Field(cat.GPU_UTIL), Field(cat.MEM_COPY_UTIL), Field(cat.ENC_UTIL), Field(cat.DEC_UTIL),
    )),
    Section("XIDs: GpuFleetCriticalXid / MaintenanceXid / ApplicationXid", (
        Field(cat.XID_LAST),
        "opt-in: XIDs per code in the last window; catches the same code twice in a row. A gauge:\n"
        "dcgm-exporter serves the type this file gives, and the count falls as XIDs leave the "
        "window.",
        Field(XID_ERRORS_COUNT, "Count of XID errors within the user-specified time window."),
    )),
    Section(
        "Clock events (throttling), opt-in: GpuFleetHwSlowdown "
        "(HW slowdown, HW thermal, power brake)",
        (Field(cat.CLOCKS_EVENT_REASONS, "Current clock event (throttle) reasons (bitmask)."),),
    ),
    Section("Memory", (Field(cat.FB_FREE), Field(cat.FB_USED), Field(cat.FB_RESERVED))),
    Section(
        "ECC, opt-in: GpuFleetEccUncorrectable on every GPU (without it only GPUs with row\n"
        "remapping, A100 and later, page it), the node-health SBE signal",
        (Field(cat.ECC_SBE_VOL), Field(cat.ECC_DBE_VOL)),
    ),
    Section(
        "Row remapping: GpuFleetEccUncorrectable, GpuFleetCorrectableRemapsClimbing,\n"
        "GpuFleetRowRemapFailure; GpuFleetRowRemapPending (opt-in field)",
        (
            Field(cat.UNCORRECTABLE_REMAPPED_ROWS), Field(cat.CORRECTABLE_REMAPPED_ROWS),
            Field(cat.ROW_REMAP_FAILURE),
            Field(cat.ROW_REMAP_PENDING, "Whether remapping of rows is pending"),
        ),
    ),
    Section(
        "NVLink errors, opt-in: GpuFleetNvlinkErrors, the node-health NVLink signal\n"
        "Before Blackwell (NVLink 4 and older):",
        (
            Field(cat.NVLINK_CRC_FLIT), Field(cat.NVLINK_CRC_DATA), Field(cat.NVLINK_REPLAY),
            Field(cat.NVLINK_RECOVERY),
            NVLINK5_NOTE,
            Field(cat.NVLINK_ECC_ERRORS),
            Field(cat.NVLINK_RECOVERY_SUCCESSFUL,
                  "Number of link recoveries that brought the link back up, all links."),
            Field(cat.NVLINK_RECOVERY_FAILED,
                  "Number of link recoveries that failed and left the link down, all links."),
            Field(cat.NVLINK_RECOVERY_EVENTS,
                  "Number of link recoveries whatever the result, all links."),
            Field(cat.NVLINK_SYMBOL_ERRORS, "Number of errors in received symbols, all links."),
            Field(cat.NVLINK_EFFECTIVE_ERRORS,
                  "Sum of the number of errors in each NVLink packet, all links."),
            "A rate, not a counter (DCGM computes it from the data counters between two samples):\n"
            "dcgm-exporter's stock file says counter; gpufleet's agent and this file say gauge.",
            Field(cat.NVLINK_BANDWIDTH, "NVLink data throughput over all links (in MB/s)."),
        ),
    ),
    Section("vGPU", (Field(cat.VGPU_LICENSE_STATUS),)),
    Section("Profiling (DCP), Volta and newer", (
        Field(cat.GR_ENGINE_ACTIVE),
        Field(cat.SM_ACTIVE, "The ratio of cycles an SM has at least 1 warp assigned."),
        Field(cat.SM_OCCUPANCY, "The ratio of number of warps resident on an SM."),
        Field(cat.PIPE_TENSOR_ACTIVE), Field(cat.DRAM_ACTIVE), Field(cat.PCIE_TX),
        Field(cat.PCIE_RX),
    )),
)  # fmt: skip
# The static facts dcgm-exporter puts as labels on every series, after the vGPU section.
LABELS_SECTION = "Static facts, as labels on every series"
LABELS_AFTER = "vGPU"


def stock_counters() -> dict[str, Counter]:
    """dcgm-exporter's stock counters file (its etc/default-counters.csv), by field."""
    path = resources.files("gpufleet.gpu").joinpath("fixtures/dcgm-exporter-default-counters.csv")
    return {counter.name: counter for counter in parse_counters(path.read_text("utf-8"))}


def _comment(text: str) -> list[str]:
    return [f"# {line}" for line in text.splitlines()]


def _line(field: Field, stock: dict[str, Counter]) -> str:
    family = field.family
    stocked = stock.get(family.name)
    if field.help is not None:
        help_text = field.help
    elif stocked is not None and stocked.kind == family.kind:
        help_text = stocked.help
    else:
        help_text = family.help
    return f"{family.name}, {family.kind}, {help_text}"


def render() -> str:
    stock = stock_counters()
    lines = HEADER.splitlines()
    for section in SECTIONS:
        lines += ["", *_comment(section.comment)]
        for item in section.fields:
            lines += _comment(item) if isinstance(item, str) else [_line(item, stock)]
        if section.comment == LABELS_AFTER:
            label = stock[cat.DRIVER_LABEL]
            assert label.kind == LABEL_KIND
            lines += ["", *_comment(LABELS_SECTION), f"{label.name}, {label.kind}, {label.help}"]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpufleet.lab.dcgm_counters", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", required=True, type=Path, help="the counters file to write")
    out = parser.parse_args(argv).out
    text = render()
    if not out.exists() or out.read_text("utf-8") != text:
        out.write_text(text, "utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
